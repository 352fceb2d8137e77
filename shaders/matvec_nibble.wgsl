// The cpu-family matvec of the nibble-coded weight types (matvec_<type>, composed after <type>_weights.wgsl
// and nibble_io.wgsl by shader_variants.py): matvec_main.wgsl's 8 rows per thread, each block's
// activations pre-scaled once for all 8 rows (nibbles.wgsl), then per row and block
// sum_j w_j x_j = a . (nibble dots + 16 high-bit dots) + m . (half sums).

override WORKGROUP_SIZE : u32 = 32u;

// One row's contribution from block i; xn / xh: the activations scaled for the nibbles / the high bits.
fn row_block(i : u32, xn : X8, xh : X8, sums : vec2<f32>) -> f32 {
  let b = scales(i);
  var t = nibble_dots(qs[i], xn);
  if (HIGH_BITS == 1u) {
    t += 16.0 * bit_dots(b.h0, xh);
  } else if (HIGH_BITS == 2u) {
    t += 16.0 * pair_dots(b.h0, b.h1, xh);
  }
  return dot(b.a, t) + dot(b.m, sums);
}

fn block_rows(lo_i : vec4<u32>, hi_i : vec4<u32>, u0 : vec4<f32>, u1 : vec4<f32>, u2 : vec4<f32>,
              u3 : vec4<f32>, u4 : vec4<f32>, u5 : vec4<f32>, u6 : vec4<f32>, u7 : vec4<f32>) -> Rows8 {
  let u = X8(u0, u1, u2, u3, u4, u5, u6, u7);
  let xn = nibble_scaled(u);
  let xh = times(u, select(PAIR_SCALE, BIT_SCALE, HIGH_BITS == 1u));
  let s = half_sums(u);
  return Rows8(vec4<f32>(row_block(lo_i.x, xn, xh, s), row_block(lo_i.y, xn, xh, s), row_block(lo_i.z, xn, xh, s),
                         row_block(lo_i.w, xn, xh, s)),
               vec4<f32>(row_block(hi_i.x, xn, xh, s), row_block(hi_i.y, xn, xh, s), row_block(hi_i.z, xn, xh, s),
                         row_block(hi_i.w, xn, xh, s)));
}

//#include matvec_main.wgsl
