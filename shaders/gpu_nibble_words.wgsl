// One u32 word of nibble codes for the gpu-family matvec of the nibble-coded weight types (composed after
// <type>_weights.wgsl and nibble_io.wgsl by shader_variants.py): 8 weights,
// 2 activation vec4s.

override WORKGROUP_SIZE : u32 = 64u;
const X_IN_F16 : bool = false;  // f32 activations (matvec_gpu_main.wgsl's NORM scales after the sums)
const WORDS_PER_BLOCK : u32 = 4u;
const X_PER_WORD : u32 = 2u;

// Word c of block i (row * cols/32 + b) against its activations u0, u1 (weights 8c..8c+3, 8c+4..8c+7).
fn word_dot(i : u32, c : u32, u0 : vec4<f32>, u1 : vec4<f32>) -> f32 {
  let b = scales(i);
  let upper = c >> 1u;
  let q = qs[i][c];
  var t = dot(nibbles_lo(q), u0 * SCALE_LO) + dot(nibbles_hi(q), u1 * SCALE_HI);
  if (HIGH_BITS == 1u) {
    t += 16.0 * (dot(bits4(b.h0, 2u * c), u0 * BIT_SCALE) + dot(bits4(b.h0, 2u * c + 1u), u1 * BIT_SCALE));
  } else if (HIGH_BITS == 2u) {
    let h = select(b.h0, b.h1, upper == 1u);
    let m = 2u * (c & 1u);
    t += 16.0 * (dot(pairs4(h, m), u0 * PAIR_SCALE) + dot(pairs4(h, m + 1u), u1 * PAIR_SCALE));
  }
  return select(b.a.x, b.a.y, upper == 1u) * t + select(b.m.x, b.m.y, upper == 1u) * dot(u0 + u1, vec4<f32>(1.0));
}

// Word c of block i dequantized for the gpu-family matmul (matmul_gpu_main.wgsl): weights 8c..8c+3 and
// 8c+4..8c+7, a * q + m with q's high bits (nibble_codes.wgsl's dequant), the block's scales decoded once per word.
fn word_weights(i : u32, c : u32) -> mat2x4<f32> {
  let s = scales(i);
  let q = qs[i][c];
  return mat2x4<f32>(dequant(nibbles_lo(q), SCALE_LO, s, c, 0u), dequant(nibbles_hi(q), SCALE_HI, s, c, 1u));
}
