// The tab's numpy path, projections by matmul, einsum (backends/cpu_linear.py) or the wasm SIMD kernel on
// quantized weights (backends/cpu_wasm.py), in one Pyodide under Node.
//
//   node bench/page/pyodide_cpu_linear.mjs [PROMPT_TOKENS=128] [DECODE_STEPS=16] [LINEARS=einsum,wasm]
//
// A linear named with "+attention" (wasm+attention) also runs one-token attention through the kernel's
// attn_scores / attn_values (backends/cpu_attention.py), as the page does.
//
// Loads dist/models/smollm2-135m-instruct and dist/wasm/linear.wasm (run `python3 build.py` first) and py/
// through NODEFS. Prints, best of 3, each SmolLM2 projection shape at 1 and PROMPT_TOKENS tokens through
// einsum and the kernel (ms); then for each of LINEARS a prefill of random ids and greedy decode steps
// (tok/s, the first greedy ids) and the wasm heap at the end (run one linear alone for its own heap).
import { readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const root = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");
const dir = join(root, "dist", "pyodide");
const [prompt = "128", steps = "16", linears = "einsum,wasm"] = process.argv.slice(2);
const { loadPyodide } = await import(join(root, "node_modules/pyodide/pyodide.mjs"));
const py = await loadPyodide({ indexURL: resolve(join(root, "node_modules/pyodide")) + "/" });
await py.loadPackage(join(dir, "numpy-2.0.2-cp312-cp312-pyodide_2024_0_wasm32.whl"));
// As web/linear_wasm.js does in the worker: the kernel on Pyodide's own memory.
const memory = py._module.LDSO.loadedLibsByName.__main__.exports.memory;
const { instance } = await WebAssembly.instantiate(readFileSync(join(root, "dist", "wasm", "linear.wasm")),
  { env: { memory } });
py.globals.set("wasm_matmul", instance.exports.matmul);
py.globals.set("wasm_kernels", instance.exports);
py.FS.mkdirTree("/src"); py.FS.mkdirTree("/models");
py.FS.mount(py.FS.filesystems.NODEFS, { root: join(root, "py") }, "/src");
py.FS.mount(py.FS.filesystems.NODEFS, { root: join(root, "dist", "models", "smollm2-135m-instruct") }, "/models");
console.log(await py.runPythonAsync(`
import sys, time, json
sys.path.insert(0, "/src")
import numpy as np
from pagedkv.backends.cpu import CpuBackend
from pagedkv.backends.cpu_wasm import HeapStore, QuantWeight, tensor_loader
from pagedkv.model.layout import dequantize, pack_q4_1, quantize_q4_1
from pagedkv.model.weights import ModelWeights
from pagedkv.model_runner import ForwardBatch
P, N, LINEARS = ${prompt}, ${steps}, "${linears}".split(",")
rng = np.random.default_rng(0)
res = {"shapes_ms": {}}

def best(f, n=3):
    times = []
    for _ in range(n):
        t0 = time.perf_counter(); f(); times.append(time.perf_counter() - t0)
    return round(min(times) * 1e3, 3)

for rows, cols in ((576, 576), (192, 576), (1536, 576), (576, 1536)):
    parts = pack_q4_1(*quantize_q4_1(rng.standard_normal((rows, cols)).astype(np.float32)))
    w, qw = dequantize("q4_1", (rows, cols), parts), QuantWeight.from_parts("q4_1", (rows, cols), parts, HeapStore(wasm_matmul))
    for t in (1, P):
        x = rng.standard_normal((t, cols)).astype(np.float32)
        x @ qw.T  # V8 compiles the kernel's hot code on first use
        res["shapes_ms"][f"q4_1 {rows}x{cols} T={t}"] = {
            "einsum": best(lambda: np.einsum("oi,ti->to", w, x) if t == 1 else np.einsum("ti,oi->to", x, w)),
            "wasm": best(lambda: x @ qw.T)}
    del w, qw
prompt = rng.integers(10, 40000, P).astype(np.int32)
i32 = lambda v: np.asarray(v, dtype=np.int32)
for linear in LINEARS:
    kind, _, attention = linear.partition("+")
    W = ModelWeights.load("/models", tensor_loader(HeapStore(wasm_matmul)) if kind == "wasm" else None)
    b = CpuBackend(W, -(-(P + N) // 16), 16, linear=kind, attention=wasm_kernels if attention else None)
    del W
    table = i32([range(-(-(P + N) // 16))])
    t0 = time.perf_counter()
    lg = b.model.forward(ForwardBatch(prompt, i32(range(P)), i32(range(P)), i32([0, P]), table, i32([P])), b.kv)
    t1 = time.perf_counter()
    tok = int(lg[0].argmax()); ids = [tok]
    for pos in range(P, P + N):
        lg = b.model.forward(ForwardBatch(i32([tok]), i32([pos]), i32([pos]), i32([0, 1]), table, i32([pos + 1])), b.kv)
        tok = int(lg[0].argmax()); ids.append(tok)
    t2 = time.perf_counter()
    res[linear] = {"prefill_tok_s": round(P / (t1 - t0), 2), "decode_tok_s": round(N / (t2 - t1), 2), "ids": ids[:8]}
    del b
import pyodide_js
res["wasm_heap_mib"] = pyodide_js._module.HEAP8.length / 2**20
json.dumps(res)
`));
