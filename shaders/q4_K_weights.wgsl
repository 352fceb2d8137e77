// Q4_K scales for the nibble-coded kernels (matvec_q4_K, matvec_gpu[_sg]_q4_K, matmul_q4_K), their first part
// (shader_variants.py): sub-block j of 32 (block i = row * cols/32 + b, j = i % 8) of
// super-block i / 8 has w = (d * sc_j) * q - dmin * m_j.

@group(0) @binding(1) var<storage, read> sc : array<vec4<u32>>;  // (rows, cols/256): d | dmin << 16, 12 scale bytes

const HIGH_BITS : u32 = 0u;

fn scales(i : u32) -> BlockScale {
  let am = k_scale_min(sc[i >> 3u], i & 7u);
  return BlockScale(vec2<f32>(am.x), vec2<f32>(-am.y), 0u, 0u);
}
