// block_rows() of the matvec kernels whose block(i, x0..x7) needs nothing but the block's activations
// (matvec_q8_0.wgsl, matvec_float.wgsl; expanded at their `//#include matvec_block_rows.wgsl` line): the
// 8 rows' dot products with one 32-weight block, for matvec_main.wgsl.

fn block_rows(lo_i : vec4<u32>, hi_i : vec4<u32>, x0 : vec4<f32>, x1 : vec4<f32>, x2 : vec4<f32>,
              x3 : vec4<f32>, x4 : vec4<f32>, x5 : vec4<f32>, x6 : vec4<f32>, x7 : vec4<f32>) -> Rows8 {
  return Rows8(
    vec4<f32>(block(lo_i.x, x0, x1, x2, x3, x4, x5, x6, x7), block(lo_i.y, x0, x1, x2, x3, x4, x5, x6, x7),
              block(lo_i.z, x0, x1, x2, x3, x4, x5, x6, x7), block(lo_i.w, x0, x1, x2, x3, x4, x5, x6, x7)),
    vec4<f32>(block(hi_i.x, x0, x1, x2, x3, x4, x5, x6, x7), block(hi_i.y, x0, x1, x2, x3, x4, x5, x6, x7),
              block(hi_i.z, x0, x1, x2, x3, x4, x5, x6, x7), block(hi_i.w, x0, x1, x2, x3, x4, x5, x6, x7)));
}
