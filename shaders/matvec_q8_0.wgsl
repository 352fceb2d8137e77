// y = W @ x for a few token vectors (decode, the LM head), W in the repacked Q8_0
// layout of py/pagedkv/model/layout.py, dequantization fused, f32 accumulation.
// SwiftShader turns every storage load with a run-time index into a masked per-lane
// gather of each scalar, so loads are costly: one thread computes ROWS = 8 output rows of
// one token (gid.y), loading each activation once for all 8 rows and each 32-weight
// block as two vec4<u32> of int8 codes + one f16 scale. No workgroup barriers and
// no private arrays (both are slow there). Rows past the end are clamped and not written.

//#include q8_0_weights.wgsl

override WORKGROUP_SIZE : u32 = 32u;

// One row's contribution from block i (row * cols/32 + b): its 32 activations are x0..x7.
fn block(i : u32, x0 : vec4<f32>, x1 : vec4<f32>, x2 : vec4<f32>, x3 : vec4<f32>,
         x4 : vec4<f32>, x5 : vec4<f32>, x6 : vec4<f32>, x7 : vec4<f32>) -> f32 {
  let qa = qs[2u * i];
  let qb = qs[2u * i + 1u];
  let pair = unpack2x16float(d[i >> 1u]);
  let scale = 127.0 * select(pair.x, pair.y, (i & 1u) == 1u);
  let qx = dot(codes(qa.x), x0) + dot(codes(qa.y), x1) + dot(codes(qa.z), x2) + dot(codes(qa.w), x3)
         + dot(codes(qb.x), x4) + dot(codes(qb.y), x5) + dot(codes(qb.z), x6) + dot(codes(qb.w), x7);
  return scale * qx;
}

//#include matvec_block_rows.wgsl

//#include matvec_main.wgsl
