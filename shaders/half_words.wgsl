// What the f16 and bf16 weights share (expanded at the `//#include half_words.wgsl` line of f16_words.wgsl /
// bf16_words.wgsl, which define weights4 of a Word4): two weights per u32, 8 per vec4<u32> word.

alias Word4 = vec2<u32>;  // weights 4m..4m+3
alias Group8 = vec4<u32>;  // weights 8k..8k+7 (matmul_float.wgsl's qs elements)
const CODE_WORDS_PER_BLOCK : u32 = 4u;  // vec4<u32> words per 32 weights
const X_PER_WORD : u32 = 2u;  // activation vec4s one vec4<u32> word meets

// Weights 4h..4h+3 (h = 0 or 1) of vec4<u32> word w.
fn word_weights(w : vec4<u32>, h : u32) -> vec4<f32> {
  return weights4(select(w.xy, w.zw, h == 1u));
}

fn group_lo(g : Group8) -> vec4<f32> {
  return weights4(g.xy);
}

fn group_hi(g : Group8) -> vec4<f32> {
  return weights4(g.zw);
}
