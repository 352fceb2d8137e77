// y = W @ x for a few token vectors (decode), W in the repacked Q4_1 layout of
// py/pagedkv/model/layout.py, dequantization fused, f32 accumulation.
// SwiftShader turns every storage load with a run-time index into a masked per-lane
// gather of each scalar, so loads are costly: one thread computes ROWS = 8 output rows of
// one token (gid.y), loading each activation once for all 8 rows and each 32-weight
// block as one vec4<u32> of nibbles + one u32 of f16 (d, m). No workgroup barriers
// and no private arrays (both are slow there). Per block, with w = d q + m:
// sum_j w_j x_j = d * dot(q, x) + m * sum(x). Rows past the end are clamped and not written.
// Nibble p of a word is taken by MASK only, as q * 16^p, and the activation it meets is
// pre-scaled by 16^-p once per block for all 8 rows: the products are bit-identical to
// q * x (power-of-two scaling is exact) and the per-weight shift is gone.

//#include q4_1_weights.wgsl

override WORKGROUP_SIZE : u32 = 32u;

// One row's contribution from block i: the block's 32 activations, pre-scaled, are x0..x7; sx is their sum.
fn block(i : u32, x0 : vec4<f32>, x1 : vec4<f32>, x2 : vec4<f32>, x3 : vec4<f32>,
         x4 : vec4<f32>, x5 : vec4<f32>, x6 : vec4<f32>, x7 : vec4<f32>, sx : f32) -> f32 {
  let q = qs[i];
  let s = unpack2x16float(dm[i]);  // (d, m)
  let qx = dot(nibbles_lo(q.x), x0) + dot(nibbles_hi(q.x), x1) + dot(nibbles_lo(q.y), x2) + dot(nibbles_hi(q.y), x3)
         + dot(nibbles_lo(q.z), x4) + dot(nibbles_hi(q.z), x5) + dot(nibbles_lo(q.w), x6) + dot(nibbles_hi(q.w), x7);
  return s.x * qx + s.y * sx;
}

// u0..u7: the block's activations; their sum and the 16^-p pre-scaled copies serve all 8 rows.
fn block_rows(lo_i : vec4<u32>, hi_i : vec4<u32>, u0 : vec4<f32>, u1 : vec4<f32>, u2 : vec4<f32>,
              u3 : vec4<f32>, u4 : vec4<f32>, u5 : vec4<f32>, u6 : vec4<f32>, u7 : vec4<f32>) -> Rows8 {
  let sx = dot((u0 + u1) + (u2 + u3) + (u4 + u5) + (u6 + u7), vec4<f32>(1.0));
  let x0 = u0 * SCALE_LO;
  let x1 = u1 * SCALE_HI;
  let x2 = u2 * SCALE_LO;
  let x3 = u3 * SCALE_HI;
  let x4 = u4 * SCALE_LO;
  let x5 = u5 * SCALE_HI;
  let x6 = u6 * SCALE_LO;
  let x7 = u7 * SCALE_HI;
  return Rows8(
    vec4<f32>(block(lo_i.x, x0, x1, x2, x3, x4, x5, x6, x7, sx), block(lo_i.y, x0, x1, x2, x3, x4, x5, x6, x7, sx),
              block(lo_i.z, x0, x1, x2, x3, x4, x5, x6, x7, sx), block(lo_i.w, x0, x1, x2, x3, x4, x5, x6, x7, sx)),
    vec4<f32>(block(hi_i.x, x0, x1, x2, x3, x4, x5, x6, x7, sx), block(hi_i.y, x0, x1, x2, x3, x4, x5, x6, x7, sx),
              block(hi_i.z, x0, x1, x2, x3, x4, x5, x6, x7, sx), block(hi_i.w, x0, x1, x2, x3, x4, x5, x6, x7, sx)));
}

//#include matvec_main.wgsl
