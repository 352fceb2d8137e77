// Paged prefill attention (causal, chunked): each sequence brings a chunk of q_len new query tokens whose
// K/V were already written to the cache (kv_write.wgsl); they attend to the cached prefix (prefix-cache hits
// or earlier chunks) plus the new tokens up to their own position, all read through the block table.
// New token i of sequence s sits at position context_lens[s] - q_len + i and sees keys 0..that position.
// One invocation per (query head, tile of SLOTS consecutive new tokens of one sequence): the tile's
// tokens share every K/V load and each masks the keys past its own position. Same online softmax as
// decode (paged_attention_common.wgsl).
//
// Dispatch: ceil(num_tiles * n_heads / WORKGROUP_SIZE) workgroups along x, where sequence s has
// ceil(q_len / SLOTS) tiles and num_tiles = starts[1, num_seqs].

//#include paged_attention_common.wgsl

// Row 0: first query row of each sequence (num_seqs + 1 entries, the last = num_tokens);
// row 1: first tile of each sequence (the last = num_tiles).
@group(0) @binding(6) var<storage, read> starts : array<u32>;           // (2, num_seqs + 1)
@group(0) @binding(7) var<storage, read_write> out : array<vec4<f32>>;  // (num_tokens, n_heads, HEAD_DIM / 4)

// The sequence owning tile `tile`: the last s with starts[1, s] <= tile.
fn sequence_of(tile : u32) -> u32 {
  let tiles = params.num_seqs + 1u;
  var lo = 0u;
  var hi = params.num_seqs;
  while (hi - lo > 1u) {
    let mid = (lo + hi) / 2u;
    if (starts[tiles + mid] <= tile) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

@compute @workgroup_size(WORKGROUP_SIZE)
fn main(@builtin(global_invocation_id) gid : vec3<u32>) {
  let head = gid.x % params.n_heads;
  let tile = gid.x / params.n_heads;
  if (tile >= starts[2u * params.num_seqs + 1u]) {
    return;
  }
  let seq = sequence_of(tile);
  let q_begin = starts[seq];
  let q_len = starts[seq + 1u] - q_begin;
  let first = q_begin + (tile - starts[params.num_seqs + 1u + seq]) * SLOTS;  // the tile's first token
  let live = min(SLOTS, q_begin + q_len - first);
  // Causal: token i of the chunk sees context_len - q_len + i + 1 keys; dead slots copy slot 0.
  let keys0 = context_lens[seq] - q_len + (first - q_begin) + 1u;
  let slot = vec4<u32>(0u, 1u, 2u, 3u);
  let keys = vec4<u32>(keys0) + select(vec4<u32>(0u), slot, slot < vec4<u32>(live));
  begin_slots(first * params.n_heads + head, params.n_heads, live, keys);
  let kv_head = head / (params.n_heads / params.n_kv_heads);
  let n_keys = keys0 + live - 1u;
  attend_blocks(seq, kv_head, 0u, (n_keys + params.block_size - 1u) / params.block_size, n_keys);
  write_normalised(first * params.n_heads + head, params.n_heads);
}
