// Where a new token's K / V row goes, for kv_write.wgsl, kv_write_quant.wgsl and the q|k|v projection's
// rope_kv epilogue (matvec_io_rope_kv.wgsl) (`//#include`; they declare ROW_U32, SCALES_PER_ROW, BLOCK_U32,
// BLOCK_TOKENS, HEAD_MAJOR and kv_heads(), as kv_rows.wgsl asks). Cache slot s is token s % BLOCK_TOKENS of
// block s / BLOCK_TOKENS; the blocks' layout is kv_rows.wgsl's.

//#include kv_rows.wgsl

// The first u32 of the block holding cache slot `slot`.
fn slot_block(slot : u32) -> u32 {
  return block_start(slot / BLOCK_TOKENS, BLOCK_TOKENS);
}

// The first data u32 (x) and the first scale word (y) of kv head `kv_head`'s row in cache slot `slot`.
fn slot_row(slot : u32, kv_head : u32) -> vec2<u32> {
  return row_in_block(slot_block(slot), BLOCK_TOKENS, slot % BLOCK_TOKENS, kv_head);
}

// The first of cache slot `slot`'s padding u32s (token_u32s() - n_kv_heads * (ROW_U32 + SCALES_PER_ROW) of them).
fn slot_padding(slot : u32) -> u32 {
  let used = kv_heads() * (ROW_U32 + SCALES_PER_ROW);
  let offset = slot % BLOCK_TOKENS;
  if (HEAD_MAJOR) {
    return slot_block(slot) + BLOCK_TOKENS * used + offset * (token_u32s() - used);
  }
  return slot_block(slot) + offset * token_u32s() + used;
}
