// Y = X @ W^T for many tokens (prefill), W in the repacked Q4_1 layout of
// py/pagedkv/model/layout.py, dequantization fused, f32 accumulation.
// Register tiling rather than workgroup tiling: each thread owns an 8-row x 4-token
// output tile, dequantizes each weight once for 4 tokens and loads each activation
// once for 8 rows. SwiftShader (CPU) runs workgroup barriers and private arrays
// slowly and its workgroup memory is CPU cache like everything else, so the tile
// lives in named registers. Rows / tokens past the end are clamped, never written.
// Nibble p of a word is taken by MASK only, as q * 16^p, and dequantized with d * 16^-p
// (computed once per block and row): bit-identical to d * q, without a per-weight shift.

struct Params {
  rows : u32,
  cols : u32,     // multiple of 32
  tokens : u32,
  _pad : u32,
}

@group(0) @binding(0) var<storage, read> qs : array<u32>;        // (rows, cols/8): 8 nibbles per word
@group(0) @binding(1) var<storage, read> dm : array<u32>;        // (rows, cols/32): f16 d | f16 m << 16
@group(0) @binding(2) var<storage, read> x : array<vec4<f32>>;   // (tokens, cols/4)
@group(0) @binding(3) var<storage, read_write> y : array<f32>;   // (tokens, rows)
@group(0) @binding(4) var<uniform> params : Params;

override WORKGROUP_SIZE : u32 = 32u;
//#include quant_epilogue.wgsl

const SCALE_LO = vec4<f32>(1.0, 0.0625, 0.00390625, 0.000244140625);  // 16^-p, p = 0..3
const SCALE_HI = vec4<f32>(1.52587890625e-05, 9.5367431640625e-07, 5.9604644775390625e-08, 3.725290298461914e-09);

// Per-position scales of one block: d * 16^-p for the lo and hi halves of a word, and m.
struct BlockScale {
  lo : vec4<f32>,
  hi : vec4<f32>,
  m : f32,
}

fn scale_of(i : u32) -> BlockScale {
  let s = unpack2x16float(dm[i]);  // (d, m)
  return BlockScale(s.x * SCALE_LO, s.x * SCALE_HI, s.y);
}

// Weights 8k..8k+3 (lo) and 8k+4..8k+7 (hi) of nibble word w, dequantized: d * q + m.
fn dequant_lo(w : u32, s : BlockScale, _k : u32) -> vec4<f32> {
  return s.lo * vec4<f32>(vec4<u32>(w) & vec4<u32>(0xFu, 0xF0u, 0xF00u, 0xF000u)) + s.m;
}

fn dequant_hi(w : u32, s : BlockScale, _k : u32) -> vec4<f32> {
  return s.hi * vec4<f32>(vec4<u32>(w) & vec4<u32>(0xF0000u, 0xF00000u, 0xF000000u, 0xF0000000u)) + s.m;
}

//#include matmul_main.wgsl
