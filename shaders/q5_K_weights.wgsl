// Q5_K scales and high bits for the nibble-coded kernels (matvec_q5_K, matvec_gpu[_sg]_q5_K, matmul_q5_K),
// their first part (shader_variants.py): as Q4_K, q = nibble + 16 * high bit.

@group(0) @binding(1) var<storage, read> sc : array<vec4<u32>>;  // (rows, cols/256, 3): Q4_K's 4 words, 8 high-bit words

const HIGH_BITS : u32 = 1u;

fn scales(i : u32) -> BlockScale {
  let s = 3u * (i >> 3u);
  let j = i & 7u;
  let am = k_scale_min(sc[s], j);
  return BlockScale(vec2<f32>(am.x), vec2<f32>(-am.y), sc[s + 1u + (j >> 2u)][j & 3u], 0u);
}
