// The bindings of the matvec kernels (both families) of every nibble-coded weight type but Q4_1 (composed
// after <type>_weights.wgsl, which binds the scales at binding 1, by shader_variants.py).

@group(0) @binding(0) var<storage, read> qs : array<vec4<u32>>;  // (rows, cols/32): 32 nibbles per vec4
@group(0) @binding(2) var<storage, read> x : array<vec4<f32>>;   // (tokens, cols/4)
@group(0) @binding(3) var<storage, read_write> y : array<f32>;   // (tokens, rows)

const CODE_WORDS_PER_BLOCK : u32 = 1u;  // vec4<u32> words of codes per 32-weight block
//#include matvec_norm.wgsl
//#include quant_epilogue.wgsl
//#include nibble_codes.wgsl
