// The boot screen: the stage list while the worker starts, then the GPU facts (or why there is no GPU).
import { STAGES } from "./boot_stages.js";
import { $, root } from "./page.js";

const t0 = performance.now();

export function showStage(stage, detail) {
  const index = STAGES.indexOf(stage);
  if (index < 0) throw new Error(`unknown boot stage ${stage}`);
  STAGES.forEach((name, i) => {
    const li = $(`stage-${name}`);
    li.classList.toggle("done", i < index);
    li.classList.toggle("active", i === index);
  });
  $("boot-progress").value = index;
  $("boot-detail").textContent = detail;
  root.dataset.stage = stage;
}

export function showError(message, detail) {
  root.dataset.state = "error";
  root.dataset.error = message;
  root.dataset.model = "error";  // no model will load on this page
  $("boot").hidden = true;
  $("error").hidden = false;
  $("error-message").textContent = message;
  $("error-detail").textContent = detail || "";
}

export function showNoWebGPU(message) {
  // Not fatal: the chat runs on the CPU fallback. The page says why and what to do.
  $("boot").hidden = true;
  $("gpu-notice").hidden = false;
  $("gpu-notice-message").textContent = message;
  root.dataset.webgpu = "unavailable";
  root.dataset.state = "ready";
}

export function showReady(msg) {
  const bootMs = Math.round(performance.now() - t0);
  $("boot").hidden = true;
  $("device").hidden = false;
  $("adapter-name").textContent = msg.adapter.name;
  $("limit-max-buffer").textContent = msg.adapter.limits.maxBufferSize.toLocaleString() + " bytes";
  $("limit-max-binding").textContent = msg.adapter.limits.maxStorageBufferBindingSize.toLocaleString() + " bytes";
  $("adapter-features").textContent = msg.adapter.features.join(", ") || "(none)";
  $("adapter-kernels").textContent = `${msg.adapter.kernels} (${msg.adapter.kernels_reason})`;
  $("adapter-backend").textContent = `${msg.adapter.backend} (${msg.adapter.backend_reason})`;
  $("selftest").textContent = `${msg.selftest.kernel} on ${msg.selftest.n.toLocaleString()} floats: ` +
    `max |GPU − numpy| = ${msg.selftest.max_abs_err}`;
  $("boot-time").textContent = `${(bootMs / 1000).toFixed(1)} s`;
  root.dataset.bootMs = String(bootMs);
  root.dataset.adapter = JSON.stringify(msg.adapter);
  root.dataset.selftest = JSON.stringify(msg.selftest);
  root.dataset.state = "ready";
}

export function onDeviceLost(msg) {
  root.dataset.device = "lost";
  if (msg.recovering) {
    $("chat-status").textContent = `The GPU device was lost (${msg.reason}): rebuilding the engine; ` +
      "every chat goes on from its token history.";
  } else {
    showError(`The GPU device was lost (${msg.reason}). Reload the page to restart.`);
  }
}
