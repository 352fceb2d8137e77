// Q4_0 scales for the nibble-coded kernels (matvec_q4_0, matvec_gpu[_sg]_q4_0, matmul_q4_0), their first part
// (shader_variants.py): w = d * (q - 8) = d * q - 8 d.

@group(0) @binding(1) var<storage, read> d : array<u32>;  // (rows * cols/32) f16 scales, two per u32

const HIGH_BITS : u32 = 0u;

fn scales(i : u32) -> BlockScale {
  let pair = unpack2x16float(d[i >> 1u]);
  let s = select(pair.x, pair.y, (i & 1u) == 1u);
  return BlockScale(vec2<f32>(s), vec2<f32>(-8.0 * s), 0u, 0u);
}
