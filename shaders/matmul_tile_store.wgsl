// The epilogue of an 8-row x (up to) 4-token register tile, shared by matmul_main.wgsl (cpu family) and
// matmul_gpu_main.wgsl (gpu family), expanded at their `//#include matmul_tile_store.wgsl` line, after
// quant_epilogue.wgsl. acc0 / acc1: token t0, rows r0..r0+3 / r0+4..r0+7; acc2 / acc3: token t0+1, ...

// Token t is below params.tokens (put_tile checks it); rows past the end are not written.
fn store(t : u32, r0 : u32, acc : vec4<f32>) {
  if (r0 < params.rows) {
    put4(t, r0, acc);
  }
}

// The caller has checked t0 < tokens and r0 < rows; the tile holds `n` tokens (4, 2 or 1: acc4..acc7, then
// acc2, acc3 unused), and tokens and rows past the end are not written.
fn put_tile(t0 : u32, r0 : u32, n : u32, acc0 : vec4<f32>, acc1 : vec4<f32>, acc2 : vec4<f32>, acc3 : vec4<f32>,
            acc4 : vec4<f32>, acc5 : vec4<f32>, acc6 : vec4<f32>, acc7 : vec4<f32>) {
  let last = min(params.tokens, t0 + n);  // one past this tile's last token
  if (SWIGLU) {  // acc0: gate rows of token t0, acc1: their up rows
    put_act(t0, r0, acc0, acc1);
    if (t0 + 1u < last) { put_act(t0 + 1u, r0, acc2, acc3); }
    if (t0 + 2u < last) { put_act(t0 + 2u, r0, acc4, acc5); }
    if (t0 + 3u < last) { put_act(t0 + 3u, r0, acc6, acc7); }
    return;
  }
  store(t0, r0, acc0);
  store(t0, r0 + 4u, acc1);
  if (t0 + 1u < last) {
    store(t0 + 1u, r0, acc2);
    store(t0 + 1u, r0 + 4u, acc3);
  }
  if (t0 + 2u < last) {
    store(t0 + 2u, r0, acc4);
    store(t0 + 2u, r0 + 4u, acc5);
  }
  if (t0 + 3u < last) {
    store(t0 + 3u, r0, acc6);
    store(t0 + 3u, r0 + 4u, acc7);
  }
}
