// Q4_1 scales in the form of the nibble-coded types' <type>_weights.wgsl (for embedding_q4_1; the Q4_1
// matvec / matmul kernels have their own decoding): w = d * q + m.

@group(0) @binding(1) var<storage, read> dm : array<u32>;  // (rows, cols/32): f16 d | f16 m << 16

const HIGH_BITS : u32 = 0u;

fn scales(i : u32) -> BlockScale {
  let s = unpack2x16float(dm[i]);
  return BlockScale(vec2<f32>(s.x), vec2<f32>(s.y), 0u, 0u);
}
