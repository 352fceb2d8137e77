// Nibble decoding shared by every weight type whose codes sit in 4-bit nibbles (layout.py's "qs" part: weight
// k of a row at bits 4 (k % 8) of word k / 8); expanded at `//#include nibbles.wgsl` lines (q4_1_weights.wgsl,
// nibble_codes.wgsl). Bits are taken by MASK only, as
// q * 2^(b p) for position p of a vec4, and the activation they meet is pre-scaled by 2^(-b p) once per
// block for all rows: the products are bit-identical to q * x (power-of-two scaling is exact) and the
// per-weight shift is gone (SwiftShader pays for every shift).

// Weights 8w..8w+3 (lo) and 8w+4..8w+7 (hi) of one nibble word, each as q * 16^p (p = nibble position).
fn nibbles_lo(w : u32) -> vec4<f32> {
  return vec4<f32>(vec4<u32>(w) & vec4<u32>(0xFu, 0xF0u, 0xF00u, 0xF000u));
}

fn nibbles_hi(w : u32) -> vec4<f32> {
  return vec4<f32>(vec4<u32>(w) & vec4<u32>(0xF0000u, 0xF00000u, 0xF000000u, 0xF0000000u));
}

const SCALE_LO = vec4<f32>(1.0, 0.0625, 0.00390625, 0.000244140625);  // 16^-p, p = 0..3
const SCALE_HI = vec4<f32>(1.52587890625e-05, 9.5367431640625e-07, 5.9604644775390625e-08, 3.725290298461914e-09);
