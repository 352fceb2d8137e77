// The cpu-family matmul of the nibble-coded weight types but Q4_1 (matmul_<type>, composed after
// <type>_weights.wgsl by shader_variants.py): matmul_main.wgsl's 8-row x 4-token register tile,
// each weight dequantized once for 4 tokens as a * q + m (nibbles.wgsl's BlockScale of its block).

struct Params {
  rows : u32,
  cols : u32,     // multiple of the type's block
  tokens : u32,
  _pad : u32,
}

@group(0) @binding(0) var<storage, read> qs : array<u32>;        // (rows, cols/8): 8 nibbles per word
@group(0) @binding(2) var<storage, read> x : array<vec4<f32>>;   // (tokens, cols/4)
@group(0) @binding(3) var<storage, read_write> y : array<f32>;   // (tokens, rows)
@group(0) @binding(4) var<uniform> params : Params;

override WORKGROUP_SIZE : u32 = 32u;
//#include quant_epilogue.wgsl
//#include nibble_codes.wgsl

fn scale_of(i : u32) -> BlockScale {
  return scales(i);
}

fn dequant_lo(w : u32, s : BlockScale, k : u32) -> vec4<f32> {
  return dequant(nibbles_lo(w), SCALE_LO, s, k, 0u);
}

fn dequant_hi(w : u32, s : BlockScale, k : u32) -> vec4<f32> {
  return dequant(nibbles_hi(w), SCALE_HI, s, k, 1u);
}

//#include matmul_main.wgsl
