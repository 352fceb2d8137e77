// Shared part of paged_attention.wgsl and paged_prefill_attention.wgsl, pasted in by the host's
// ShaderLibrary at their `//#include paged_attention_common.wgsl` line (WGSL has no includes).
// Not a kernel on its own: it has no entry point.
//
// KV cache of one layer, K and V alike: (num_blocks, block_size, n_kv_heads, HEAD_DIM) values, stored as
// array<vec4<u32>> words so that pipeline constants pick the element type without a second binding type.
// A token is TOKEN_U32 u32s (a multiple of 4): n_kv_heads rows of ROW_U32 data u32s, then (quantized formats)
// n_kv_heads * SCALES_PER_ROW scale words, then zero padding (py/pagedkv/kv_dtype.py has the numpy twin):
//   KV_FORMAT 0 f32:       the f32 bits (bitcast);
//   KV_FORMAT 1 f16:       two f16 per u32, the first value in the low half (unpack2x16float; no shader-f16);
//   KV_FORMAT 2 int8:      four signed bytes per u32 (first value lowest), value = q * scale of its KV_GROUP;
//   KV_FORMAT 3 fp8-e4m3:  four e4m3 bytes per u32, value = e4m3(q) * the row's scale (KV_GROUP = HEAD_DIM);
//   KV_FORMAT 4 int4:      eight signed nibbles per u32, value = q * scale of its KV_GROUP;
//   KV_FORMAT 5 int4-asym: eight unsigned nibbles per u32, value = q * d + m, where the KV_GROUP's scale word
//                          holds two f16: the step d (low half) and the minimum m (high half).
// Dequantization happens here, on the 16 values a slice loads: there is no dequantized copy of the cache.
// Token `pos` of a sequence lives in block block_tables[seq, pos / block_size] at offset pos % block_size.
//
// Work split, for SwiftShader (whose loads from storage and from dynamically indexed private arrays are
// per-lane gathers) and GPUs alike: an invocation owns SLOTS (query token, head) pairs that read the same
// kv head -- decode: consecutive query heads of one GQA group; prefill: consecutive query tokens of one
// head -- so every K/V value it loads serves all of them. It walks the head dimension in slices of 16
// values held in mat4x4 registers with the block's tokens inside, so query and accumulator slices are
// fetched once per block instead of once per token. Measured on SwiftShader: the slices gave ~2-3x over a
// token-outer loop, 3 heads per invocation a further ~2.4x at 4,096 tokens of decode, 4 query tokens per
// invocation ~2.6x for prefill (512-token prompt).

struct Params {
  num_seqs : u32,
  n_heads : u32,
  n_kv_heads : u32,
  block_size : u32,          // tokens per block, <= MAX_BLOCK_SIZE
  max_blocks_per_seq : u32,  // row stride of block_tables
  partition_blocks : u32,    // flash-decoding: blocks per partition (decode only)
  max_partitions : u32,      // partition stride of the decode scratch buffers (decode only)
  scale : f32,               // softmax scale, usually 1 / sqrt(HEAD_DIM)
}

@group(0) @binding(0) var<storage, read> query : array<vec4<f32>>;     // (num_q_tokens, n_heads, HEAD_DIM / 4)
@group(0) @binding(1) var<storage, read> k_cache : array<vec4<u32>>;   // (num_blocks, block_size, TOKEN_U32 / 4)
@group(0) @binding(2) var<storage, read> v_cache : array<vec4<u32>>;   // (num_blocks, block_size, TOKEN_U32 / 4)
@group(0) @binding(3) var<storage, read> block_tables : array<u32>;    // (num_seqs, max_blocks_per_seq)
@group(0) @binding(4) var<storage, read> context_lens : array<u32>;    // (num_seqs,) tokens in the cache, new ones included
@group(0) @binding(5) var<uniform> params : Params;

override HEAD_DIM : u32 = 64u;     // multiple of 16, <= 4 * MAX_VEC
override KV_FORMAT : u32 = 0u;     // 0 f32, 1 f16, 2 int8, 3 fp8-e4m3, 4 int4, 5 int4-asym (KVDtype.code)
override KV_GROUP : u32 = 64u;     // channels per scale (quantized formats): a multiple of 16 dividing HEAD_DIM
override SLOTS : u32 = 1u;         // (query token, head) pairs per invocation, 1..4
override WORKGROUP_SIZE : u32 = 16u;
override KV_BITS : u32 = select(select(select(8u, 4u, KV_FORMAT >= 4u), 16u, KV_FORMAT == 1u), 32u, KV_FORMAT == 0u);
override ROW_U32 : u32 = HEAD_DIM * KV_BITS / 32u;
override SCALES_PER_ROW : u32 = select(HEAD_DIM / KV_GROUP, 0u, KV_FORMAT < 2u);
override VEC_PER_HEAD : u32 = HEAD_DIM / 4u;

