// The cpu family's paged decode attention (paged_attention[_wide]: composed after attention_heads_<128|256>.wgsl by
// shader_variants.py), flash-decoding pass 1: one query token per sequence (the decode step).
// One invocation per (sequence, partition, SLOTS consecutive query heads) walks its partition of the
// context through the block table with an online softmax; no barriers, no score buffer the size of the
// context. GQA: query head h reads kv head h / (n_heads / n_kv_heads); SLOTS divides the heads per kv
// head, so an invocation's heads share one kv head.
// A sequence whose context fits one partition writes its normalised output straight to `out`; longer
// ones leave per-partition (max, sum, unnormalised acc) states that paged_attention_reduce.wgsl merges.
//
// Dispatch: ceil(num_seqs * max_partitions * (n_heads / SLOTS) / WORKGROUP_SIZE) workgroups along x.

//#include paged_attention_common.wgsl

@group(0) @binding(6) var<storage, read_write> out : array<vec4<f32>>;         // (num_seqs, n_heads, HEAD_DIM / 4)
@group(0) @binding(7) var<storage, read_write> part_acc : array<vec4<f32>>;    // (num_seqs, max_partitions, n_heads, HEAD_DIM / 4)
@group(0) @binding(8) var<storage, read_write> part_stats : array<vec2<f32>>;  // (num_seqs, max_partitions, n_heads): (max, sum)

@compute @workgroup_size(WORKGROUP_SIZE)
fn main(@builtin(global_invocation_id) gid : vec3<u32>) {
  let n_tiles = params.n_heads / SLOTS;
  let head = (gid.x % n_tiles) * SLOTS;  // the invocation's first head
  let part = (gid.x / n_tiles) % params.max_partitions;
  let seq = gid.x / (n_tiles * params.max_partitions);
  if (seq >= params.num_seqs) {
    return;
  }
  let ctx_len = context_lens[seq];
  let n_blocks = (ctx_len + params.block_size - 1u) / params.block_size;
  let n_parts = (n_blocks + params.partition_blocks - 1u) / params.partition_blocks;
  if (part >= n_parts) {
    return;
  }
  begin_slots(seq * params.n_heads + head, 1u, SLOTS, vec4<u32>(ctx_len));
  let kv_head = head / (params.n_heads / params.n_kv_heads);
  let first = part * params.partition_blocks;
  attend_blocks(seq, kv_head, first, min(first + params.partition_blocks, n_blocks), ctx_len);

  if (n_parts == 1u) {
    write_normalised(seq * params.n_heads + head, 1u);
    return;
  }
  for (var j = 0u; j < SLOTS; j++) {
    let state = (seq * params.max_partitions + part) * params.n_heads + head + j;
    part_stats[state] = vec2<f32>(m[j], l[j]);
    for (var i = 0u; i < VEC_PER_HEAD; i++) {
      part_acc[state * VEC_PER_HEAD + i] = acc[j * VEC_PER_HEAD + i];
    }
  }
}
