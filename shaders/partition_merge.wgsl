// The flash-decoding merge of one output vec4 (`//#include partition_merge.wgsl`: paged_attention_reduce.wgsl's
// main, and the output projection's prologue, matvec_io_merge.wgsl). The including kernel binds part_acc
// (num_seqs, max_partitions, n_heads, HEAD_DIM / 4) vec4 and part_stats (..., n_heads) (max, sum):
//   M = max_p m_p,  out = sum_p exp(m_p - M) * acc_p / sum_p exp(m_p - M) * l_p.
// MergeParams is the merge's uniform (the step's "reduce" slot: plan.step_slots), bound by the includer.

struct MergeParams {
  num_seqs : u32,
  n_heads : u32,
  block_size : u32,
  partition_blocks : u32,
  max_partitions : u32,
}

// Partitions a context of `context_len` tokens spans (1: its attention output was written whole).
fn partitions_of(context_len : u32, p : MergeParams) -> u32 {
  let n_blocks = (context_len + p.block_size - 1u) / p.block_size;
  return (n_blocks + p.partition_blocks - 1u) / p.partition_blocks;
}

// Vec4 i of a head's merged output over its n_parts states first, first + n_heads, ...
fn merge_partitions(first : u32, n_parts : u32, n_heads : u32, i : u32) -> vec4<f32> {
  var m = -3.0e38;
  for (var p = 0u; p < n_parts; p++) {
    m = max(m, part_stats[first + p * n_heads].x);
  }
  var total = 0.0;
  var sum = vec4<f32>(0.0);
  for (var p = 0u; p < n_parts; p++) {
    let state = first + p * n_heads;
    let stats = part_stats[state];
    let w = exp(stats.x - m);
    total += w * stats.y;
    sum += w * part_acc[state * (HEAD_DIM / 4u) + i];
  }
  return sum / total;
}
