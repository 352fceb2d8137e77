// Y = X @ W^T for many tokens (prefill), W f32 / f16 / bf16 (matmul_f32 / matmul_f16 / matmul_bf16,
// composed after <type>_words.wgsl by shader_variants.py): matmul_main.wgsl's
// 8-row x 4-token register tiles, weights converted to f32, f32 accumulation. One weights part, so
// params sits at binding 3.

struct Params {
  rows : u32,
  cols : u32,     // multiple of 32
  tokens : u32,
  _pad : u32,
}

@group(0) @binding(0) var<storage, read> qs : array<Group8>;    // (rows, cols/8)
@group(0) @binding(1) var<storage, read> x : array<vec4<f32>>;  // (tokens, cols/4)
@group(0) @binding(2) var<storage, read_write> y : array<f32>;  // (tokens, rows)
@group(0) @binding(3) var<uniform> params : Params;

override WORKGROUP_SIZE : u32 = 32u;
//#include quant_epilogue.wgsl

fn scale_of(_i : u32) -> f32 {
  return 1.0;  // float weights have no block scales
}

fn dequant_lo(g : Group8, _s : f32, _k : u32) -> vec4<f32> {
  return group_lo(g);
}

fn dequant_hi(g : Group8, _s : f32, _k : u32) -> vec4<f32> {
  return group_hi(g);
}

//#include matmul_main.wgsl
