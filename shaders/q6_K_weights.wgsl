// Q6_K scales and high bits for the nibble-coded kernels (matvec_q6_K, matvec_gpu[_sg]_q6_K, matmul_q6_K),
// their first part (shader_variants.py): group g of 16 weights has w = (d * s_g) * (q - 32),
// q = nibble + 16 * its two high bits; a 32-weight block i holds groups 2 (i % 8) and 2 (i % 8) + 1.

@group(0) @binding(1) var<storage, read> sc : array<u32>;  // (rows, cols/256, 21): 16 high-bit words, 4 of scales, d

const HIGH_BITS : u32 = 2u;

fn scales(i : u32) -> BlockScale {
  let base = 21u * (i >> 3u);
  let j = i & 7u;
  let d = unpack2x16float(sc[base + 20u]).x;
  let w = sc[base + 16u + (j >> 1u)];
  let k = 2u * (j & 1u);
  let a = vec2<f32>(d * sbyte(w, k), d * sbyte(w, k + 1u));
  return BlockScale(a, -32.0 * a, sc[base + 2u * j], sc[base + 2u * j + 1u]);
}
