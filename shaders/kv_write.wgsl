// Reshape-and-cache: row t of the new K and V, (num_tokens, n_kv_heads, HEAD_DIM) f32, is stored in cache
// slot slot_mapping[t] = physical_block * block_size + offset. Both caches are (num_blocks, block_size,
// n_kv_heads, HEAD_DIM) values in vec4<u32> words, f32 or packed f16 by KV_F16 exactly as in
// paged_attention_common.wgsl. One invocation per (token, kv head, cache word), K and V together.
//
// Dispatch: ceil(num_tokens * n_kv_heads * ROW_WORDS / WORKGROUP_SIZE) workgroups along x.

struct Params {
  num_tokens : u32,
  n_kv_heads : u32,
}

@group(0) @binding(0) var<storage, read> k_new : array<vec4<f32>>;        // (num_tokens, n_kv_heads, HEAD_DIM / 4)
@group(0) @binding(1) var<storage, read> v_new : array<vec4<f32>>;        // (num_tokens, n_kv_heads, HEAD_DIM / 4)
@group(0) @binding(2) var<storage, read> slot_mapping : array<u32>;       // (num_tokens,)
@group(0) @binding(3) var<storage, read_write> k_cache : array<vec4<u32>>; // (num_blocks, block_size, n_kv_heads, ROW_WORDS)
@group(0) @binding(4) var<storage, read_write> v_cache : array<vec4<u32>>; // (num_blocks, block_size, n_kv_heads, ROW_WORDS)
@group(0) @binding(5) var<uniform> params : Params;

override HEAD_DIM : u32 = 64u;
override KV_F16 : bool = false;
override WORKGROUP_SIZE : u32 = 64u;
override ROW_WORDS : u32 = select(HEAD_DIM / 4u, HEAD_DIM / 8u, KV_F16);

// Eight values as one word of four u32, each holding two f16 (the lower half is the first value).
fn to_f16_word(a : vec4<f32>, b : vec4<f32>) -> vec4<u32> {
  return vec4<u32>(pack2x16float(a.xy), pack2x16float(a.zw), pack2x16float(b.xy), pack2x16float(b.zw));
}

@compute @workgroup_size(WORKGROUP_SIZE)
fn main(@builtin(global_invocation_id) gid : vec3<u32>) {
  let token_words = params.n_kv_heads * ROW_WORDS;
  let token = gid.x / token_words;
  if (token >= params.num_tokens) {
    return;
  }
  let within = gid.x % token_words;  // (kv head, word) inside the token's row, same order in source and cache
  let dst = slot_mapping[token] * token_words + within;
  if (KV_F16) {
    let src = (token * token_words + within) * 2u;  // a word holds 8 values: two source vec4s
    k_cache[dst] = to_f16_word(k_new[src], k_new[src + 1u]);
    v_cache[dst] = to_f16_word(v_new[src], v_new[src + 1u]);
  } else {
    k_cache[dst] = bitcast<vec4<u32>>(k_new[gid.x]);
    v_cache[dst] = bitcast<vec4<u32>>(v_new[gid.x]);
  }
}
