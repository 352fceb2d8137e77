// ACCUMULATE's read of y moved in front of the dot products, for the gpu-family matvec's io parts
// (matvec_io.wgsl, matvec_io_merge.wgsl; `//#include`): the workgroup's lane 0 loads its 8 rows' old values
// (prefetch_y, called before the loop along K) while the dot products run, so after the last barrier the
// epilogue only stores, where put() (quant_epilogue.wgsl) would first wait for a load. Each row is y + v as
// put() adds it (f32 addition commutes: the same bits); each element of y has one reader and writer.

var<private> y_old : array<f32, 8>;  // rows r0..r0+7 of y before this dispatch (ACCUMULATE)

fn y_index(t : u32, r : u32) -> u32 {  // put4's layout
  return t * select(Y_STRIDE, params.rows, Y_STRIDE == 0u) + Y_OFFSET + r;
}

fn prefetch_y(t : u32, r0 : u32) {
  if (!ACCUMULATE || r0 >= params.rows) {
    return;
  }
  for (var i = 0u; i < 8u; i++) {
    y_old[i] = y[y_index(t, min(r0 + i, params.rows - 1u))];
  }
}

// The 8 rows' results r0.. of token t: y_old + the sums under ACCUMULATE (rows past the end not written), else put8.
fn store8_accumulated(t : u32, r0 : u32, lo : vec4<f32>, hi : vec4<f32>) {
  if (!ACCUMULATE) {
    put8(t, r0, lo, hi);
    return;
  }
  let v = array<f32, 8>(lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w);
  for (var i = 0u; i < min(params.rows - r0, 8u); i++) {
    y[y_index(t, r0 + i)] = y_old[i] + v[i];
  }
}
