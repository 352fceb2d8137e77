// Reshape-and-cache: row t of the new K and V, (num_tokens, n_kv_heads, HEAD_DIM) f32, is stored in cache
// slot slot_mapping[t] = physical_block * block_size + offset, in the element type KV_FORMAT, laid out as in
// paged_attention_common.wgsl (and py/pagedkv/kv_dtype.py, whose numpy quantizer this matches bit for bit):
// a token is TOKEN_U32 u32s = n_kv_heads rows of ROW_U32 data u32s, then the rows' f32 scales, then padding.
//   f32 / f16: one invocation per (token, cache word), K and V together (no scales: words are independent).
//   int8 / int4 (symmetric, one scale per KV_GROUP channels), int4-asym (unsigned codes over [min, max], an
//   f16 step and minimum per KV_GROUP channels in one word) and fp8-e4m3 (one scale per row): one invocation
//   per token, because the token's scales share words and a store to one u32 of a vec4 may rewrite it all.
//
// Slots are consecutive tokens (slot s at u32 s * TOKEN_U32) unless BLOCK_U32 is set: then block
// s / BLOCK_TOKENS starts at u32 (s / BLOCK_TOKENS) * BLOCK_U32 (pages several models share, shared_pages.py).
//
// Dispatch: ceil(invocations / WORKGROUP_SIZE) workgroups along x, invocations = num_tokens * n_kv_heads *
// ROW_U32 / 4 for f32 / f16 and num_tokens for the quantized formats (KVLayout.kv_write_invocations).

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
override KV_GROUP : u32 = 64u;      // channels per scale (quantized formats), divides HEAD_DIM
override WORKGROUP_SIZE : u32 = 64u;
override KV_BITS : u32 = select(select(select(8u, 4u, KV_FORMAT >= 4u), 16u, KV_FORMAT == 1u), 32u, KV_FORMAT == 0u);
override ROW_U32 : u32 = HEAD_DIM * KV_BITS / 32u;
override SCALES_PER_ROW : u32 = select(HEAD_DIM / KV_GROUP, 0u, KV_FORMAT < 2u);
override BLOCK_U32 : u32 = 0u;      // u32s from one block's start to the next; 0: slots follow each other
override BLOCK_TOKENS : u32 = 16u;  // tokens per block (read only where BLOCK_U32 is set)

const FLT_MIN : f32 = 1.17549435e-38;  // smallest normal f32: smaller scales are stored as 0
const F16_MAX : f32 = 65504.0;
const F16_MIN_NORMAL : f32 = 6.103515625e-05;  // 2^-14

// Eight values as one word of four u32, each holding two f16 (the lower half is the first value).
fn to_f16_word(a : vec4<f32>, b : vec4<f32>) -> vec4<u32> {
  return vec4<u32>(pack2x16float(a.xy), pack2x16float(a.zw), pack2x16float(b.xy), pack2x16float(b.zw));
}

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

fn load(is_v : bool, i : u32) -> f32 {
  if (is_v) {
    return v_new[i / 4u][i % 4u];
  }
  return k_new[i / 4u][i % 4u];
}

fn store(is_v : bool, i : u32, value : u32) {
  if (is_v) {
    v_cache[i / 4u][i % 4u] = value;
  } else {
    k_cache[i / 4u][i % 4u] = value;
  }
}

// The scale is amax times f32(1 / qmax) (bit patterns below = numpy's np.float32(1 / qmax)): a product
// is correctly rounded on every WebGPU implementation, a division is not (WGSL allows 2.5 ULP; SwiftShader's
// amax / 127.0 differed from numpy's in the last bit).
fn rcp_top() -> f32 {
  return bitcast<f32>(select(select(select(0x3c010204u, 0x3e124925u, KV_FORMAT == 4u), 0x3d888889u, KV_FORMAT == 5u),
                            0x3b124925u, KV_FORMAT == 3u));
}

// int4-asym's step and minimum live on the normal f16 numbers; rounding to them is done on the f32 bits
// (drop or round up the 13 mantissa bits an f16 lacks) because WGSL leaves the rounding of an f32 -> f16
// conversion to the implementation. pack2x16float then only ever sees exact f16 values.
fn round_away_to_f16(v : f32) -> f32 {
  let b = bitcast<u32>(v);
  return bitcast<f32>(select((b & 0xFFFFE000u) + 0x2000u, b, (b & 0x1FFFu) == 0u));
}

