// Q5_0 scales and high bits for the nibble-coded kernels (matvec_q5_0, matvec_gpu[_sg]_q5_0, matmul_q5_0),
// their first part (shader_variants.py): w = d * (q - 16), q = nibble + 16 * high bit.

@group(0) @binding(1) var<storage, read> dh : array<vec2<u32>>;  // (rows, cols/32): f16 d, the 32 high bits

const HIGH_BITS : u32 = 1u;

fn scales(i : u32) -> BlockScale {
  let e = dh[i];
  let s = unpack2x16float(e.x).x;
  return BlockScale(vec2<f32>(s), vec2<f32>(-16.0 * s), e.y, 0u);
}
