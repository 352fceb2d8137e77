// Plan replayer: encodes one whole forward step from a plan recorded once by Python
// (py/pagedkv/backends/webgpu/backend.py), so a step costs O(1) Python->JS crossings
// instead of three per dispatch. Loaded into the worker with importScripts.
//
// A plan is {passes: [[pipeline, bindGroup], ...][]} recorded once per batch-shape bucket.
// Each step passes its workgroup grids (Int32Array, 3 per dispatch, 0 = skip), and a list of
// buffer-to-buffer copies run between pass 0 and pass 1 (the rows of each sequence's last token). A pipelined
// decode step first copies the previous step's drawn ids into its token ids (feed), on the GPU.
"use strict";

self.pagedkvReplayer = {
  /** Encode every pass of `plan` with `grids` in one command encoder and submit it before the first await;
   *  optionally map `readDst` (a MAP_READ buffer) after copying `readBytes` of `readSrc` into it, resolving
   *  to an ArrayBuffer (null without a read). `feedBytes` > 0: copy them from `feedSrc` to `feedDst` first. */
  async step(device, plan, grids, copies, copySrc, copyDst, readSrc, readDst, readBytes, feedSrc, feedDst, feedBytes) {
    const encoder = device.createCommandEncoder();
    if (feedBytes > 0) encoder.copyBufferToBuffer(feedSrc, 0, feedDst, 0, feedBytes);
    let d = 0;
    plan.passes.forEach((dispatches, p) => {
      if (p > 0) {
        for (let i = 0; i < copies.length; i += 3) {
          encoder.copyBufferToBuffer(copySrc, copies[i], copyDst, copies[i + 1], copies[i + 2]);
        }
      }
      const pass = encoder.beginComputePass();
      for (const [pipeline, group] of dispatches) {
        const x = grids[3 * d], y = grids[3 * d + 1], z = grids[3 * d + 2];
        d++;
        if (x === 0) continue;
        pass.setPipeline(pipeline);
        pass.setBindGroup(0, group);
        pass.dispatchWorkgroups(x, y, z);
      }
      pass.end();
    });
    if (readBytes > 0) encoder.copyBufferToBuffer(readSrc, 0, readDst, 0, readBytes);
    device.queue.submit([encoder.finish()]);
    if (readBytes === 0) return null;
    await readDst.mapAsync(GPUMapMode.READ, 0, readBytes);
    const out = readDst.getMappedRange(0, readBytes).slice(0);
    readDst.unmap();
    return out;
  },
};