// The largest of {0, normal f16} at or below lo (|lo| <= F16_MAX); 0 when |lo| < 2^-14, a cut that a
// denormal flushed to zero cannot move.
fn f16_floor(lo : f32) -> f32 {
  if (lo >= F16_MIN_NORMAL) {
    return bitcast<f32>(bitcast<u32>(lo) & 0xFFFFE000u);
  }
  return select(round_away_to_f16(lo), 0.0, lo > -F16_MIN_NORMAL);
}

// The smallest normal f16 at or above d >= 0.
fn f16_ceil(d : f32) -> f32 {
  return select(round_away_to_f16(d), F16_MIN_NORMAL, d < F16_MIN_NORMAL);
}

// Dekker's split: v = hi + lo with hi holding the upper 12 of the 24 mantissa bits; products of halves
// are exact in f32.
fn split(v : f32) -> vec2<f32> {
  let c = 4097.0 * v;
  let hi = c - (c - v);
  return vec2<f32>(hi, v - hi);
}

// Which side of the rounding midpoint m (a short-mantissa value) the EXACT quotient a / d lies on, d > 0,
// a near m * d: +1 above, -1 below, 0 exactly on it. m * d = p + e exactly (Dekker's two-product, only
// correctly rounded * and -), and a - p is exact (Sterbenz: a and p are within a factor of 2).
fn side_of_midpoint(a : f32, m : f32, d : f32) -> i32 {
  let p = m * d;
  let ms = split(m);
  let ds = split(d);
  let e = ((ms.x * ds.x - p) + ms.x * ds.y + ms.y * ds.x) + ms.y * ds.y;
  let diff = a - p;
  return select(select(0, -1, diff < e), 1, diff > e);
}

// The integer nearest to the exact x / d, ties to even. The f32 quotient is within 2.5 ULP of it, so it
// rounds right unless it lies within 1e-4 of a midpoint k + 0.5; those (rare) cases are decided exactly.
fn nearest_int(x : f32, d : f32) -> f32 {
  let y = x / d;
  let lo = floor(y);
  if (abs(y - lo - 0.5) > 1.0e-4) {
    return round(y);
  }
  let side = side_of_midpoint(x, lo + 0.5, d);
  if (side == 0) {
    return select(lo + 1.0, lo, lo % 2.0 == 0.0);  // tie: the even neighbour
  }
  return select(lo, lo + 1.0, side > 0);
}

fn e4m3_value(c : u32) -> f32 {  // magnitude codes 0..0x7F
  let e = c >> 3u;
  let m = c & 7u;
  return select(bitcast<f32>(((e + 120u) << 23u) | (m << 20u)), f32(m) * 0.001953125, e == 0u);
}

// The e4m3 magnitude code (0..0x7E) nearest to the exact |x| / d, ties to the even code (kv_dtype.py).
fn e4m3_magnitude(ax : f32, d : f32) -> u32 {
  let a = ax / d;
  var lo : u32;  // the code truncating a: the largest e4m3 value <= a (to within the quotient's error)
  if (a < 0.015625) {  // below 2^-6: subnormal, multiples of 2^-9
    lo = u32(floor(a * 512.0));
  } else {
    let bits = bitcast<u32>(a);
    lo = (((bits >> 23u) - 120u) << 3u) | ((bits >> 20u) & 7u);
  }
  if (lo >= 0x7Eu) {
    return 0x7Eu;
  }
  let v0 = e4m3_value(lo);
  let v1 = e4m3_value(lo + 1u);
  let mid = 0.5 * (v0 + v1);  // exact: v0 and v1 have 4 significant bits
  var side = select(-1, 1, a > mid);
  if (abs(a - mid) <= 1.0e-4 * mid) {
    side = side_of_midpoint(ax, mid, d);
  }
  if (side == 0) {
    return select(lo + 1u, lo, lo % 2u == 0u);
  }
  return select(lo, lo + 1u, side > 0);
}

