// What a worker of this kind can use: cross-origin isolation (SharedArrayBuffer, the CPU path's threads), a nested
// Worker, WebGPU (an adapter and a device). Shared by the SharedWorker and the dedicated Worker of probe.js.
export async function workerFacts() {
  const facts = {
    crossOriginIsolated: self.crossOriginIsolated === true,
    sharedArrayBuffer: typeof SharedArrayBuffer === "function",
    nestedWorker: typeof Worker === "function",
    webgpu: Boolean(self.navigator?.gpu),
  };
  try {
    const adapter = await navigator.gpu?.requestAdapter();
    facts.adapter = Boolean(adapter);
    facts.device = Boolean(adapter && (await adapter.requestDevice()));
  } catch (err) {
    facts.gpuError = String(err);
  }
  return facts;
}
