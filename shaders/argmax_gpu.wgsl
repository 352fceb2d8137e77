// argmax.wgsl's result for the gpu family: the per-thread winners of argmax_common.wgsl's scan
// are combined by a workgroup-memory tree (log2(WORKGROUP_SIZE) barriers, WORKGROUP_SIZE a power of
// two) instead of one thread's serial pass over all of them. Called from uniform control flow.

//#include argmax_common.wgsl

fn combine(s : u32, lid : u32) {
  for (var stride = WORKGROUP_SIZE / 2u; stride > 0u; stride >>= 1u) {
    if (lid < stride && beats(best_value[lid + stride], best_index[lid + stride], best_value[lid], best_index[lid])) {
      best_value[lid] = best_value[lid + stride];
      best_index[lid] = best_index[lid + stride];
    }
    workgroupBarrier();
  }
  if (lid == 0u) {
    out[s] = best_index[0];
  }
}
