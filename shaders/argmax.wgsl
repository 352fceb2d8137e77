// Greedy sampling on the GPU: out[s] = argmax of logits row s, lowest index on
// ties (numpy's rule), so decode reads back one u32 per sequence instead of the
// whole (vocab,) f32 row. One workgroup per sequence: each thread scans a strided
// slice (argmax_common.wgsl), one barrier publishes the per-thread winners,
// and thread 0 combines them (one barrier: cheap on SwiftShader; argmax_gpu.wgsl is the tree).

//#include argmax_common.wgsl

fn combine(s : u32, lid : u32) {
  if (lid == 0u) {
    var value = best_value[0];
    var index = best_index[0];
    for (var j = 1u; j < WORKGROUP_SIZE; j++) {
      if (beats(best_value[j], best_index[j], value, index)) {
        value = best_value[j];
        index = best_index[j];
      }
    }
    out[s] = index;
  }
}
