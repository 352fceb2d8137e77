// y = W @ x for a few token vectors (decode), W in the repacked Q4_1 layout of
// py/pagedkv/model/layout.py, dequantization fused, f32 accumulation.
// One thread per output row and per tile of TOKENS tokens: no workgroup barriers
// (SwiftShader runs them slowly); each 32-weight block is one vec4<u32> load of
// nibbles plus one u32 of f16 (d, m), unpacked once and reused for every token.
// Per block, sum_j (d q_j + m) x_j = d * dot(q, x) + m * sum(x).

struct Params {
  rows : u32,
  cols : u32,     // multiple of 32
  tokens : u32,   // batch size
  _pad : u32,
}

@group(0) @binding(0) var<storage, read> qs : array<vec4<u32>>;  // (rows, cols/32): 32 nibbles per vec4
@group(0) @binding(1) var<storage, read> dm : array<u32>;        // (rows, cols/32): f16 d | f16 m << 16
@group(0) @binding(2) var<storage, read> x : array<vec4<f32>>;   // (tokens, cols/4)
@group(0) @binding(3) var<storage, read_write> y : array<f32>;   // (tokens, rows)
@group(0) @binding(4) var<uniform> params : Params;

override WORKGROUP_SIZE : u32 = 64u;
const TOKENS : u32 = 4u;

// Weights 8w..8w+3 (low) and 8w+4..8w+7 (high) of one nibble word as f32.
fn nibbles_lo(w : u32) -> vec4<f32> {
  return vec4<f32>((vec4<u32>(w) >> vec4<u32>(0u, 4u, 8u, 12u)) & vec4<u32>(15u));
}

fn nibbles_hi(w : u32) -> vec4<f32> {
  return vec4<f32>((vec4<u32>(w) >> vec4<u32>(16u, 20u, 24u, 28u)) & vec4<u32>(15u));
}

@compute @workgroup_size(WORKGROUP_SIZE)
fn main(@builtin(global_invocation_id) gid : vec3<u32>) {
  let row = gid.x;
  let t0 = gid.y * TOKENS;
  if (row >= params.rows || t0 >= params.tokens) {
    return;
  }
  let nb = params.cols / 32u;
  let x_stride = params.cols / 4u;
  let nt = min(TOKENS, params.tokens - t0);
  var acc = vec4<f32>(0.0);
  for (var b = 0u; b < nb; b++) {
    let q = qs[row * nb + b];
    let s = unpack2x16float(dm[row * nb + b]);  // (d, m)
    let q0 = nibbles_lo(q.x);
    let q1 = nibbles_hi(q.x);
    let q2 = nibbles_lo(q.y);
    let q3 = nibbles_hi(q.y);
    let q4 = nibbles_lo(q.z);
    let q5 = nibbles_hi(q.z);
    let q6 = nibbles_lo(q.w);
    let q7 = nibbles_hi(q.w);
    for (var t = 0u; t < nt; t++) {
      let xb = (t0 + t) * x_stride + b * 8u;
      let x0 = x[xb];
      let x1 = x[xb + 1u];
      let x2 = x[xb + 2u];
      let x3 = x[xb + 3u];
      let x4 = x[xb + 4u];
      let x5 = x[xb + 5u];
      let x6 = x[xb + 6u];
      let x7 = x[xb + 7u];
      let qx = dot(q0, x0) + dot(q1, x1) + dot(q2, x2) + dot(q3, x3)
             + dot(q4, x4) + dot(q5, x5) + dot(q6, x6) + dot(q7, x7);
      let sx = dot((x0 + x1) + (x2 + x3) + (x4 + x5) + (x6 + x7), vec4<f32>(1.0));
      acc[t] += s.x * qx + s.y * sx;
    }
  }
  for (var t = 0u; t < nt; t++) {
    y[(t0 + t) * params.rows + row] = acc[t];
  }
}
