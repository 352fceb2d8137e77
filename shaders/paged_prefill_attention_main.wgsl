// The cpu family's paged prefill attention (paged_prefill_attention[_wide]: composed after
// attention_heads_<128|256>.wgsl by shader_variants.py), causal, chunked: each sequence brings a chunk of q_len
// new query tokens whose K/V were already written to the cache (kv_write.wgsl); they attend to the cached prefix (prefix-cache hits
// or earlier chunks) plus the new tokens up to their own position, all read through the block table.
// New token i of sequence s sits at position context_lens[s] - q_len + i and sees keys 0..that position.
// One invocation per (query head, tile of SLOTS consecutive new tokens of one sequence): the tile's
// tokens share every K/V load and each masks the keys past its own position. Same online softmax as
// decode (paged_attention_common.wgsl).
//
// Dispatch: ceil(num_tiles * n_heads / WORKGROUP_SIZE) workgroups along x, where sequence s has
// ceil(q_len / SLOTS) tiles and num_tiles = starts[1, num_seqs].

//#include paged_attention_common.wgsl

//#include paged_prefill_tiles.wgsl

@group(0) @binding(7) var<storage, read_write> out : array<vec4<f32>>;  // (num_tokens, n_heads, HEAD_DIM / 4)

@compute @workgroup_size(WORKGROUP_SIZE)
fn main(@builtin(global_invocation_id) gid : vec3<u32>) {
  let head = gid.x % params.n_heads;
  let tile = gid.x / params.n_heads;
  if (tile >= starts[2u * params.num_seqs + 1u]) {
    return;
  }
  let qt = query_tile(tile, SLOTS);
  let slot = vec4<u32>(0u, 1u, 2u, 3u);
  let keys = vec4<u32>(qt.keys0) + select(vec4<u32>(0u), slot, slot < vec4<u32>(qt.live));  // dead slots copy slot 0
  begin_slots(qt.first * params.n_heads + head, params.n_heads, qt.live, keys);
  let kv_head = head / (params.n_heads / params.n_kv_heads);
  let n_keys = qt.keys0 + qt.live - 1u;
  attend_blocks(qt.seq, kv_head, 0u, (n_keys + params.block_size - 1u) / params.block_size, n_keys);
  write_normalised(qt.first * params.n_heads + head, params.n_heads);
}
