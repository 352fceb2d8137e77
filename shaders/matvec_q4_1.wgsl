// y = W @ x for a few token vectors (decode), W in the repacked Q4_1 layout of
// py/pagedkv/model/layout.py, dequantization fused, f32 accumulation.
// SwiftShader turns every storage load with a run-time index into per-lane scalar
// loads, so loads per weight dominate: one thread computes ROWS = 8 output rows of
// one token (gid.y), loading each activation once for all 8 rows and each 32-weight
// block as one vec4<u32> of nibbles + one u32 of f16 (d, m). No workgroup barriers
// and no private arrays (both are slow there). Per block, with w = d q + m:
// sum_j w_j x_j = d * dot(q, x) + m * sum(x). Rows past the end are clamped and not written.

struct Params {
  rows : u32,
  cols : u32,     // multiple of 32
  tokens : u32,
  _pad : u32,
}

@group(0) @binding(0) var<storage, read> qs : array<vec4<u32>>;  // (rows, cols/32): 32 nibbles per vec4
@group(0) @binding(1) var<storage, read> dm : array<u32>;        // (rows, cols/32): f16 d | f16 m << 16
@group(0) @binding(2) var<storage, read> x : array<vec4<f32>>;   // (tokens, cols/4)
@group(0) @binding(3) var<storage, read_write> y : array<f32>;   // (tokens, rows)
@group(0) @binding(4) var<uniform> params : Params;

override WORKGROUP_SIZE : u32 = 32u;
const ROWS : u32 = 8u;

// Weights 8w..8w+3 (low) and 8w+4..8w+7 (high) of one nibble word as f32.
fn nibbles_lo(w : u32) -> vec4<f32> {
  return vec4<f32>((vec4<u32>(w) >> vec4<u32>(0u, 4u, 8u, 12u)) & vec4<u32>(15u));
}

fn nibbles_hi(w : u32) -> vec4<f32> {
  return vec4<f32>((vec4<u32>(w) >> vec4<u32>(16u, 20u, 24u, 28u)) & vec4<u32>(15u));
}

// One row's contribution from block b: the block's 32 activations are x0..x7, their sum sx.
fn block(i : u32, x0 : vec4<f32>, x1 : vec4<f32>, x2 : vec4<f32>, x3 : vec4<f32>,
         x4 : vec4<f32>, x5 : vec4<f32>, x6 : vec4<f32>, x7 : vec4<f32>, sx : f32) -> f32 {
  let q = qs[i];
  let s = unpack2x16float(dm[i]);  // (d, m)
  let qx = dot(nibbles_lo(q.x), x0) + dot(nibbles_hi(q.x), x1) + dot(nibbles_lo(q.y), x2) + dot(nibbles_hi(q.y), x3)
         + dot(nibbles_lo(q.z), x4) + dot(nibbles_hi(q.z), x5) + dot(nibbles_lo(q.w), x6) + dot(nibbles_hi(q.w), x7);
  return s.x * qx + s.y * sx;
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
  let xt = t * (params.cols / 4u);
  for (var b = 0u; b < nb; b++) {
    let xb = xt + b * 8u;
    let x0 = x[xb];
    let x1 = x[xb + 1u];
    let x2 = x[xb + 2u];
    let x3 = x[xb + 3u];
    let x4 = x[xb + 4u];
    let x5 = x[xb + 5u];
    let x6 = x[xb + 6u];
    let x7 = x[xb + 7u];
    let sx = dot((x0 + x1) + (x2 + x3) + (x4 + x5) + (x6 + x7), vec4<f32>(1.0));
    lo.x += block(ra + b, x0, x1, x2, x3, x4, x5, x6, x7, sx);
    lo.y += block(rb + b, x0, x1, x2, x3, x4, x5, x6, x7, sx);
    lo.z += block(rc + b, x0, x1, x2, x3, x4, x5, x6, x7, sx);
    lo.w += block(rd + b, x0, x1, x2, x3, x4, x5, x6, x7, sx);
    hi.x += block(re + b, x0, x1, x2, x3, x4, x5, x6, x7, sx);
    hi.y += block(rf + b, x0, x1, x2, x3, x4, x5, x6, x7, sx);
    hi.z += block(rg + b, x0, x1, x2, x3, x4, x5, x6, x7, sx);
    hi.w += block(rh + b, x0, x1, x2, x3, x4, x5, x6, x7, sx);
  }
  let o = t * params.rows + r0;
  let n = params.rows - r0;
  y[o] = lo.x;
  if (n > 1u) { y[o + 1u] = lo.y; }
  if (n > 2u) { y[o + 2u] = lo.z; }
  if (n > 3u) { y[o + 3u] = lo.w; }
  if (n > 4u) { y[o + 4u] = hi.x; }
  if (n > 5u) { y[o + 5u] = hi.y; }
  if (n > 6u) { y[o + 6u] = hi.z; }
  if (n > 7u) { y[o + 7u] = hi.w; }
}
