// node bench/page/cpu_limits_head_rate.mjs LINEAR_SHARED.wasm CPU_LIMITS_SHARED.wasm ROWS COLS REPS: a q8_0 output
// head's one-token product in V8 (the engine the tab's kernels run on) against a plain read of the same bytes, on
// 1 and 2 threads at once, the rows cut into chunks that the threads claim from a shared counter as
// web/linear_threads.js's runChunks does, x quantized once (quant_x, kind | 4). Two layouts of the same codes:
// (d, 0) f32 pairs a block apart from the codes (kind 3) and d alone, each row's d (padded to 16 bytes) then
// its codes (kind 67, cpu_wasm.d_rows); each against `stream` (bench/page/cpu_limits.wat) over its own bytes.
// Best and median of REPS, every case in turn within a rep (the machine's load moves them alike). Prints JSON;
// bench/cpu_limits_head_rate.py runs it.
import { Worker, isMainThread, parentPort, workerData } from "node:worker_threads";
import { readFileSync } from "node:fs";

const CHUNKS_PER_THREAD = 8;  // web/linear_threads.js's

function layout(rows, cols) {
  const nb = cols >> 5, pad = (nb * 4 + 15) & ~15, row = pad + cols;  // kind 67: a row's d, padding, codes
  const QS = 1 << 16, DM = QS + rows * cols, DH = DM + rows * nb * 8, X = DH + rows * row;
  const S = X + cols * 4, OUT = S + nb * 72 + 64, COUNTER = 0;
  return { nb, pad, row, QS, DM, DH, X, S, OUT, COUNTER, top: OUT + rows * 4 };
}

// Claims chunks until none is left: the product's rows (kind 3 or 67) or a sweep of their codes and scales.
function take(kernels, sweep, counter, job) {
  const { what, kind, rows, cols, chunk } = job, L = layout(rows, cols);
  const alone = (kind & 64) !== 0;
  for (let r0 = Atomics.add(counter, 0, 1) * chunk; r0 < rows; r0 = Atomics.add(counter, 0, 1) * chunk) {
    const n = Math.min(chunk, rows - r0);
    if (what === "head" && alone) {
      kernels.matmul(kind | 4, L.DH + r0 * L.row + L.pad, L.DH + r0 * L.row, n, cols, L.X, 1, L.OUT + 4 * r0, rows,
        L.S);
    } else if (what === "head") {
      kernels.matmul(kind | 4, L.QS + r0 * cols, L.DM + r0 * L.nb * 8, n, cols, L.X, 1, L.OUT + 4 * r0, rows, L.S);
    } else if (alone) sweep.stream(L.DH + r0 * L.row, Math.floor(n * L.row / 64) * 64);
    else {
      sweep.stream(L.QS + r0 * cols, n * cols);
      sweep.stream(L.DM + r0 * L.nb * 8, Math.floor(n * L.nb * 8 / 64) * 64);
    }
  }
}

if (isMainThread) {
  const [linearPath, sweepPath] = process.argv.slice(2, 4);
  const [rows, cols, reps] = process.argv.slice(4).map(Number);
  const [linear, sweepModule] = await Promise.all(
    [linearPath, sweepPath].map((p) => WebAssembly.compile(readFileSync(p))));
  const L = layout(rows, cols);
  const memory = new WebAssembly.Memory({ initial: Math.ceil(L.top / 65536) + 1, maximum: 65536, shared: true });
  const env = { env: { memory } };
  const kernels = (await WebAssembly.instantiate(linear, env)).exports;
  const sweep = (await WebAssembly.instantiate(sweepModule, env)).exports;
  const i8 = new Int8Array(memory.buffer), f32 = new Float32Array(memory.buffer);
  let seed = 1;
  const rnd = () => (seed = (seed * 1103515245 + 12345) >>> 0) / 4294967296;
  for (let i = 0; i < rows * cols; i++) i8[L.QS + i] = Math.floor(rnd() * 255) - 127;
  for (let i = 0; i < rows * L.nb; i++) {  // the same d in both layouts
    const d = rnd() * 0.01, r = Math.floor(i / L.nb);
    f32[((L.DH + r * L.row) >> 2) + i % L.nb] = f32[(L.DM >> 2) + 2 * i] = d;
    f32[(L.DM >> 2) + 2 * i + 1] = 0;
  }
  for (let r = 0; r < rows; r++) i8.copyWithin(L.DH + r * L.row + L.pad, L.QS + r * cols, L.QS + (r + 1) * cols);
  for (let i = 0; i < cols; i++) f32[(L.X >> 2) + i] = rnd() - 0.5;
  kernels.quant_x(L.X, L.nb, 1, L.S);
  const counter = new Int32Array(memory.buffer, L.COUNTER, 1);
  const helper = await new Promise((ok) => {
    const w = new Worker(new URL(import.meta.url), { workerData: { linear, sweepModule, memory } });
    w.once("message", () => ok(w));
  });
  const run = async (threads, job) => {
    Atomics.store(counter, 0, 0);
    const t0 = performance.now();
    const done = threads > 1 ? new Promise((ok) => { helper.once("message", ok); helper.postMessage(job); }) : null;
    take(kernels, sweep, counter, job);
    await done;
    return performance.now() - t0;
  };
  const hashes = {}, times = {};
  for (let r = 0; r < reps; r++) {
    for (const threads of [1, 2]) {
      for (const kind of [3, 67]) {
        for (const what of ["head", "sweep"]) {
          const job = { what, kind, rows, cols, chunk: Math.ceil(rows / (threads * CHUNKS_PER_THREAD)) };
          (times[`${what}_kind${kind}_${threads}`] ??= []).push(await run(threads, job));
          if (what === "head") {
            let h = 0;
            const out = new Int32Array(memory.buffer, L.OUT, rows);
            for (let i = 0; i < rows; i++) h = (h * 31 + out[i]) | 0;
            hashes[`kind${kind}`] = h;
          }
        }
      }
    }
  }
  const result = { rows, cols, reps, same_output_bits: hashes.kind3 === hashes.kind67, cases: {} };
  for (const [name, ts] of Object.entries(times)) {
    ts.sort((a, b) => a - b);
    const bytes = name.includes("kind67") ? rows * L.row : rows * cols + rows * L.nb * 8;
    result.cases[name] = { bytes, fastest_ms: +ts[0].toFixed(2), median_ms: +ts[ts.length >> 1].toFixed(2),
                           gb_s: +(bytes / ts[0] / 1e6).toFixed(2) };
  }
  console.log(JSON.stringify(result));
  await helper.terminate();
} else {
  const { linear, sweepModule, memory } = workerData;
  const env = { env: { memory } };
  const kernels = (await WebAssembly.instantiate(linear, env)).exports;
  const sweep = (await WebAssembly.instantiate(sweepModule, env)).exports;
  const counter = new Int32Array(memory.buffer, 0, 1);
  parentPort.postMessage("ready");
  parentPort.on("message", (job) => {
    take(kernels, sweep, counter, job);
    parentPort.postMessage("done");
  });
}
