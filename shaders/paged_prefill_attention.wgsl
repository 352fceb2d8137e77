// Paged prefill attention (causal, chunked): each sequence brings a chunk of q_len new query tokens whose
// K/V were already written to the cache (kv_write.wgsl); they attend to the cached prefix (prefix-cache hits
// or earlier chunks) plus the new tokens up to their own position, all read through the block table.
// New token i of sequence s sits at position context_lens[s] - q_len + i and sees keys 0..that position.
// One invocation per (query token, tile of HEAD_TILE query heads), same online softmax as decode
// (paged_attention_common.wgsl).
//
// Dispatch: ceil(num_tokens * (n_heads / HEAD_TILE) / WORKGROUP_SIZE) workgroups along x.

//#include paged_attention_common.wgsl

@group(0) @binding(6) var<storage, read> query_start_loc : array<u32>;  // (num_seqs + 1,) first query row of each sequence
@group(0) @binding(7) var<storage, read_write> out : array<vec4<f32>>;  // (num_tokens, n_heads, HEAD_DIM / 4)

// The sequence owning query row `token`: the last s with query_start_loc[s] <= token.
fn sequence_of(token : u32) -> u32 {
  var lo = 0u;
  var hi = params.num_seqs;
  while (hi - lo > 1u) {
    let mid = (lo + hi) / 2u;
    if (query_start_loc[mid] <= token) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

@compute @workgroup_size(WORKGROUP_SIZE)
fn main(@builtin(global_invocation_id) gid : vec3<u32>) {
  let n_tiles = params.n_heads / HEAD_TILE;
  let head = (gid.x % n_tiles) * HEAD_TILE;  // the tile's first head
  let token = gid.x / n_tiles;
  if (token >= query_start_loc[params.num_seqs]) {
    return;
  }
  let seq = sequence_of(token);
  let q_begin = query_start_loc[seq];
  let q_len = query_start_loc[seq + 1u] - q_begin;
  let n_keys = context_lens[seq] - q_len + (token - q_begin) + 1u;  // causal: keys up to this token
  load_query(token * params.n_heads + head);
  let kv_head = head / (params.n_heads / params.n_kv_heads);
  attend_blocks(seq, kv_head, 0u, (n_keys + params.block_size - 1u) / params.block_size, n_keys);
  write_normalised(token * params.n_heads + head);
}
