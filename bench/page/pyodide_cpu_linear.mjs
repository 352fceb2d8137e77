// The tab's numpy path, matmul vs einsum projections (backends/cpu_linear.py), in one Pyodide under Node.
//
//   node bench/page/pyodide_cpu_linear.mjs [PROMPT_TOKENS=128] [DECODE_STEPS=16]
//
// Loads dist/models/smollm2-135m-instruct (run `python3 build.py` first) and py/ through NODEFS, runs a
// prefill of random ids then greedy decode steps with CpuBackend(linear="matmul") and then "einsum",
// and prints prefill / decode tok/s, the first greedy ids of each and the wasm heap after both.
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const root = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");
const dir = join(root, "dist", "pyodide");
const [prompt = "128", steps = "16"] = process.argv.slice(2);
const { loadPyodide } = await import(join(root, "node_modules/pyodide/pyodide.mjs"));
const py = await loadPyodide({ indexURL: resolve(join(root, "node_modules/pyodide")) + "/" });
await py.loadPackage(join(dir, "numpy-2.0.2-cp312-cp312-pyodide_2024_0_wasm32.whl"));
py.FS.mkdirTree("/src"); py.FS.mkdirTree("/models");
py.FS.mount(py.FS.filesystems.NODEFS, { root: join(root, "py") }, "/src");
py.FS.mount(py.FS.filesystems.NODEFS, { root: join(root, "dist", "models", "smollm2-135m-instruct") }, "/models");
console.log(await py.runPythonAsync(`
import sys, time, json
sys.path.insert(0, "/src")
import numpy as np
from pagedkv.backends.cpu import CpuBackend
from pagedkv.model.weights import ModelWeights
from pagedkv.model_runner import ForwardBatch
W = ModelWeights.load("/models")
P, N = ${prompt}, ${steps}
rng = np.random.default_rng(0)
prompt = rng.integers(10, 40000, P).astype(np.int32)
i32 = lambda v: np.asarray(v, dtype=np.int32)
res = {}
for linear in ("matmul", "einsum"):
    b = CpuBackend(W, -(-(P + N) // 16), 16, linear=linear)
    table = i32([range(-(-(P + N) // 16))])
    t0 = time.perf_counter()
    lg = b.model.forward(ForwardBatch(prompt, i32(range(P)), i32(range(P)), i32([0, P]), table, i32([P])), b.kv)
    t1 = time.perf_counter()
    tok = int(lg[0].argmax()); ids = [tok]
    for pos in range(P, P + N):
        lg = b.model.forward(ForwardBatch(i32([tok]), i32([pos]), i32([pos]), i32([0, 1]), table, i32([pos + 1])), b.kv)
        tok = int(lg[0].argmax()); ids.append(tok)
    t2 = time.perf_counter()
    r = res.setdefault(linear, {"prefill_tok_s": 0, "decode_tok_s": 0})
    r["prefill_tok_s"] = max(r["prefill_tok_s"], round(P / (t1 - t0), 2))
    r["decode_tok_s"] = max(r["decode_tok_s"], round(N / (t2 - t1), 2))
    r["ids"] = ids[:8]
import pyodide_js
res["wasm_heap_mib"] = pyodide_js._module.HEAP8.length / 2**20
json.dumps(res)
`));
