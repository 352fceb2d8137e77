// Q5_1 scales and high bits for the nibble-coded kernels (matvec_q5_1, matvec_gpu[_sg]_q5_1, matmul_q5_1),
// their first part (shader_variants.py): w = d * q + m, q = nibble + 16 * high bit.

@group(0) @binding(1) var<storage, read> dh : array<vec2<u32>>;  // (rows, cols/32): f16 d | f16 m << 16, high bits

const HIGH_BITS : u32 = 1u;

fn scales(i : u32) -> BlockScale {
  let e = dh[i];
  let s = unpack2x16float(e.x);
  return BlockScale(vec2<f32>(s.x), vec2<f32>(s.y), e.y, 0u);
}
