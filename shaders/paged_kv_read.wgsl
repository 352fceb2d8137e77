// Reading the paged KV cache, shared by the attention kernels of both families (paged_attention_common.wgsl
// for the cpu family, paged_attention_gpu_main.wgsl for the gpu family), pasted in by the host's ShaderLibrary
// (included by paged_attention_common.wgsl; the first part of paged_attention_gpu[_sg], shader_variants.py):
// bindings 0-5, the cache formats and their dequantization.
//
// KV cache of one layer, K and V alike: num_blocks blocks of block_size tokens' n_kv_heads rows of HEAD_DIM
// values, stored as array<vec4<u32>> words so that pipeline constants pick the element type without a second
// binding type. A token takes TOKEN_U32 u32s (a multiple of 4): n_kv_heads rows of ROW_U32 data u32s,
// (quantized formats) n_kv_heads * SCALES_PER_ROW scale words and zero padding (py/pagedkv/kv/dtypes.py has
// the numpy twin of a token); where in its block each of them lies is below (HEAD_MAJOR):
//   KV_FORMAT 0 f32:       the f32 bits (bitcast);
//   KV_FORMAT 1 f16:       two f16 per u32, the first value in the low half (unpack2x16float; no shader-f16);
//   KV_FORMAT 2 int8:      four signed bytes per u32 (first value lowest), value = q * scale of its KV_GROUP;
//   KV_FORMAT 3 fp8-e4m3:  four e4m3 bytes per u32, value = e4m3(q) * the row's scale (KV_GROUP = HEAD_DIM);
//   KV_FORMAT 4 int4:      eight signed nibbles per u32, value = q * scale of its KV_GROUP;
//   KV_FORMAT 5 int4-asym: eight unsigned nibbles per u32, value = q * d + m, where the KV_GROUP's scale word
//                          holds two f16: the step d (low half) and the minimum m (high half).
// Dequantization happens here, on the 16 values a slice loads: there is no dequantized copy of the cache.
// Token `pos` of a sequence lives in block block_tables[seq, pos / block_size] at offset pos % block_size.
// Blocks follow each other (block b at u32 b * block_size * TOKEN_U32) unless BLOCK_U32 is set: then block b
// starts at u32 b * BLOCK_U32 (pages several models share, py/pagedkv/backends/webgpu/shared_pages.py).
// Inside a block (HEAD_MAJOR, the default) each kv head's rows of all block_size tokens follow each other, so
// one head's keys are contiguous: (n_kv_heads, block_size, ROW_U32) data u32s, then (n_kv_heads, block_size,
// SCALES_PER_ROW) scale words, then the tokens' padding (kv_rows.wgsl). Without HEAD_MAJOR a block is
// block_size tokens of TOKEN_U32 u32s each (the host's order: GpuKVLayout converts at upload and read-back).

struct Params {
  num_seqs : u32,
  n_heads : u32,
  n_kv_heads : u32,
  block_size : u32,          // tokens per block: at most 32, or a multiple of 32 (GpuKVLayout)
  max_blocks_per_seq : u32,  // row stride of block_tables
  partition_blocks : u32,    // flash-decoding: blocks per partition (decode only)
  max_partitions : u32,      // partition stride of the decode scratch buffers (decode only)
  scale : f32,               // softmax scale, usually 1 / sqrt(HEAD_DIM)
  window : u32,              // a window layer's: a query at cache index i sees keys j with i - j < window; 0: all
}

@group(0) @binding(0) var<storage, read> query : array<vec4<f32>>;     // (num_q_tokens, n_heads, HEAD_DIM / 4)
@group(0) @binding(1) var<storage, read> k_cache : array<vec4<u32>>;   // (num_blocks, block_size, TOKEN_U32 / 4)
@group(0) @binding(2) var<storage, read> v_cache : array<vec4<u32>>;   // (num_blocks, block_size, TOKEN_U32 / 4)
@group(0) @binding(3) var<storage, read> block_tables : array<u32>;    // (num_seqs, max_blocks_per_seq)
@group(0) @binding(4) var<storage, read> context_lens : array<u32>;    // (num_seqs,) tokens in the cache, new ones included
@group(0) @binding(5) var<uniform> params : Params;