const MAX_VEC : u32 = 32u;         // head_dim up to 128
const MAX_BLOCK_SIZE : u32 = 32u;
const NEG_BIG : f32 = -3.0e38;     // finite "minus infinity": exp(NEG_BIG - m) is 0, never NaN

// The running online-softmax state of the invocation's slots; vec4 component j belongs to slot j
// (components past SLOTS are unused).
var<private> q_base : u32;                                // first query vec4 of slot 0
var<private> q_step : u32;                                // query vec4s from one slot to the next
var<private> live_slots : u32;                            // slots with a real query (prefill tails have fewer)
var<private> slot_keys : vec4<u32>;                       // keys each slot may see: causal limit
var<private> acc : array<vec4<f32>, 4u * MAX_VEC>;        // (SLOTS, VEC_PER_HEAD) sum of exp(score - m) * v
var<private> m : vec4<f32>;                               // running max score
var<private> l : vec4<f32>;                               // running sum of exp(score - m)
var<private> scores : array<vec4<f32>, MAX_BLOCK_SIZE>;  // one block's scores / weights, never the whole context

// Starts the state: slot j is query row q_row + j * row_step and sees keys [0, keys[j]); slots from
// `live` on repeat slot 0 and are never written out.
fn begin_slots(q_row : u32, row_step : u32, live : u32, keys : vec4<u32>) {
  q_base = q_row * VEC_PER_HEAD;
  q_step = row_step * VEC_PER_HEAD;
  live_slots = live;
  slot_keys = keys;
  for (var i = 0u; i < SLOTS * VEC_PER_HEAD; i++) {
    acc[i] = vec4<f32>(0.0);
  }
  m = vec4<f32>(NEG_BIG);
  l = vec4<f32>(0.0);
}

fn unpack8(x : vec4<u32>, y : vec4<u32>) -> mat4x4<f32> {
  return mat4x4<f32>(vec4<f32>(unpack2x16float(x.x), unpack2x16float(x.y)),
                     vec4<f32>(unpack2x16float(x.z), unpack2x16float(x.w)),
                     vec4<f32>(unpack2x16float(y.x), unpack2x16float(y.y)),
                     vec4<f32>(unpack2x16float(y.z), unpack2x16float(y.w)));
}

fn token_u32s() -> u32 {
  return (params.n_kv_heads * (ROW_U32 + SCALES_PER_ROW) + 3u) & ~3u;
}

// e4m3 byte (sign bit 0x80) -> f32; exponent 0 is subnormal (m * 2^-9).
fn e4m3(b : u32) -> f32 {
  let e = (b >> 3u) & 15u;
  let m = b & 7u;
  let mag = select(bitcast<f32>(((e + 120u) << 23u) | (m << 20u)), f32(m) * 0.001953125, e == 0u);
  return select(mag, -mag, (b & 0x80u) != 0u);
}

fn e4m3x4(w : u32) -> vec4<f32> {
  return vec4<f32>(e4m3(w & 255u), e4m3((w >> 8u) & 255u), e4m3((w >> 16u) & 255u), e4m3(w >> 24u));
}

fn int8x4(w : u32) -> vec4<f32> {  // sign-extending arithmetic shifts
  return vec4<f32>(vec4<i32>(bitcast<i32>(w << 24u), bitcast<i32>(w << 16u), bitcast<i32>(w << 8u),
                             bitcast<i32>(w)) >> vec4<u32>(24u));
}

fn int4x4(w : u32) -> vec4<f32> {  // the low four nibbles of w
  return vec4<f32>(vec4<i32>(bitcast<i32>(w << 28u), bitcast<i32>(w << 24u), bitcast<i32>(w << 20u),
                             bitcast<i32>(w << 16u)) >> vec4<u32>(28u));
}

fn uint4x4(w : u32) -> vec4<f32> {  // the low four nibbles of w, unsigned
  return vec4<f32>((vec4<u32>(w) >> vec4<u32>(0u, 4u, 8u, 12u)) & vec4<u32>(15u));
}

