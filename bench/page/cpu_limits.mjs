// node bench/page/cpu_limits.mjs WASM THREADS...: the probes of bench/page/cpu_limits.wat (assembled with a shared
// memory) on each thread count at once, every thread on its own slice: stream GB/s over STREAM_MIB, multiply-add
// GFLOP/s. Best of REPEATS. Prints JSON. bench/cpu_limits.py runs it.
import { Worker, isMainThread, parentPort, workerData } from "node:worker_threads";
import { readFileSync } from "node:fs";

const STREAM_MIB = 512, REPEATS = 5, TRIPS = 20_000_000, FLOPS_A_TRIP = 12 * 4 * 2;  // cpu_limits.wat's muladd

if (isMainThread) {
  const [wasmPath, ...counts] = process.argv.slice(2);
  const module = await WebAssembly.compile(readFileSync(wasmPath));
  const memory = new WebAssembly.Memory({ initial: STREAM_MIB * 16 + 1, maximum: 65536, shared: true });
  new Uint8Array(memory.buffer).fill(1, 65536);  // every page written: untouched pages all read one zero page
  const result = { stream_mib: STREAM_MIB, muladd_trips: TRIPS, threads: {} };
  for (const n of counts.map(Number)) {
    const workers = await Promise.all(Array.from({ length: n }, (_, i) => new Promise((ok) => {
      const w = new Worker(new URL(import.meta.url), { workerData: { module, memory, i, n } });
      w.once("message", () => ok(w));
    })));
    const run = (job) => Promise.all(workers.map((w) => new Promise((ok) => {
      w.once("message", ok);
      w.postMessage(job);
    })));
    let stream = 0, muladd = 0;
    for (let r = 0; r < REPEATS; r++) {
      let t0 = performance.now();
      await run("stream");
      stream = Math.max(stream, STREAM_MIB * 1048576 / ((performance.now() - t0) / 1000) / 1e9);
      t0 = performance.now();
      await run("muladd");
      muladd = Math.max(muladd, n * TRIPS * FLOPS_A_TRIP / ((performance.now() - t0) / 1000) / 1e9);
    }
    result.threads[n] = { stream_gb_s: +stream.toFixed(2), muladd_gflop_s: +muladd.toFixed(2) };
    await Promise.all(workers.map((w) => w.terminate()));
  }
  console.log(JSON.stringify(result));
} else {
  const { module, memory, i, n } = workerData;
  const { exports } = await WebAssembly.instantiate(module, { env: { memory } });
  const slice = Math.floor(STREAM_MIB * 1048576 / n / 64) * 64;
  parentPort.postMessage("ready");
  parentPort.on("message", (job) => {
    if (job === "stream") exports.stream(65536 + i * slice, slice);
    else exports.muladd(TRIPS);
    parentPort.postMessage("done");
  });
}
