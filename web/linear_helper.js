// One helper thread of the CPU path's kernels (linear_threads.js starts one per extra core): the kernel on the
// shared memory, claiming chunks of the job its control block names (runJob: a product's rows, a prompt chunk's
// attention queries), job after job, until the tab closes.
// Between jobs it polls for ctrl[14] microseconds (a decode step's products come every 50-300 us with the
// engine's Python between them; a wake from Atomics.wait costs ~100 us in Chromium), then sleeps.
"use strict";

importScripts("linear_threads.js");  // runJob, CTRL_INTS, JOB_AT, JOB_WORDS

self.onmessage = async (event) => {
  const { module, memory, ctrlAt, counterAt } = event.data;
  let exports;
  try {
    ({ exports } = await WebAssembly.instantiate(module, { env: { memory } }));
  } catch (err) {
    self.postMessage(String(err.message || err));
    return;
  }
  const ctrl = new Int32Array(memory.buffer, ctrlAt, CTRL_INTS);
  const job = new Float64Array(memory.buffer, ctrlAt + JOB_AT, JOB_WORDS);
  const counter = new Int32Array(memory.buffer, counterAt, 1);
  self.postMessage("ready");
  for (let seen = 0; ;) {
    for (let spins = 0, since = performance.now(); Atomics.load(ctrl, 0) === seen; spins++) {
      if ((spins & 255) === 0 && performance.now() - since > ctrl[14] / 1000) Atomics.wait(ctrl, 0, seen);
    }
    seen = Atomics.load(ctrl, 0);
    try {
      const t0 = performance.now();  // ctrl[13]: this job's microseconds (stats)
      ctrl[15] = runJob(exports, counter, job);
      ctrl[13] = Math.round((performance.now() - t0) * 1000);
    } catch (err) {
      console.error("kernel thread:", err);
      Atomics.store(ctrl, 2, 1);
    }
    Atomics.store(ctrl, 1, seen);
    Atomics.notify(ctrl, 1);
  }
};
