// The body shared by the matvec_* kernels (expanded by ShaderLibrary at their `//#include matvec_main.wgsl`
// line, after matvec_norm.wgsl and quant_epilogue.wgsl): one thread computes ROWS = 8 output rows of one token
// (gid.y), loading each activation once for all 8 rows. The including kernel binds `x`, `params` and defines
// block_rows(), the dot products of one 32-weight block of its 8 rows (block indices lo_i, hi_i) with the
// block's activations x0..x7.

const ROWS : u32 = 8u;

struct Rows8 {
  lo : vec4<f32>,  // rows r0 .. r0+3
  hi : vec4<f32>,  // rows r0+4 .. r0+7
}

@compute @workgroup_size(WORKGROUP_SIZE)
fn main(@builtin(global_invocation_id) gid : vec3<u32>) {
  let r0 = gid.x * ROWS;
  let t = gid.y;
  if (r0 >= params.rows || t >= params.tokens) {
    return;
  }
  let nb = params.cols / 32u;
  let last = params.rows - 1u;
  let ra = r0 * nb;
  let rb = min(r0 + 1u, last) * nb;
  let rc = min(r0 + 2u, last) * nb;
  let rd = min(r0 + 3u, last) * nb;
  let re = min(r0 + 4u, last) * nb;
  let rf = min(r0 + 5u, last) * nb;
  let rg = min(r0 + 6u, last) * nb;
  let rh = min(r0 + 7u, last) * nb;
  var lo = vec4<f32>(0.0);  // rows r0 .. r0+3
  var hi = vec4<f32>(0.0);  // rows r0+4 .. r0+7
  var ss = 0.0;  // sum of x^2 (NORM)
  let xt = t * (params.cols / 4u);
  for (var b = 0u; b < nb; b++) {
    let xb = xt + b * 8u;
    var x0 = x[xb];
    var x1 = x[xb + 1u];
    var x2 = x[xb + 2u];
    var x3 = x[xb + 3u];
    var x4 = x[xb + 4u];
    var x5 = x[xb + 5u];
    var x6 = x[xb + 6u];
    var x7 = x[xb + 7u];
    if (NORM) {
      ss += dot(x0, x0) + dot(x1, x1) + dot(x2, x2) + dot(x3, x3)
          + dot(x4, x4) + dot(x5, x5) + dot(x6, x6) + dot(x7, x7);
      x0 *= gain(b * 8u + 0u);
      x1 *= gain(b * 8u + 1u);
      x2 *= gain(b * 8u + 2u);
      x3 *= gain(b * 8u + 3u);
      x4 *= gain(b * 8u + 4u);
      x5 *= gain(b * 8u + 5u);
      x6 *= gain(b * 8u + 6u);
      x7 *= gain(b * 8u + 7u);
    }
    let r = block_rows(vec4<u32>(ra, rb, rc, rd) + b, vec4<u32>(re, rf, rg, rh) + b, x0, x1, x2, x3, x4, x5, x6, x7);
    lo += r.lo;
    hi += r.hi;
  }
  if (NORM) {
    let inv_rms = 1.0 / sqrt(ss / f32(params.cols) + params.eps);
    lo *= inv_rms;
    hi *= inv_rms;
  }
  put8(t, r0, lo, hi);
}
