// F32 weights (model/layout.py: little-endian f32, row-major) for the float kernels, the first part of
// matvec[_gpu[_sg]]_f32, matmul_f32 and embedding_f32 (shader_variants.py).

alias Word4 = vec4<u32>;  // weights 4m..4m+3
struct Group8 {  // weights 8k..8k+7 (matmul_float.wgsl's qs elements)
  lo : vec4<u32>,
  hi : vec4<u32>,
}
const CODE_WORDS_PER_BLOCK : u32 = 8u;  // vec4<u32> words per 32 weights
const X_PER_WORD : u32 = 1u;  // activation vec4s one vec4<u32> word meets

fn weights4(w : Word4) -> vec4<f32> {
  return bitcast<vec4<f32>>(w);
}

fn word_weights(w : vec4<u32>, _h : u32) -> vec4<f32> {
  return bitcast<vec4<f32>>(w);
}

fn group_lo(g : Group8) -> vec4<f32> {
  return bitcast<vec4<f32>>(g.lo);
}

fn group_hi(g : Group8) -> vec4<f32> {
  return bitcast<vec4<f32>>(g.hi);
}
