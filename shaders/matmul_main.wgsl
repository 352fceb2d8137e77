// The body shared by the matmul_* kernels (expanded by ShaderLibrary at their `//#include matmul_main.wgsl`
// line): each thread owns an 8-row x 4-token output tile in named registers. The including kernel binds `qs`
// (one element per 8 weights of a row), `x`, `params` and defines scale_of(i), the scale of 32-weight block i
// (row * cols/32 + b), and dequant_lo / dequant_hi, weights 8k..8k+3 / 8k+4..8k+7 of qs element k of a row
// (k: its place in the block, for types whose high bits live beside the scales).

// Y[token, r0..r0+3] for one token from the four rows' dequantized weights 8k..8k+7.
fn rows4(a_lo : vec4<f32>, a_hi : vec4<f32>, b_lo : vec4<f32>, b_hi : vec4<f32>, c_lo : vec4<f32>, c_hi : vec4<f32>,
         d_lo : vec4<f32>, d_hi : vec4<f32>, x_lo : vec4<f32>, x_hi : vec4<f32>) -> vec4<f32> {
  return vec4<f32>(dot(a_lo, x_lo) + dot(a_hi, x_hi), dot(b_lo, x_lo) + dot(b_hi, x_hi),
                   dot(c_lo, x_lo) + dot(c_hi, x_hi), dot(d_lo, x_lo) + dot(d_hi, x_hi));
}

//#include matmul_tile_store.wgsl

@compute @workgroup_size(WORKGROUP_SIZE)
fn main(@builtin(global_invocation_id) gid : vec3<u32>) {
  let r0 = gid.x * 8u;
  let t0 = gid.y * 4u;
  if (r0 >= params.rows || t0 >= params.tokens) {
    return;
  }
  let nb = params.cols / 32u;
  let words = params.cols / 8u;
  let x_stride = params.cols / 4u;
  let last_row = params.rows - 1u;
  let ra = r0;
  let rb = min(r0 + 1u, last_row);
  let rc = min(r0 + 2u, last_row);
  let rd = min(r0 + 3u, last_row);
  let re = min(r0 + 4u, last_row);
  let rf = min(r0 + 5u, last_row);
  let rg = min(r0 + 6u, last_row);
  let rh = min(r0 + 7u, last_row);
  let last_token = params.tokens - 1u;
  let xa = t0 * x_stride;
  let xb = min(t0 + 1u, last_token) * x_stride;
  let xc = min(t0 + 2u, last_token) * x_stride;
  let xd = min(t0 + 3u, last_token) * x_stride;
  var acc0 = vec4<f32>(0.0);  // token t0, rows r0..r0+3 (acc1: rows r0+4..r0+7); acc2/acc3 token t0+1, ...
  var acc1 = vec4<f32>(0.0);
  var acc2 = vec4<f32>(0.0);
  var acc3 = vec4<f32>(0.0);
  var acc4 = vec4<f32>(0.0);
  var acc5 = vec4<f32>(0.0);
  var acc6 = vec4<f32>(0.0);
  var acc7 = vec4<f32>(0.0);
  for (var b = 0u; b < nb; b++) {
    let sa = scale_of(ra * nb + b);  // block b, per row
    let sb = scale_of(rb * nb + b);
    let sc = scale_of(rc * nb + b);
    let sd = scale_of(rd * nb + b);
    let se = scale_of(re * nb + b);
    let sf = scale_of(rf * nb + b);
    let sg = scale_of(rg * nb + b);
    let sh = scale_of(rh * nb + b);
    for (var k = b * 4u; k < b * 4u + 4u; k++) {
      let wa = qs[ra * words + k];
      let wb = qs[rb * words + k];
      let wc = qs[rc * words + k];
      let wd = qs[rd * words + k];
      let we = qs[re * words + k];
      let wf = qs[rf * words + k];
      let wg = qs[rg * words + k];
      let wh = qs[rh * words + k];
      let a_lo = dequant_lo(wa, sa, k);
      let a_hi = dequant_hi(wa, sa, k);
      let b_lo = dequant_lo(wb, sb, k);
      let b_hi = dequant_hi(wb, sb, k);
      let c_lo = dequant_lo(wc, sc, k);
      let c_hi = dequant_hi(wc, sc, k);
      let d_lo = dequant_lo(wd, sd, k);
      let d_hi = dequant_hi(wd, sd, k);
      let e_lo = dequant_lo(we, se, k);
      let e_hi = dequant_hi(we, se, k);
      let f_lo = dequant_lo(wf, sf, k);
      let f_hi = dequant_hi(wf, sf, k);
      let g_lo = dequant_lo(wg, sg, k);
      let g_hi = dequant_hi(wg, sg, k);
      let h_lo = dequant_lo(wh, sh, k);
      let h_hi = dequant_hi(wh, sh, k);
      var xl = x[xa + 2u * k];  // activations 8k..8k+3 and 8k+4..8k+7 of one token at a time
      var xh = x[xa + 2u * k + 1u];
      acc0 += rows4(a_lo, a_hi, b_lo, b_hi, c_lo, c_hi, d_lo, d_hi, xl, xh);
      acc1 += rows4(e_lo, e_hi, f_lo, f_hi, g_lo, g_hi, h_lo, h_hi, xl, xh);
      xl = x[xb + 2u * k];
      xh = x[xb + 2u * k + 1u];
      acc2 += rows4(a_lo, a_hi, b_lo, b_hi, c_lo, c_hi, d_lo, d_hi, xl, xh);
      acc3 += rows4(e_lo, e_hi, f_lo, f_hi, g_lo, g_hi, h_lo, h_hi, xl, xh);
      xl = x[xc + 2u * k];
      xh = x[xc + 2u * k + 1u];
      acc4 += rows4(a_lo, a_hi, b_lo, b_hi, c_lo, c_hi, d_lo, d_hi, xl, xh);
      acc5 += rows4(e_lo, e_hi, f_lo, f_hi, g_lo, g_hi, h_lo, h_hi, xl, xh);
      xl = x[xd + 2u * k];
      xh = x[xd + 2u * k + 1u];
      acc6 += rows4(a_lo, a_hi, b_lo, b_hi, c_lo, c_hi, d_lo, d_hi, xl, xh);
      acc7 += rows4(e_lo, e_hi, f_lo, f_hi, g_lo, g_hi, h_lo, h_hi, xl, xh);
    }
  }
  put_tile(t0, r0, 4u, acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7);
}
