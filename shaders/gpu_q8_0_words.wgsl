// One u32 word of Q8_0 codes for the gpu-family kernels (composed after q8_0_weights.wgsl by
// shader_variants.py): 4 weights, 1 activation vec4; the gpu-family matvec reads word_dot, the
// matmul word_weights.

override WORKGROUP_SIZE : u32 = 64u;
const X_IN_F16 : bool = false;  // f32 activations (matvec_gpu_main.wgsl's NORM scales after the sums)
const WORDS_PER_BLOCK : u32 = 8u;
const X_PER_WORD : u32 = 1u;

// Word c of block i (row * cols/32 + b) against its activations u0 (u1 unused).
fn word_dot(i : u32, c : u32, u0 : vec4<f32>, u1 : vec4<f32>) -> f32 {
  return block_scale(i) * dot(codes(qs[2u * i + c / 4u][c % 4u]), u0);
}

// Word c of block i dequantized: weights 4c..4c+3 (the second column unused).
fn word_weights(i : u32, c : u32) -> mat2x4<f32> {
  return mat2x4<f32>(block_scale(i) * codes(qs[2u * i + c / 4u][c % 4u]), vec4<f32>(0.0));
}
