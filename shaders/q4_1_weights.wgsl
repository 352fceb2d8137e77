// The Q4_1 weight bindings and nibble decoding shared by matvec_q4_1.wgsl (cpu family) and
// matvec_gpu*_q4_1.wgsl (gpu family), expanded at their `//#include q4_1_weights.wgsl` line.

@group(0) @binding(0) var<storage, read> qs : array<vec4<u32>>;  // (rows, cols/32): 32 nibbles per vec4
@group(0) @binding(1) var<storage, read> dm : array<u32>;        // (rows, cols/32): f16 d | f16 m << 16
@group(0) @binding(2) var<storage, read> x : array<vec4<f32>>;   // (tokens, cols/4)
@group(0) @binding(3) var<storage, read_write> y : array<f32>;   // (tokens, rows)

const CODE_WORDS_PER_BLOCK : u32 = 1u;  // vec4<u32> words of codes per 32-weight block
//#include matvec_norm.wgsl
//#include quant_epilogue.wgsl

// Weights 8w..8w+3 (lo) and 8w+4..8w+7 (hi) of one nibble word, each as q * 16^p (p = nibble position).
fn nibbles_lo(w : u32) -> vec4<f32> {
  return vec4<f32>(vec4<u32>(w) & vec4<u32>(0xFu, 0xF0u, 0xF00u, 0xF000u));
}

fn nibbles_hi(w : u32) -> vec4<f32> {
  return vec4<f32>(vec4<u32>(w) & vec4<u32>(0xF0000u, 0xF00000u, 0xF000000u, 0xF0000000u));
}

const SCALE_LO = vec4<f32>(1.0, 0.0625, 0.00390625, 0.000244140625);  // 16^-p, p = 0..3
const SCALE_HI = vec4<f32>(1.52587890625e-05, 9.5367431640625e-07, 5.9604644775390625e-08, 3.725290298461914e-09);

