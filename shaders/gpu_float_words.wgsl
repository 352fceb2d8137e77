// One vec4<u32> word of float weights for the gpu-family matvec (composed after float_weights.wgsl by
// shader_variants.py): 8 f16 / bf16 weights (2 activation vec4s) or 4 f32.

override WORKGROUP_SIZE : u32 = 64u;
const X_IN_F16 : bool = false;  // f32 activations (matvec_gpu_main.wgsl's NORM scales after the sums)
const WORDS_PER_BLOCK : u32 = CODE_WORDS_PER_BLOCK;

// Word c of block i (row * cols/32 + b) against its activations u0 and u1 (u1 unused for f32).
fn word_dot(i : u32, c : u32, u0 : vec4<f32>, u1 : vec4<f32>) -> f32 {
  let w = qs[i * WORDS_PER_BLOCK + c];
  if (X_PER_WORD == 1u) {
    return dot(word_weights(w, 0u), u0);
  }
  return dot(word_weights(w, 0u), u0) + dot(word_weights(w, 1u), u1);
}
