// Dedicated worker: boots Pyodide from this site (never a CDN), loads numpy, installs the
// wheels listed in assets.json with micropip, then hands over to the Python app.
"use strict";

const base = new URL("./", self.location.href).href;

// A boot stage by its name; the page holds their order (build.py's BOOT_STAGES).
function progress(stage, detail) {
  self.postMessage({ type: "progress", stage, detail });
}

async function boot() {
  progress("download", "downloading the Python runtime (Pyodide)");
  const assets = await (await fetch(base + "assets.json")).json();
  importScripts(base + "pyodide/pyodide.js", base + "replayer.js", base + "linear_wasm.js", base + "linear_tape.js",
    base + "linear_threads.js");
  progress("python", `starting Python (Pyodide ${assets.pyodide_version})`);
  const pyodide = await loadPyodide({ indexURL: base + "pyodide/" });
  const wasm = assets.wasm || {};
  self.pagedkvLinear = await loadLinearWasm(base, wasm.linear, pyodide, wasm.linear_shared,
    { entry: wasm.linear_relaxed, shared: wasm.linear_relaxed_shared });
  progress("numpy", "loading numpy and micropip");
  await pyodide.loadPackage(["numpy", "micropip"], { checkIntegrity: true });
  progress("engine", "installing the pagedkv engine");
  const wheels = Object.values(assets.wheels).map((w) => base + w.file);
  pyodide.globals.set("_wheel_urls", pyodide.toPy(wheels));
  await pyodide.runPythonAsync(`
import micropip
await micropip.install(list(_wheel_urls), deps=False)
del _wheel_urls
`);
  self.pyodide = pyodide;
  await pyodide.runPythonAsync("from pagedkv_app.main import boot\nawait boot()");
}

// A storage call for Python to await (py/pagedkv/browser/opfs.py _settle): `target[method](...args)` made here,
// its promise settled as {ok, value} or {ok: false, name, message}, never rejected, and never handed to Python.
// Chromium rejects a call past the quota with a QuotaExceededError that has no `stack`; a promise Python holds
// becomes a Pyodide future, which cannot take that rejection ("TypeError: invalid exception object", an uncaught
// error in the page). A call that throws at once is settled the same way.
self.pagedkvSettleCall = (target, method, ...args) => {
  let promise;
  try {
    promise = Promise.resolve(target[method](...args));
  } catch (err) {
    promise = Promise.reject(err);
  }
  return promise.then((value) => ({ ok: true, value }),
    (err) => ({ ok: false, name: String(err?.name ?? "Error"), message: String(err?.message ?? err) }));
};

// The model list's messages (web/models.js), answered while Python is still starting.
const MODEL_MESSAGES = new Set(["open-gguf", "remove-model", "list-models"]);

// Every page message but `exec` goes to the Python app's one router (pagedkv_app.main.route; the protocol is
// in docs/architecture.md); until Python has registered it, this worker answers for it.
// Tools and tests run Python inside this worker: {type: "exec", id, code} -> {type: "exec-result", id, ...}.
// The code's last expression is returned as JSON text (json.dumps in Python), so results stay exact.
self.addEventListener("message", async (event) => {
  const msg = event.data;
  if (msg && msg.type !== "exec") {
    if (self.pagedkvRoute) self.pagedkvRoute(msg);
    else if (MODEL_MESSAGES.has(msg.type)) {
      self.postMessage({ type: "gguf-error", action: msg.type, message: "Python is still starting" });
    } else self.postMessage({ type: "chat-error", chat: msg.chat, message: "the model is still loading" });
    return;
  }
  if (!msg) return;
  try {
    if (!self.pyodide) throw new Error("Python is not ready yet");
    const value = await self.pyodide.runPythonAsync(msg.code);
    const json = typeof value === "string" ? value : JSON.stringify(value === undefined ? null : value);
    if (value && typeof value.destroy === "function") value.destroy();
    self.postMessage({ type: "exec-result", id: msg.id, ok: true, json });
  } catch (err) {
    self.postMessage({ type: "exec-result", id: msg.id, ok: false, error: String(err.message || err) });
  }
});

boot().catch((err) => {
  // A Python exception's message is its whole traceback: show its last line, keep the rest as detail.
  const text = String(err.message || err);
  const lines = text.trim().split("\n");
  self.postMessage({ type: "error", kind: "boot", message: `Boot failed: ${lines[lines.length - 1]}`, detail: text });
});
