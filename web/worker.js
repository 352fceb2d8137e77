// Dedicated worker: boots Pyodide from this site (never a CDN), loads numpy, installs the
// wheels listed in assets.json with micropip, then hands over to the Python app.
"use strict";

const base = new URL("./", self.location.href).href;

function progress(stage, detail) {
  const stages = ["download", "python", "numpy", "engine", "gpu"];
  self.postMessage({ type: "progress", stage, index: stages.indexOf(stage), total: stages.length, detail });
}

async function boot() {
  progress("download", "downloading the Python runtime (Pyodide)");
  const assets = await (await fetch(base + "assets.json")).json();
  importScripts(base + "pyodide/pyodide.js");
  progress("python", `starting Python (Pyodide ${assets.pyodide_version})`);
  const pyodide = await loadPyodide({ indexURL: base + "pyodide/" });
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

boot().catch((err) => {
  // A Python exception's message is its whole traceback: show its last line, keep the rest as detail.
  const text = String(err.message || err);
  const lines = text.trim().split("\n");
  self.postMessage({ type: "error", kind: "boot", message: `Boot failed: ${lines[lines.length - 1]}`, detail: text });
});