// The code of value x in a group of scale (step) d > 0 and minimum m (int4-asym), as a KV_BITS-bit field.
fn encode(x : f32, d : f32, m : f32) -> u32 {
  if (KV_FORMAT == 5u) {
    return u32(clamp(nearest_int(clamp(x, -F16_MAX, F16_MAX) - m, d), 0.0, 15.0));
  }
  if (KV_FORMAT == 3u) {
    return e4m3_magnitude(abs(x), d) | select(0u, 0x80u, x < 0.0);
  }
  let qmax = select(127.0, 7.0, KV_FORMAT == 4u);
  let q = i32(clamp(nearest_int(x, d), -qmax, qmax));
  return bitcast<u32>(q) & (0xFFFFFFFFu >> (32u - KV_BITS));  // a KV_BITS-bit two's complement field
}

// Quantizes the (token, kv head) row starting at value `src` into the cache token at u32 `dst`.
fn quantize_row(is_v : bool, src : u32, dst : u32, kv_head : u32) {
  let per_u32 = 32u / KV_BITS;
  for (var g = 0u; g < SCALES_PER_ROW; g++) {
    let first = src + g * KV_GROUP;
    var d : f32;
    var m = 0.0;
    var scale_word : u32;
    if (KV_FORMAT == 5u) {
      var lo = F16_MAX;
      var hi = -F16_MAX;
      for (var i = 0u; i < KV_GROUP; i++) {
        let x = clamp(load(is_v, first + i), -F16_MAX, F16_MAX);
        lo = min(lo, x);
        hi = max(hi, x);
      }
      m = f16_floor(lo);
      d = f16_ceil((hi - m) * rcp_top());
      scale_word = pack2x16float(vec2<f32>(d, m));  // exact: both are f16 values
    } else {
      var amax = 0.0;
      for (var i = 0u; i < KV_GROUP; i++) {
        amax = max(amax, abs(load(is_v, first + i)));
      }
      d = amax * rcp_top();
      if (d < FLT_MIN) {
        d = 0.0;
      }
      scale_word = bitcast<u32>(d);
    }
    store(is_v, dst + params.n_kv_heads * ROW_U32 + kv_head * SCALES_PER_ROW + g, scale_word);
    for (var w = 0u; w < KV_GROUP / per_u32; w++) {
      var word = 0u;
      if (d > 0.0) {
        for (var j = 0u; j < per_u32; j++) {
          word |= encode(load(is_v, first + w * per_u32 + j), d, m) << (j * KV_BITS);
        }
      }
      store(is_v, dst + kv_head * ROW_U32 + (g * KV_GROUP) / per_u32 + w, word);
    }
  }
}

@compute @workgroup_size(WORKGROUP_SIZE)
fn main(@builtin(global_invocation_id) gid : vec3<u32>) {
  if (KV_FORMAT >= 2u) {
    let token = gid.x;
    if (token >= params.num_tokens) {
      return;
    }
    let dst = slot_u32(slot_mapping[token]);
    // The padding u32s: written so a reused slot holds exactly what numpy's pack_tokens produces.
    for (var i = params.n_kv_heads * (ROW_U32 + SCALES_PER_ROW); i < token_u32s(); i++) {
      store(false, dst + i, 0u);
      store(true, dst + i, 0u);
    }
    for (var h = 0u; h < params.n_kv_heads; h++) {
      let src = (token * params.n_kv_heads + h) * HEAD_DIM;
      quantize_row(false, src, dst, h);
      quantize_row(true, src, dst, h);
    }
    return;
  }
  let token_words = params.n_kv_heads * ROW_U32 / 4u;
  let token = gid.x / token_words;
  if (token >= params.num_tokens) {
    return;
  }
  let within = gid.x % token_words;  // (kv head, word) inside the token's row, same order in source and cache
  let dst = slot_u32(slot_mapping[token]) / 4u + within;
  if (KV_FORMAT == 1u) {
    let src = (token * token_words + within) * 2u;  // a word holds 8 values: two source vec4s
    k_cache[dst] = to_f16_word(k_new[src], k_new[src + 1u]);
    v_cache[dst] = to_f16_word(v_new[src], v_new[src + 1u]);
  } else {
    k_cache[dst] = bitcast<vec4<u32>>(k_new[gid.x]);
    v_cache[dst] = bitcast<vec4<u32>>(v_new[gid.x]);
  }
}
