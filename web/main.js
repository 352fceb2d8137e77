// UI thread: starts the worker (where Pyodide and all compute live) and renders what it posts.
"use strict";

const root = document.documentElement;
const $ = (id) => document.getElementById(id);
const STAGES = ["download", "python", "numpy", "engine", "gpu"];
const t0 = performance.now();

function showStage(stage, detail) {
  const index = STAGES.indexOf(stage);
  document.querySelectorAll("#stages li").forEach((li) => {
    const i = STAGES.indexOf(li.dataset.stage);
    li.classList.toggle("done", i < index);
    li.classList.toggle("active", i === index);
  });
  $("boot-progress").value = index;
  $("boot-detail").textContent = detail;
  root.dataset.stage = stage;
}

function showError(message, detail) {
  root.dataset.state = "error";
  root.dataset.error = message;
  $("boot").hidden = true;
  $("error").hidden = false;
  $("error-message").textContent = message;
  $("error-detail").textContent = detail || "";
}

function showReady(msg) {
  const bootMs = Math.round(performance.now() - t0);
  $("boot").hidden = true;
  $("device").hidden = false;
  $("adapter-name").textContent = msg.adapter.name;
  $("limit-max-buffer").textContent = msg.adapter.limits.maxBufferSize.toLocaleString() + " bytes";
  $("limit-max-binding").textContent = msg.adapter.limits.maxStorageBufferBindingSize.toLocaleString() + " bytes";
  $("adapter-features").textContent = msg.adapter.features.join(", ") || "(none)";
  $("selftest").textContent = `${msg.selftest.kernel} on ${msg.selftest.n.toLocaleString()} floats: ` +
    `max |GPU − numpy| = ${msg.selftest.max_abs_err}`;
  $("boot-time").textContent = `${(bootMs / 1000).toFixed(1)} s`;
  root.dataset.bootMs = String(bootMs);
  root.dataset.adapter = JSON.stringify(msg.adapter);
  root.dataset.selftest = JSON.stringify(msg.selftest);
  root.dataset.state = "ready";
}

function start() {
  if (!window.crossOriginIsolated) {
    console.warn("page is not cross-origin isolated; serve it with `python3 build.py serve`");
  }
  let worker;
  try {
    worker = new Worker("worker.js");
  } catch (err) {
    showError(`Could not start the worker: ${err.message}`);
    return;
  }
  const pending = new Map();
  let nextId = 1;
  // window.pagedkv.exec(code): run Python in the worker; resolves to the JSON text of its last expression.
  window.pagedkv = {
    exec(code) {
      const id = nextId++;
      return new Promise((resolve, reject) => {
        pending.set(id, { resolve, reject });
        worker.postMessage({ type: "exec", id, code });
      });
    },
  };
  worker.onmessage = (event) => {
    const msg = event.data;
    if (msg.type === "exec-result") {
      const p = pending.get(msg.id);
      pending.delete(msg.id);
      if (msg.ok) p.resolve(msg.json); else p.reject(new Error(msg.error));
    } else if (msg.type === "progress") showStage(msg.stage, msg.detail);
    else if (msg.type === "ready") showReady(msg);
    else if (msg.type === "error") showError(msg.message, msg.detail);
    else if (msg.type === "device-lost") showError(`The GPU device was lost (${msg.reason}). Reload the page to restart.`);
  };
  worker.onerror = (event) => {
    event.preventDefault();
    showError(`The engine worker failed: ${event.message || "unknown error"}`);
  };
}

start();
