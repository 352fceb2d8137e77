// gpu_q8_0_words.wgsl's word_dot in f16 arithmetic, for devices with `shader-f16` (composed after
// q8_0_weights.wgsl by shader_variants.py, which starts the kernel with `enable f16;`).
// The codes enter as q / 127 (|.| <= 1, rounded to f16), so a word's dot product stays below 4 |x|.

override WORKGROUP_SIZE : u32 = 64u;
// The activations enter the dot products as f16: matvec_gpu_main.wgsl's NORM scales them by 1 / rms before
// the cast (the raw residual x gain passes 65,504 with outliers of a few thousand).
const X_IN_F16 : bool = true;
const WORDS_PER_BLOCK : u32 = 8u;
const X_PER_WORD : u32 = 1u;

// Word c of block i (row * cols/32 + b) against its activations u0 (u1 unused).
fn word_dot(i : u32, c : u32, u0 : vec4<f32>, u1 : vec4<f32>) -> f32 {
  return block_scale(i) * f32(dot(vec4<f16>(codes(qs[2u * i + c / 4u][c % 4u])), vec4<f16>(u0)));
}
