// Y = X @ W^T for many tokens (prefill), W in the repacked Q8_0 layout of
// py/pagedkv/model/layout.py, dequantization fused, f32 accumulation.
// Same register tiling as matmul_q4_1.wgsl: an 8-row x 4-token output tile per
// thread in named registers, no workgroup barriers, no private arrays.
// Rows / tokens past the end are clamped, never written.

struct Params {
  rows : u32,
  cols : u32,     // multiple of 32
  tokens : u32,
  _pad : u32,
}

@group(0) @binding(0) var<storage, read> qs : array<vec2<u32>>;  // (rows, cols/8): 8 int8 codes per vec2
@group(0) @binding(1) var<storage, read> d : array<u32>;         // (rows * cols/32) f16 scales, two per u32
@group(0) @binding(2) var<storage, read> x : array<vec4<f32>>;   // (tokens, cols/4)
@group(0) @binding(3) var<storage, read_write> y : array<f32>;   // (tokens, rows)
@group(0) @binding(4) var<uniform> params : Params;

override WORKGROUP_SIZE : u32 = 32u;
//#include quant_epilogue.wgsl

// The four little-endian int8 codes q of one word as q / 127 (one builtin, far cheaper on
// SwiftShader than shift / shift / convert); the block scale carries the factor 127 back.
// Right (to f32 rounding of q / 127) for q in [-127, 127], every code Q8_0 quantization
// writes (scale amax / 127); -128 would read as -127, so model_kernels.check_q8_0_codes refuses weights containing it.
fn codes(w : u32) -> vec4<f32> {
  return unpack4x8snorm(w);
}

fn scale_of(i : u32) -> f32 {
  let pair = unpack2x16float(d[i >> 1u]);
  return 127.0 * select(pair.x, pair.y, (i & 1u) == 1u);
}

// Weights 8k..8k+3 (lo) and 8k+4..8k+7 (hi) of code pair w, dequantized: scale * q.
fn dequant_lo(w : vec2<u32>, s : f32, _k : u32) -> vec4<f32> {
  return s * codes(w.x);
}

fn dequant_hi(w : vec2<u32>, s : f32, _k : u32) -> vec4<f32> {
  return s * codes(w.y);
}

//#include matmul_main.wgsl
