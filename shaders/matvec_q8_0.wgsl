// y = W @ x for a few token vectors (decode, the LM head), W in the repacked Q8_0
// layout of py/pagedkv/model/layout.py, dequantization fused, f32 accumulation.
// SwiftShader turns every storage load with a run-time index into a masked per-lane
// gather of each scalar, so loads are costly: one thread computes ROWS = 8 output rows of
// one token (gid.y), loading each activation once for all 8 rows and each 32-weight
// block as two vec4<u32> of int8 codes + one f16 scale. No workgroup barriers and
// no private arrays (both are slow there). Rows past the end are clamped and not written.

struct Params {
  rows : u32,
  cols : u32,     // multiple of 32
  tokens : u32,
  eps : f32,     // NORM only
}

@group(0) @binding(0) var<storage, read> qs : array<vec4<u32>>;  // (rows, cols/32, 2): 16 int8 codes per vec4
@group(0) @binding(1) var<storage, read> d : array<u32>;         // (rows * cols/32) f16 scales, two per u32
@group(0) @binding(2) var<storage, read> x : array<vec4<f32>>;   // (tokens, cols/4)
@group(0) @binding(3) var<storage, read_write> y : array<f32>;   // (tokens, rows)
@group(0) @binding(4) var<uniform> params : Params;

override WORKGROUP_SIZE : u32 = 32u;
const CODE_WORDS_PER_BLOCK : u32 = 2u;  // vec4<u32> words of codes per 32-weight block
//#include matvec_norm.wgsl
//#include quant_epilogue.wgsl
const ROWS : u32 = 8u;

// The four little-endian int8 codes q of one word as q / 127 (one builtin, far cheaper on
// SwiftShader than shift / shift / convert); the block scale carries the factor 127 back.
// Right (to f32 rounding of q / 127) for q in [-127, 127], every code Q8_0 quantization
// writes (scale amax / 127); -128 would read as -127, so webgpu_ops.check_q8_0_codes refuses weights containing it.
fn codes(w : u32) -> vec4<f32> {
  return unpack4x8snorm(w);
}

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
    lo.x += block(ra + b, x0, x1, x2, x3, x4, x5, x6, x7);
    lo.y += block(rb + b, x0, x1, x2, x3, x4, x5, x6, x7);
    lo.z += block(rc + b, x0, x1, x2, x3, x4, x5, x6, x7);
    lo.w += block(rd + b, x0, x1, x2, x3, x4, x5, x6, x7);
    hi.x += block(re + b, x0, x1, x2, x3, x4, x5, x6, x7);
    hi.y += block(rf + b, x0, x1, x2, x3, x4, x5, x6, x7);
    hi.z += block(rg + b, x0, x1, x2, x3, x4, x5, x6, x7);
    hi.w += block(rh + b, x0, x1, x2, x3, x4, x5, x6, x7);
  }
  if (NORM) {
    let inv_rms = 1.0 / sqrt(ss / f32(params.cols) + params.eps);
    lo *= inv_rms;
    hi *= inv_rms;
  }
  if (SWIGLU) {
    put_act(t, r0, lo, hi);
    return;
  }
  let o = t * params.rows + r0;
  let n = params.rows - r0;
  put(o, lo.x);
  if (n > 1u) { put(o + 1u, lo.y); }
  if (n > 2u) { put(o + 2u, lo.z); }
  if (n > 3u) { put(o + 3u, lo.w); }
  if (n > 4u) { put(o + 4u, hi.x); }
  if (n > 5u) { put(o + 5u, hi.y); }
  if (n > 6u) { put(o + 6u, hi.z); }
  if (n > 7u) { put(o + 7u, hi.w); }
}