// 16 quantized values (four u32 of 8-bit codes, or w.xy of 4-bit codes) times their group's scale word
// (int4-asym: q * d + m; q * d is exact, so a fused multiply-add changes nothing).
fn dequant16(w : vec4<u32>, scale_word : u32) -> mat4x4<f32> {
  if (KV_FORMAT == 5u) {
    let dm = unpack2x16float(scale_word);
    let m = vec4<f32>(dm.y);
    return mat4x4<f32>(uint4x4(w.x) * dm.x + m, uint4x4(w.x >> 16u) * dm.x + m, uint4x4(w.y) * dm.x + m,
                       uint4x4(w.y >> 16u) * dm.x + m);
  }
  let scale = bitcast<f32>(scale_word);
  if (KV_FORMAT == 4u) {
    return mat4x4<f32>(int4x4(w.x), int4x4(w.x >> 16u), int4x4(w.y), int4x4(w.y >> 16u)) * scale;
  }
  if (KV_FORMAT == 3u) {
    return mat4x4<f32>(e4m3x4(w.x), e4m3x4(w.y), e4m3x4(w.z), e4m3x4(w.w)) * scale;
  }
  return mat4x4<f32>(int8x4(w.x), int8x4(w.y), int8x4(w.z), int8x4(w.w)) * scale;
}

// Values 16 * s .. 16 * s + 15 of the K (or V) row of kv head `kv_head` in the token starting at u32 `tok`.
fn k_slice(tok : u32, kv_head : u32, s : u32) -> mat4x4<f32> {
  let row = tok + kv_head * ROW_U32;
  if (KV_FORMAT == 0u) {
    let w = row / 4u + 4u * s;
    return mat4x4<f32>(bitcast<vec4<f32>>(k_cache[w]), bitcast<vec4<f32>>(k_cache[w + 1u]),
                       bitcast<vec4<f32>>(k_cache[w + 2u]), bitcast<vec4<f32>>(k_cache[w + 3u]));
  }
  if (KV_FORMAT == 1u) {
    let w = row / 4u + 2u * s;
    return unpack8(k_cache[w], k_cache[w + 1u]);
  }
  let at = tok + params.n_kv_heads * ROW_U32 + kv_head * SCALES_PER_ROW + 16u * s / KV_GROUP;
  let scale = k_cache[at / 4u][at % 4u];
  let first = row + s * KV_BITS / 2u;  // a slice of 16 values is KV_BITS / 2 u32s
  if (KV_BITS == 8u) {
    return dequant16(k_cache[first / 4u], scale);
  }
  return dequant16(vec4<u32>(k_cache[first / 4u][first % 4u], k_cache[(first + 1u) / 4u][(first + 1u) % 4u],
                             0u, 0u), scale);
}

fn v_slice(tok : u32, kv_head : u32, s : u32) -> mat4x4<f32> {
  let row = tok + kv_head * ROW_U32;
  if (KV_FORMAT == 0u) {
    let w = row / 4u + 4u * s;
    return mat4x4<f32>(bitcast<vec4<f32>>(v_cache[w]), bitcast<vec4<f32>>(v_cache[w + 1u]),
                       bitcast<vec4<f32>>(v_cache[w + 2u]), bitcast<vec4<f32>>(v_cache[w + 3u]));
  }
  if (KV_FORMAT == 1u) {
    let w = row / 4u + 2u * s;
    return unpack8(v_cache[w], v_cache[w + 1u]);
  }
  let at = tok + params.n_kv_heads * ROW_U32 + kv_head * SCALES_PER_ROW + 16u * s / KV_GROUP;
  let scale = v_cache[at / 4u][at % 4u];
  let first = row + s * KV_BITS / 2u;
  if (KV_BITS == 8u) {
    return dequant16(v_cache[first / 4u], scale);
  }
  return dequant16(vec4<u32>(v_cache[first / 4u][first % 4u], v_cache[(first + 1u) / 4u][(first + 1u) % 4u],
                             0u, 0u), scale);
}

// Slice s of slot j: its query (pre-scaled) or its accumulator.
fn q_slice(j : u32, s : u32) -> mat4x4<f32> {
  if (j >= SLOTS) {
    return mat4x4<f32>();
  }
  let i = q_base + select(0u, j, j < live_slots) * q_step + 4u * s;
  return mat4x4<f32>(query[i], query[i + 1u], query[i + 2u], query[i + 3u]) * params.scale;
}

fn acc_slice(j : u32, s : u32) -> mat4x4<f32> {
  let i = j * VEC_PER_HEAD + 4u * s;
  return mat4x4<f32>(acc[i], acc[i + 1u], acc[i + 2u], acc[i + 3u]);
}

