// gpu_q8_0_words.wgsl's word_dot in f16 arithmetic, for devices with `shader-f16` (composed after
// q8_0_weights.wgsl by shader_variants.py, which starts the kernel with `enable f16;`).
// The codes enter as q / 127 (|.| <= 1, rounded to f16), so a word's dot product stays below 4 |x|; a word
// whose largest |x| reaches 4,096 enters scaled (f16_word_scale.wgsl: cast raw, 4 activations past 16,400
// overflowed 65,504).
override WORKGROUP_SIZE : u32 = 64u;
// The activations enter the dot products as f16: matvec_gpu_main.wgsl's NORM scales them by 1 / rms before
// the cast too (its f32 sum of squares cannot wait for the word's scale).
const X_IN_F16 : bool = true;
const WORDS_PER_BLOCK : u32 = 8u;
const X_PER_WORD : u32 = 1u;

//#include f16_word_scale.wgsl

// Word c of block i (row * cols/32 + b) against its activations u0 (u1 unused).
fn word_dot(i : u32, c : u32, u0 : vec4<f32>, u1 : vec4<f32>) -> f32 {
  let a = abs(u0);
  let e = big_word_exponent(max(max(a.x, a.y), max(a.z, a.w)));
  let x = vec4<f16>(u0 * ldexp(1.0, -e));
  return ldexp(block_scale(i) * f32(dot(vec4<f16>(codes(qs[2u * i + c / 4u][c % 4u])), x)), e);
}
