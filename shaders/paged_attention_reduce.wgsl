// Paged decode attention, flash-decoding pass 2: merges the per-partition softmax states written by
// paged_attention.wgsl for every sequence whose context spans more than one partition:
//   M = max_p m_p,  out = sum_p exp(m_p - M) * acc_p / sum_p exp(m_p - M) * l_p.
// One invocation per (sequence, head, 4 output values); sequences with one partition were finished in
// pass 1 and are skipped.
//
// Dispatch: ceil(num_seqs * n_heads * HEAD_DIM / 4 / WORKGROUP_SIZE) workgroups along x.

struct Params {
  num_seqs : u32,
  n_heads : u32,
  block_size : u32,
  partition_blocks : u32,
  max_partitions : u32,
}

@group(0) @binding(0) var<storage, read> context_lens : array<u32>;       // (num_seqs,)
@group(0) @binding(1) var<storage, read> part_acc : array<vec4<f32>>;      // (num_seqs, max_partitions, n_heads, HEAD_DIM / 4)
@group(0) @binding(2) var<storage, read> part_stats : array<vec2<f32>>;    // (num_seqs, max_partitions, n_heads): (max, sum)
@group(0) @binding(3) var<storage, read_write> out : array<vec4<f32>>;     // (num_seqs, n_heads, HEAD_DIM / 4)
@group(0) @binding(4) var<uniform> params : Params;

override HEAD_DIM : u32 = 64u;
override WORKGROUP_SIZE : u32 = 64u;

@compute @workgroup_size(WORKGROUP_SIZE)
fn main(@builtin(global_invocation_id) gid : vec3<u32>) {
  let vec_per_head = HEAD_DIM / 4u;
  let i = gid.x % vec_per_head;
  let head = (gid.x / vec_per_head) % params.n_heads;
  let seq = gid.x / (vec_per_head * params.n_heads);
  if (seq >= params.num_seqs) {
    return;
  }
  let n_blocks = (context_lens[seq] + params.block_size - 1u) / params.block_size;
  let n_parts = (n_blocks + params.partition_blocks - 1u) / params.partition_blocks;
  if (n_parts <= 1u) {
    return;
  }
  let first_state = seq * params.max_partitions * params.n_heads + head;
  var m = -3.0e38;
  for (var p = 0u; p < n_parts; p++) {
    m = max(m, part_stats[first_state + p * params.n_heads].x);
  }
  var total = 0.0;
  var sum = vec4<f32>(0.0);
  for (var p = 0u; p < n_parts; p++) {
    let state = first_state + p * params.n_heads;
    let stats = part_stats[state];
    let w = exp(stats.x - m);
    total += w * stats.y;
    sum += w * part_acc[state * vec_per_head + i];
  }
  out[(seq * params.n_heads + head) * vec_per_head + i] = sum / total;
}
