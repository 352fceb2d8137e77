// Reshape-and-cache for the quantized KV formats (int8, fp8-e4m3, int4, int4-asym): row t of the new K and V,
// (num_tokens, n_kv_heads, HEAD_DIM) f32, quantized into cache slot slot_mapping[t] in the block layout of
// paged_kv_read.wgsl (kv_slots.wgsl: rows of ROW_U32 code words, the rows' scale words, padding), bit-exact
// with numpy's quantizer (kv_quant.wgsl; py/pagedkv/kv/dtypes.py).
//
// One workgroup per token and HEADS kv heads, K and V together: invocation i owns code word w = i % ROW_U32 of
// the K row (or V: (i / ROW_U32) odd) of kv head i / (2 ROW_U32) of its heads. Each reads its 4 (8-bit) or 8
// (4-bit) values and puts their |max| (or min and max, int4-asym) in workgroup memory; after a barrier it reads
// its group's words' (KV_GROUP channels), so every invocation of a group derives the same scale, encodes its
// own word and stores it whole. The first word of a group also stores the group's scale word. The cache is
// bound as array<u32> here: every u32 has one writer, so no store rewrites a neighbour's (a vec4 component
// store may). The workgroup of kv head 0 writes the token's padding words.
//
// Dispatch: num_tokens * n_kv_heads / HEADS workgroups of WORKGROUP_SIZE = HEADS * 2 ROW_U32
// (GpuKVLayout.kv_write_workgroup: every kv head of SmolLM2's int8 KV is 96 invocations).

struct Params {
  num_tokens : u32,
  n_kv_heads : u32,
}

@group(0) @binding(0) var<storage, read> k_new : array<vec4<f32>>;   // (num_tokens, n_kv_heads, HEAD_DIM / 4)
@group(0) @binding(1) var<storage, read> v_new : array<vec4<f32>>;   // (num_tokens, n_kv_heads, HEAD_DIM / 4)
@group(0) @binding(2) var<storage, read> slot_mapping : array<u32>;  // (num_tokens,)
@group(0) @binding(3) var<storage, read_write> k_cache : array<u32>; // (num_blocks, block_size, TOKEN_U32)
@group(0) @binding(4) var<storage, read_write> v_cache : array<u32>; // (num_blocks, block_size, TOKEN_U32)
@group(0) @binding(5) var<uniform> params : Params;

override HEAD_DIM : u32 = 64u;
override KV_FORMAT : u32 = 2u;      // 2 int8, 3 fp8-e4m3, 4 int4, 5 int4-asym (KVDtype.code)
override KV_GROUP : u32 = 64u;      // channels per scale, a multiple of 16 dividing HEAD_DIM
override HEADS : u32 = 1u;         // kv heads per workgroup, dividing n_kv_heads
override WORKGROUP_SIZE : u32 = 64u;  // HEADS * 2 * ROW_U32
override KV_BITS : u32 = select(8u, 4u, KV_FORMAT >= 4u);
override ROW_U32 : u32 = HEAD_DIM * KV_BITS / 32u;
override SCALES_PER_ROW : u32 = HEAD_DIM / KV_GROUP;
override PER_U32 : u32 = 32u / KV_BITS;          // values in one code word
override GROUP_WORDS : u32 = KV_GROUP / PER_U32;  // code words of one scale group
override BLOCK_U32 : u32 = 0u;      // u32s from one block's start to the next; 0: blocks follow each other
override BLOCK_TOKENS : u32 = 16u;  // tokens per block (the cache's block_size)
override HEAD_MAJOR : bool = true;  // a block keeps each kv head's rows together (paged_kv_read.wgsl)

//#include kv_quant.wgsl

var<workgroup> lows : array<f32, WORKGROUP_SIZE>;   // each word's min (int4-asym) or 0
var<workgroup> highs : array<f32, WORKGROUP_SIZE>;  // each word's max (int4-asym) or |max|

fn kv_heads() -> u32 {
  return params.n_kv_heads;
}

//#include kv_slots.wgsl

fn load(is_v : bool, i : u32) -> f32 {
  if (is_v) {
    return v_new[i / 4u][i % 4u];
  }
  return k_new[i / 4u][i % 4u];
}

fn store(is_v : bool, i : u32, value : u32) {
  if (is_v) {
    v_cache[i] = value;
  } else {
    k_cache[i] = value;
  }
}

@compute @workgroup_size(WORKGROUP_SIZE)
fn main(@builtin(workgroup_id) wid : vec3<u32>, @builtin(local_invocation_index) lid : u32) {
  let per_token = params.n_kv_heads / HEADS;
  let token = wid.x / per_token;  // uniform across the workgroup: every invocation reaches the barrier
  if (token >= params.num_tokens) {
    return;
  }
  let owns_word = lid < HEADS * 2u * ROW_U32;
  let kv_head = (wid.x % per_token) * HEADS + lid / (2u * ROW_U32);
  let is_v = (lid / ROW_U32) % 2u == 1u;
  let w = lid % ROW_U32;  // the code word of the row this invocation owns
  let src = (token * params.n_kv_heads + kv_head) * HEAD_DIM + w * PER_U32;  // its first value
  var lo = F16_MAX;
  var hi = select(0.0, -F16_MAX, KV_FORMAT == 5u);
  if (owns_word) {
    for (var j = 0u; j < PER_U32; j++) {
      let x = load(is_v, src + j);
      if (KV_FORMAT == 5u) {
        let c = clamp(x, -F16_MAX, F16_MAX);
        lo = min(lo, c);
        hi = max(hi, c);
      } else {
        hi = max(hi, abs(x));
      }
    }
  }
  lows[lid] = lo;
  highs[lid] = hi;
  workgroupBarrier();
  if (!owns_word) {
    return;
  }
  let g = w / GROUP_WORDS;  // the scale group of the word
  let first = lid - w % GROUP_WORDS;  // the group's first word's invocation
  for (var i = first; i < first + GROUP_WORDS; i++) {  // min / max: exact, in any order
    lo = min(lo, lows[i]);
    hi = max(hi, highs[i]);
  }
  var d : f32;
  var m = 0.0;
  var scale_word : u32;
  if (KV_FORMAT == 5u) {
    m = f16_floor(lo);
    d = f16_ceil((hi - m) * rcp_top());
    scale_word = pack2x16float(vec2<f32>(d, m));  // exact: both are f16 values
  } else {
    d = hi * rcp_top();
    if (d < FLT_MIN) {
      d = 0.0;
    }
    scale_word = bitcast<u32>(d);
  }
  var word = 0u;
  if (d > 0.0) {
    for (var j = 0u; j < PER_U32; j++) {
      word |= encode(load(is_v, src + j), d, m) << (j * KV_BITS);
    }
  }
  let slot = slot_mapping[token];
  let dst = slot_row(slot, kv_head);
  store(is_v, dst.x + w, word);
  if (w % GROUP_WORDS == 0u) {
    store(is_v, dst.y + g, scale_word);
  }
  // The padding u32s: written so a reused slot holds exactly what numpy's pack_tokens produces.
  if (kv_head == 0u && w < token_u32s() - params.n_kv_heads * (ROW_U32 + SCALES_PER_ROW)) {
    store(is_v, slot_padding(slot) + w, 0u);
  }
}
