// The query tiles of chunked prefill, shared by paged_prefill_attention_main.wgsl (cpu family) and
// paged_prefill_attention_gpu.wgsl (gpu family), expanded at their `//#include paged_prefill_tiles.wgsl` line.

// Row 0: first query row of each sequence (num_seqs + 1 entries, the last = num_tokens);
// row 1: first tile of each sequence (the last = num_tiles).
@group(0) @binding(6) var<storage, read> starts : array<u32>;           // (2, num_seqs + 1)

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

// The new tokens of one tile of `size` tokens: rows first .. first + live - 1 of the query.
struct QueryTile {
  seq : u32,
  first : u32,  // the tile's first query row
  live : u32,   // its tokens (a sequence's last tile may have fewer than `size`)
  keys0 : u32,  // keys its first token sees (causal); its token i sees keys0 + i
}

fn query_tile(tile : u32, size : u32) -> QueryTile {
  let seq = sequence_of(tile);
  let q_begin = starts[seq];
  let q_len = starts[seq + 1u] - q_begin;
  let first = q_begin + (tile - starts[params.num_seqs + 1u + seq]) * size;
  // Causal: token i of the chunk sees context_len - q_len + i + 1 keys.
  return QueryTile(seq, first, min(size, q_begin + q_len - first), context_lens[seq] - q_len + (first - q_begin) + 1u);
}
