// The Q8_0 weight bindings and code decoding shared by matvec_q8_0.wgsl (cpu family) and
// matvec_gpu*_q8_0 / matmul_gpu_q8_0 (gpu family, shader_variants.py), their first part.

@group(0) @binding(0) var<storage, read> qs : array<vec4<u32>>;  // (rows, cols/32, 2): 16 int8 codes per vec4
@group(0) @binding(1) var<storage, read> d : array<u32>;         // (rows * cols/32) f16 scales, two per u32
@group(0) @binding(2) var<storage, read> x : array<vec4<f32>>;   // (tokens, cols/4)
@group(0) @binding(3) var<storage, read_write> y : array<f32>;   // (tokens, rows)

const CODE_WORDS_PER_BLOCK : u32 = 2u;  // vec4<u32> words of codes per 32-weight block
//#include matvec_norm.wgsl
//#include quant_epilogue.wgsl

// The four little-endian int8 codes q of one word as q / 127 (one builtin, far cheaper on
// SwiftShader than shift / shift / convert); the block scale carries the factor 127 back.
// Right (to f32 rounding of q / 127) for q in [-127, 127], every code Q8_0 quantization
// writes (scale amax / 127); -128 would read as -127, so model_kernels.check_q8_0_codes refuses weights containing it.
fn codes(w : u32) -> vec4<f32> {
  return unpack4x8snorm(w);
}

// The scale of block i times 127 (codes() returns q / 127).
fn block_scale(i : u32) -> f32 {
  let pair = unpack2x16float(d[i >> 1u]);
  return 127.0 * select(pair.x, pair.y, (i & 1u) == 1u);
}