override HEAD_DIM : u32 = 64u;     // multiple of 16, <= 256
override KV_FORMAT : u32 = 0u;     // 0 f32, 1 f16, 2 int8, 3 fp8-e4m3, 4 int4, 5 int4-asym (KVDtype.code)
override KV_GROUP : u32 = 64u;     // channels per scale (quantized formats): a multiple of 16 dividing HEAD_DIM
override SLOTS : u32 = 1u;         // (query token, head) pairs per invocation, 1..4
override WORKGROUP_SIZE : u32 = 16u;
override KV_BITS : u32 = select(select(select(8u, 4u, KV_FORMAT >= 4u), 16u, KV_FORMAT == 1u), 32u, KV_FORMAT == 0u);
override ROW_U32 : u32 = HEAD_DIM * KV_BITS / 32u;
override SCALES_PER_ROW : u32 = select(HEAD_DIM / KV_GROUP, 0u, KV_FORMAT < 2u);
override VEC_PER_HEAD : u32 = HEAD_DIM / 4u;
override BLOCK_U32 : u32 = 0u;     // u32s from one block's start to the next; 0: block_size * TOKEN_U32
override HEAD_MAJOR : bool = true; // a block keeps each kv head's rows together (see above)

const NEG_BIG : f32 = -3.0e38;     // finite "minus infinity": exp(NEG_BIG - m) is 0, never NaN

// The first key a query that sees `keys` keys (causal: its cache index + 1) sees in a window layer; 0 in the
// others. The kernels start their walk of the context there, so blocks wholly before a window are never read
// (a window layer may have released them: their table entries need not name a block).
fn window_first(keys : u32) -> u32 {
  if (params.window == 0u || keys <= params.window) {
    return 0u;
  }
  return keys - params.window;
}

fn unpack8(x : vec4<u32>, y : vec4<u32>) -> mat4x4<f32> {
  return mat4x4<f32>(vec4<f32>(unpack2x16float(x.x), unpack2x16float(x.y)),
                     vec4<f32>(unpack2x16float(x.z), unpack2x16float(x.w)),
                     vec4<f32>(unpack2x16float(y.x), unpack2x16float(y.y)),
                     vec4<f32>(unpack2x16float(y.z), unpack2x16float(y.w)));
}

//#include kv_rows.wgsl

fn kv_heads() -> u32 {
  return params.n_kv_heads;
}

// Where one row of the cache is: its first data u32 and its first scale word (quantized formats).
struct KVRow {
  data : u32,
  scales : u32,
}

// The row of kv head `kv_head` in token `offset` of physical block `block`.
fn kv_row(block : u32, offset : u32, kv_head : u32) -> KVRow {
  let at = row_in_block(block_start(block, params.block_size), params.block_size, offset, kv_head);
  return KVRow(at.x, at.y);
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

// Word i of the V cache (v) or of the K cache: one body reads either (v is a constant at every call).
fn kv_word4(v : bool, i : u32) -> vec4<u32> {
  if (v) {
    return v_cache[i];
  }
  return k_cache[i];
}

// Values 16 * s .. 16 * s + 15 of the V (v) or K row `at` (kv_row).
fn kv_slice(v : bool, at : KVRow, s : u32) -> mat4x4<f32> {
  let row = at.data;
  if (KV_FORMAT == 0u) {
    let w = row / 4u + 4u * s;
    return mat4x4<f32>(bitcast<vec4<f32>>(kv_word4(v, w)), bitcast<vec4<f32>>(kv_word4(v, w + 1u)),
                       bitcast<vec4<f32>>(kv_word4(v, w + 2u)), bitcast<vec4<f32>>(kv_word4(v, w + 3u)));
  }
  if (KV_FORMAT == 1u) {
    let w = row / 4u + 2u * s;
    return unpack8(kv_word4(v, w), kv_word4(v, w + 1u));
  }
  let sw = at.scales + 16u * s / KV_GROUP;
  let scale = kv_word4(v, sw / 4u)[sw % 4u];
  let first = row + s * KV_BITS / 2u;  // a slice of 16 values is KV_BITS / 2 u32s
  if (KV_BITS == 8u) {
    return dequant16(kv_word4(v, first / 4u), scale);
  }
  return dequant16(vec4<u32>(kv_word4(v, first / 4u)[first % 4u], kv_word4(v, (first + 1u) / 4u)[(first + 1u) % 4u],
                             0u, 0u), scale);
}

fn k_slice(at : KVRow, s : u32) -> mat4x4<f32> {
  return kv_slice(false, at, s);
}

fn v_slice(at : KVRow, s : u32) -> mat4x4<f32> {
  return kv_slice(true, at, s);
}

fn dot16(a : mat4x4<f32>, b : mat4x4<f32>) -> f32 {
  return dot(a[0], b[0]) + dot(a[1], b[1]) + dot(a[2], b[2]) + dot(a[3], b[3]);
}
