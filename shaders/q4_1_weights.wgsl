// The Q4_1 weight bindings and nibble decoding shared by matvec_q4_1.wgsl (cpu family) and
// matvec_gpu*_q4_1 / matmul_gpu_q4_1 (gpu family, shader_variants.py), their first part.

@group(0) @binding(0) var<storage, read> qs : array<vec4<u32>>;  // (rows, cols/32): 32 nibbles per vec4
@group(0) @binding(1) var<storage, read> dm : array<u32>;        // (rows, cols/32): f16 d | f16 m << 16
@group(0) @binding(2) var<storage, read> x : array<vec4<f32>>;   // (tokens, cols/4)
@group(0) @binding(3) var<storage, read_write> y : array<f32>;   // (tokens, rows)

const CODE_WORDS_PER_BLOCK : u32 = 1u;  // vec4<u32> words of codes per 32-weight block
//#include matvec_norm.wgsl
//#include quant_epilogue.wgsl

//#include nibbles.wgsl
