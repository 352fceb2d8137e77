// One u32 word of Q4_1 codes for the gpu-family kernels (composed after q4_1_weights.wgsl by
// shader_variants.py): 8 weights, 2 activation vec4s; the gpu-family matvec reads word_dot, the
// matmul word_weights.

override WORKGROUP_SIZE : u32 = 64u;
const X_IN_F16 : bool = false;  // f32 activations (matvec_gpu_main.wgsl's NORM scales after the sums)
const WORDS_PER_BLOCK : u32 = 4u;
const X_PER_WORD : u32 = 2u;

// Word c of block i (row * cols/32 + b) against its activations u0, u1: d * dot(q, u) + m * sum(u).
fn word_dot(i : u32, c : u32, u0 : vec4<f32>, u1 : vec4<f32>) -> f32 {
  let q = qs[i][c];
  let s = unpack2x16float(dm[i]);  // (d, m)
  return s.x * (dot(nibbles_lo(q), u0 * SCALE_LO) + dot(nibbles_hi(q), u1 * SCALE_HI)) + s.y * dot(u0 + u1, vec4<f32>(1.0));
}

// Word c of block i dequantized: weights 8c..8c+3 and 8c+4..8c+7, d * q + m.
fn word_weights(i : u32, c : u32) -> mat2x4<f32> {
  let q = qs[i][c];
  let s = unpack2x16float(dm[i]);  // (d, m)
  return mat2x4<f32>(s.x * SCALE_LO * nibbles_lo(q) + s.y, s.x * SCALE_HI * nibbles_hi(q) + s.y);
}
