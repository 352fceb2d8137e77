// gpu_q4_1_words.wgsl's word_dot in f16 arithmetic, for devices with `shader-f16` (composed after
// q4_1_weights.wgsl by shader_variants.py, which starts the kernel with `enable f16;`).
// The nibbles enter as q / 16 (exact in f16), so a word's dot products stay below 8 |x|; a word whose largest
// |x| reaches 4,096 enters scaled (f16_word_scale.wgsl: cast raw, 8 activations past 8,190 overflowed 65,504 in
// the m * sum(x) term, where a down projection's outliers reach). The scales and the sum over words stay f32.

override WORKGROUP_SIZE : u32 = 64u;
// The activations enter the dot products as f16: matvec_gpu_main.wgsl's NORM scales them by 1 / rms before
// the cast too (its f32 sum of squares cannot wait for the word's scale).
const X_IN_F16 : bool = true;
const WORDS_PER_BLOCK : u32 = 4u;
const X_PER_WORD : u32 = 2u;

//#include f16_word_scale.wgsl

// Word c of block i (row * cols/32 + b) against its activations u0, u1: d * dot(q, u) + m * sum(u).
fn word_dot(i : u32, c : u32, u0 : vec4<f32>, u1 : vec4<f32>) -> f32 {
  let q = vec4<u32>(qs[i][c]);
  let lo = vec4<f16>((q >> vec4<u32>(0u, 4u, 8u, 12u)) & vec4<u32>(0xFu)) * 0.0625h;
  let hi = vec4<f16>((q >> vec4<u32>(16u, 20u, 24u, 28u)) & vec4<u32>(0xFu)) * 0.0625h;
  let a = max(abs(u0), abs(u1));
  let e = big_word_exponent(max(max(a.x, a.y), max(a.z, a.w)));
  let x0 = vec4<f16>(u0 * ldexp(1.0, -e));
  let x1 = vec4<f16>(u1 * ldexp(1.0, -e));
  let s = unpack2x16float(dm[i]);  // (d, m)
  return ldexp(16.0 * s.x * f32(dot(lo, x0) + dot(hi, x1)) + s.y * f32(dot(x0 + x1, vec4<f16>(1.0h))), e);
}
