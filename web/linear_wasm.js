// The CPU path's projection kernel (wasm/linear.wasm, assembled from web/wasm/linear.wat by build.py),
// instantiated on Pyodide's own WebAssembly.Memory so that numpy arrays' addresses are its pointers (no
// copies; py/pagedkv/backends/cpu_wasm.py, cpu_attention.py). Resolves to {matmul, attention, error, startThreads,
// relaxedSimd}: either the error is null, or it says why and the others are. attention: the exports
// (attn_scores, attn_values, ...) and run_tape, the one-token step's walker (linear_tape.js); startThreads: the
// same kernel on every core (linear_threads.js).
// Python reads it as self.pagedkvLinear (pagedkv/browser/interop.py) and keeps the einsum path, saying why,
// on an error.
"use strict";

// The bytes of wasm/<entry.file>, checked against assets.json's sha256.
async function fetchVerifiedWasm(base, entry) {
  if (!entry) throw new Error("assets.json lists no wasm kernel (rebuild: python3 build.py)");
  const resp = await fetch(base + "wasm/" + entry.file);
  if (!resp.ok) throw new Error(`fetching wasm/${entry.file} failed: HTTP ${resp.status}`);
  const bytes = new Uint8Array(await resp.arrayBuffer());
  if (!self.crypto || !self.crypto.subtle) {
    throw new Error("no crypto.subtle to check the kernel's sha256: this page is not a secure context (https or localhost)");
  }
  const digest = Array.from(new Uint8Array(await crypto.subtle.digest("SHA-256", bytes)),
    (b) => b.toString(16).padStart(2, "0")).join("");
  if (digest !== entry.sha256) {
    throw new Error(`wasm/${entry.file} has sha256 ${digest}, assets.json says ${entry.sha256}`);
  }
  return bytes;
}

// sharedEntry: assets.json's linear_shared (the same kernel on a shared memory): startThreads(count) resolves to
// linear_threads.js's {api, error}, started once per count (the app asks for one count; tests for others).
// relaxed: {entry, shared}, assets.json's linear_relaxed / linear_relaxed_shared (the same text with its
// relaxed-SIMD functions: 8-bit activations), loaded instead of entry / sharedEntry where this browser validates
// them; relaxedSimd says which.
async function loadLinearWasm(base, entry, pyodide, sharedEntry, relaxed) {
  try {
    let bytes = null, relaxedSimd = false;
    if (relaxed && relaxed.entry) {
      const candidate = await fetchVerifiedWasm(base, relaxed.entry);
      if (WebAssembly.validate(candidate)) {
        [bytes, relaxedSimd, sharedEntry] = [candidate, true, relaxed.shared];
      }
    }
    if (!bytes) {
      bytes = await fetchVerifiedWasm(base, entry);
      // The bytes are the built ones (hash above), so a module that does not validate means no SIMD128.
      if (!WebAssembly.validate(bytes)) throw new Error("this browser's WebAssembly has no SIMD (SIMD128)");
    }
    // Pyodide 0.27 imports its memory; the dynamic linker keeps the import object of the main module.
    const memory = pyodide._module.LDSO.loadedLibsByName.__main__.exports.memory;
    if (!(memory instanceof WebAssembly.Memory)) throw new Error("Pyodide's WebAssembly.Memory was not found");
    const { instance } = await WebAssembly.instantiate(bytes, { env: { memory } });
    const started = new Map();  // count -> the promise of its threads
    const startThreads = (count) => {
      if (!started.has(count)) {
        started.set(count, (async () => {
          try {
            const module = await WebAssembly.compile(await fetchVerifiedWasm(base, sharedEntry));
            return await startLinearThreads(base, module, memory, count);
          } catch (err) {
            return { api: null, error: String(err.message || err) };
          }
        })());
      }
      return started.get(count);
    };
    // attention: the exports and run_tape, the one-token step's tape walker (linear_tape.js)
    const attention = Object.assign({}, instance.exports, { run_tape: makeTapeRunner(instance.exports, memory) });
    return { matmul: instance.exports.matmul, attention, error: null, startThreads, relaxedSimd };
  } catch (err) {
    return { matmul: null, attention: null, error: String(err.message || err), startThreads: null, relaxedSimd: false };
  }
}
