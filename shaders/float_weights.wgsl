// The bindings of the float matvec kernels (f32, f16, bf16 weights; both families), after <type>_words.wgsl
// (included by matvec_float.wgsl; a part of the gpu family's variants, shader_variants.py). A float matrix
// is one part, so params sits at binding 3 (the quantized kernels' at 4, after their scales part).

@group(0) @binding(0) var<storage, read> qs : array<vec4<u32>>;  // (rows, cols) weights, then the NORM weight
@group(0) @binding(1) var<storage, read> x : array<vec4<f32>>;   // (tokens, cols/4)
@group(0) @binding(2) var<storage, read_write> y : array<f32>;   // (tokens, rows)
@group(0) @binding(3) var<uniform> params : Params;

//#include matvec_gain.wgsl
//#include quant_epilogue.wgsl

// Weights 4m..4m+3 of 32-weight block i (row * cols/32 + b).
fn block_weights(i : u32, m : u32) -> vec4<f32> {
  return word_weights(qs[i * CODE_WORDS_PER_BLOCK + m / X_PER_WORD], m % X_PER_WORD);
}