fn set_acc_slice(j : u32, s : u32, a : mat4x4<f32>) {
  let i = j * VEC_PER_HEAD + 4u * s;
  acc[i] = a[0];
  acc[i + 1u] = a[1];
  acc[i + 2u] = a[2];
  acc[i + 3u] = a[3];
}

fn dot16(a : mat4x4<f32>, b : mat4x4<f32>) -> f32 {
  return dot(a[0], b[0]) + dot(a[1], b[1]) + dot(a[2], b[2]) + dot(a[3], b[3]);
}

// Folds keys [block_begin * block_size, n_keys) of blocks [block_begin, block_end) of sequence `seq`
// into the state: a block's scores first, then one rescale per block rather than one per token.
// The `SLOTS > j` tests are on a pipeline constant: the compiler drops the unused slots' code.
fn attend_blocks(seq : u32, kv_head : u32, block_begin : u32, block_end : u32, n_keys : u32) {
  let bs = params.block_size;
  let token_u32 = token_u32s();
  for (var b = block_begin; b < block_end; b++) {
    let physical = block_tables[seq * params.max_blocks_per_seq + b];
    let base = physical * bs * token_u32;  // first u32 of the block
    let n = min(bs, n_keys - b * bs);
    for (var t = 0u; t < n; t++) {
      scores[t] = vec4<f32>(0.0);
    }
    for (var s = 0u; s < HEAD_DIM / 16u; s++) {
      let q0 = q_slice(0u, s);
      let q1 = q_slice(1u, s);
      let q2 = q_slice(2u, s);
      let q3 = q_slice(3u, s);
      for (var t = 0u; t < n; t++) {
        let k = k_slice(base + t * token_u32, kv_head, s);
        var sc = vec4<f32>(dot16(q0, k), 0.0, 0.0, 0.0);
        if (SLOTS > 1u) { sc.y = dot16(q1, k); }
        if (SLOTS > 2u) { sc.z = dot16(q2, k); }
        if (SLOTS > 3u) { sc.w = dot16(q3, k); }
        scores[t] += sc;
      }
    }
    var block_max = vec4<f32>(NEG_BIG);
    for (var t = 0u; t < n; t++) {
      scores[t] = select(scores[t], vec4<f32>(NEG_BIG), vec4<u32>(b * bs + t) >= slot_keys);  // causal mask
      block_max = max(block_max, scores[t]);
    }
    let m_new = max(m, block_max);
    let alpha = exp(m - m_new);
    l *= alpha;
    for (var t = 0u; t < n; t++) {
      scores[t] = exp(scores[t] - m_new);  // now the softmax weights of token t
      l += scores[t];
    }
    for (var s = 0u; s < HEAD_DIM / 16u; s++) {
      var a0 = acc_slice(0u, s) * alpha.x;
      var a1 = mat4x4<f32>();
      var a2 = mat4x4<f32>();
      var a3 = mat4x4<f32>();
      if (SLOTS > 1u) { a1 = acc_slice(1u, s) * alpha.y; }
      if (SLOTS > 2u) { a2 = acc_slice(2u, s) * alpha.z; }
      if (SLOTS > 3u) { a3 = acc_slice(3u, s) * alpha.w; }
      for (var t = 0u; t < n; t++) {
        let v = v_slice(base + t * token_u32, kv_head, s);
        let w = scores[t];
        a0 += v * w.x;
        if (SLOTS > 1u) { a1 += v * w.y; }
        if (SLOTS > 2u) { a2 += v * w.z; }
        if (SLOTS > 3u) { a3 += v * w.w; }
      }
      set_acc_slice(0u, s, a0);
      if (SLOTS > 1u) { set_acc_slice(1u, s, a1); }
      if (SLOTS > 2u) { set_acc_slice(2u, s, a2); }
      if (SLOTS > 3u) { set_acc_slice(3u, s, a3); }
    }
    m = m_new;
  }
}

// Writes the live slots' normalised outputs to rows out_row + j * row_step of `out`
// (declared by each kernel as (rows, HEAD_DIM / 4) vec4s).
fn write_normalised(out_row : u32, row_step : u32) {
  for (var j = 0u; j < live_slots; j++) {
    for (var i = 0u; i < VEC_PER_HEAD; i++) {
      out[(out_row + j * row_step) * VEC_PER_HEAD + i] = acc[j * VEC_PER_HEAD + i] / l[j];
    }
  }
}
