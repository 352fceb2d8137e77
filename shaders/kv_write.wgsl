// Reshape-and-cache for f32 and f16 KV: row t of the new K and V, (num_tokens, n_kv_heads, HEAD_DIM) f32, is
// stored in cache slot slot_mapping[t] = physical_block * block_size + offset, in the element type KV_FORMAT,
// laid out as in paged_kv_read.wgsl (kv_slots.wgsl's addressing): n_kv_heads rows of ROW_U32 data u32s. One
// invocation per (token, kv head, cache word), K and V together (no scales: words are independent). The
// quantized formats are kv_write_quant.wgsl's.
//
// Dispatch: ceil(invocations / WORKGROUP_SIZE) workgroups along x, invocations = num_tokens * n_kv_heads *
// ROW_U32 / 4 (GpuKVLayout.kv_write_invocations).

struct Params {
  num_tokens : u32,
  n_kv_heads : u32,
}

@group(0) @binding(0) var<storage, read> k_new : array<vec4<f32>>;        // (num_tokens, n_kv_heads, HEAD_DIM / 4)
@group(0) @binding(1) var<storage, read> v_new : array<vec4<f32>>;        // (num_tokens, n_kv_heads, HEAD_DIM / 4)
@group(0) @binding(2) var<storage, read> slot_mapping : array<u32>;       // (num_tokens,)
@group(0) @binding(3) var<storage, read_write> k_cache : array<vec4<u32>>; // (num_blocks, block_size, TOKEN_U32 / 4)
@group(0) @binding(4) var<storage, read_write> v_cache : array<vec4<u32>>; // (num_blocks, block_size, TOKEN_U32 / 4)
@group(0) @binding(5) var<uniform> params : Params;

override HEAD_DIM : u32 = 64u;
override KV_FORMAT : u32 = 0u;      // 0 f32, 1 f16, 2 int8, 3 fp8-e4m3, 4 int4, 5 int4-asym (KVDtype.code)
override KV_GROUP : u32 = 64u;      // the cache layout's constant: unused by f32 / f16
override WORKGROUP_SIZE : u32 = 64u;
override KV_BITS : u32 = select(select(select(8u, 4u, KV_FORMAT >= 4u), 16u, KV_FORMAT == 1u), 32u, KV_FORMAT == 0u);
override ROW_U32 : u32 = HEAD_DIM * KV_BITS / 32u;
override SCALES_PER_ROW : u32 = select(HEAD_DIM / KV_GROUP, 0u, KV_FORMAT < 2u);
override BLOCK_U32 : u32 = 0u;      // u32s from one block's start to the next; 0: blocks follow each other
override BLOCK_TOKENS : u32 = 16u;  // tokens per block (the cache's block_size)
override HEAD_MAJOR : bool = true;  // a block keeps each kv head's rows together (paged_kv_read.wgsl)


// Eight values as one word of four u32, each holding two f16 (the lower half is the first value).
fn to_f16_word(a : vec4<f32>, b : vec4<f32>) -> vec4<u32> {
  return vec4<u32>(pack2x16float(a.xy), pack2x16float(a.zw), pack2x16float(b.xy), pack2x16float(b.zw));
}

fn kv_heads() -> u32 {
  return params.n_kv_heads;
}

//#include kv_slots.wgsl

@compute @workgroup_size(WORKGROUP_SIZE)
fn main(@builtin(global_invocation_id) gid : vec3<u32>) {
  let token_words = params.n_kv_heads * ROW_U32 / 4u;
  let token = gid.x / token_words;
  if (token >= params.num_tokens) {
    return;
  }
  let within = gid.x % token_words;  // (kv head, word) inside the token's rows, the source's order
  let row_words = ROW_U32 / 4u;
  let dst = slot_row(slot_mapping[token], within / row_words).x / 4u + within % row_words;
  if (KV_FORMAT == 1u) {
    let src = (token * token_words + within) * 2u;  // a word holds 8 values: two source vec4s
    k_cache[dst] = to_f16_word(k_new[src], k_new[src + 1u]);
    v_cache[dst] = to_f16_word(v_new[src], v_new[src + 1u]);
  } else {
    k_cache[dst] = bitcast<vec4<u32>>(k_new[gid.x]);
    v_cache[dst] = bitcast<vec4<u32>>(v_new[gid.x]);
  }
}
