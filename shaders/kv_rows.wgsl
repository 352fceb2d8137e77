// Where a row of the KV cache lies, for every kernel that reads it (paged_kv_read.wgsl, attention_mass.wgsl) or
// writes it (kv_slots.wgsl, matvec_io_rope_kv.wgsl), `//#include`d by each; the includer declares ROW_U32,
// SCALES_PER_ROW, BLOCK_U32 and HEAD_MAJOR, and `fn kv_heads() -> u32` (the cache's n_kv_heads). A token takes
// token_u32s() u32s: kv_heads() rows of ROW_U32 data u32s, kv_heads() * SCALES_PER_ROW scale words, padding to
// a vec4. Blocks follow each other (block b at u32 b * block_size * token_u32s()) unless BLOCK_U32 is set: then
// block b starts at u32 b * BLOCK_U32 (pages several models share, py/pagedkv/backends/webgpu/shared_pages.py).
// HEAD_MAJOR: a block holds each kv head's rows of all its tokens together, then the scale words in the same
// order, then the tokens' padding; else token after token.

fn token_u32s() -> u32 {
  return (kv_heads() * (ROW_U32 + SCALES_PER_ROW) + 3u) & ~3u;
}

// The first u32 of physical block `block` of a cache of `bs`-token blocks.
fn block_start(block : u32, bs : u32) -> u32 {
  return block * select(bs * token_u32s(), BLOCK_U32, BLOCK_U32 != 0u);
}

// The first data u32 (x) and the first scale word (y) of kv head `kv_head`'s row in token `offset` of the
// block of `bs` tokens starting at u32 `start`.
fn row_in_block(start : u32, bs : u32, offset : u32, kv_head : u32) -> vec2<u32> {
  if (HEAD_MAJOR) {
    let r = kv_head * bs + offset;
    return vec2<u32>(start + r * ROW_U32, start + bs * kv_heads() * ROW_U32 + r * SCALES_PER_ROW);
  }
  let tok = start + offset * token_u32s();
  return vec2<u32>(tok + kv_head * ROW_U32, tok + kv_heads() * ROW_U32 + kv_head * SCALES_PER_ROW);
}
