// Where a row of the KV cache lies inside its block, for the kernels that read it (paged_kv_read.wgsl) and
// write it (kv_slots.wgsl), `//#include`d by both; they declare params.n_kv_heads, ROW_U32, SCALES_PER_ROW and
// HEAD_MAJOR. A token takes token_u32s() u32s: n_kv_heads rows of ROW_U32 data u32s, n_kv_heads *
// SCALES_PER_ROW scale words, padding to a vec4. HEAD_MAJOR: a block holds each kv head's rows of all its
// tokens together, then the scale words in the same order, then the tokens' padding; else token after token.

fn token_u32s() -> u32 {
  return (params.n_kv_heads * (ROW_U32 + SCALES_PER_ROW) + 3u) & ~3u;
}

// The first data u32 (x) and the first scale word (y) of kv head `kv_head`'s row in token `offset` of the
// block of `bs` tokens starting at u32 `start`.
fn row_in_block(start : u32, bs : u32, offset : u32, kv_head : u32) -> vec2<u32> {
  if (HEAD_MAJOR) {
    let r = kv_head * bs + offset;
    return vec2<u32>(start + r * ROW_U32, start + bs * params.n_kv_heads * ROW_U32 + r * SCALES_PER_ROW);
  }
  let tok = start + offset * token_u32s();
  return vec2<u32>(tok + kv_head * ROW_U32, tok + params.n_kv_heads * ROW_U32 + kv_head * SCALES_PER_ROW);
}
