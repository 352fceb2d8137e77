// argmax.wgsl's result for the gpu family: the per-thread winners of argmax_common.wgsl's scan
// are combined by a workgroup-memory tree (log2(WORKGROUP_SIZE) barriers, WORKGROUP_SIZE a power of
// two) instead of one thread's serial pass over all of them. The branch around the barriers depends
// only on workgroup_id.

//#include argmax_common.wgsl

@compute @workgroup_size(WORKGROUP_SIZE)
fn main(@builtin(workgroup_id) wid : vec3<u32>, @builtin(local_invocation_index) lid : u32) {
  let s = wid.x;
  if (s >= params.seqs) {
    return;
  }
  scan(s, lid);
  workgroupBarrier();
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
