// Where a new token's K / V row goes, for kv_write.wgsl and kv_write_quant.wgsl (`//#include`; they declare
// params.n_kv_heads, ROW_U32, SCALES_PER_ROW, BLOCK_U32 and BLOCK_TOKENS). A token is token_u32s() u32s; slots
// follow each other unless BLOCK_U32 is set: then block s / BLOCK_TOKENS starts at u32 (s / BLOCK_TOKENS) *
// BLOCK_U32 (pages several models share, py/pagedkv/backends/webgpu/shared_pages.py).

fn token_u32s() -> u32 {
  return (params.n_kv_heads * (ROW_U32 + SCALES_PER_ROW) + 3u) & ~3u;
}

// The first u32 of cache slot `slot`.
fn slot_u32(slot : u32) -> u32 {
  if (BLOCK_U32 == 0u) {
    return slot * token_u32s();
  }
  return (slot / BLOCK_TOKENS) * BLOCK_U32 + (slot % BLOCK_TOKENS) * token_u32s();
}
