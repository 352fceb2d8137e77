// y = W @ x for a few token vectors (decode, the LM head), W in the repacked Q8_0
// layout of py/pagedkv/model/layout.py, dequantization fused, f32 accumulation.
// One thread per output row and per tile of TOKENS tokens, no workgroup barriers;
// each 32-weight block is two vec4<u32> loads of int8 codes plus one f16 scale,
// unpacked once and reused for every token. Per block, sum_j d q_j x_j = d * dot(q, x).

struct Params {
  rows : u32,
  cols : u32,     // multiple of 32
  tokens : u32,   // batch size
  _pad : u32,
}

@group(0) @binding(0) var<storage, read> qs : array<vec4<u32>>;  // (rows, cols/32, 2): 16 int8 codes per vec4
@group(0) @binding(1) var<storage, read> d : array<u32>;         // (rows * cols/32) f16 scales, two per u32
@group(0) @binding(2) var<storage, read> x : array<vec4<f32>>;   // (tokens, cols/4)
@group(0) @binding(3) var<storage, read_write> y : array<f32>;   // (tokens, rows)
@group(0) @binding(4) var<uniform> params : Params;

override WORKGROUP_SIZE : u32 = 64u;
const TOKENS : u32 = 4u;

// The four little-endian int8 codes of one word, sign-extended, as f32.
fn codes(w : u32) -> vec4<f32> {
  return vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(w) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u));
}

fn scale(i : u32) -> f32 {
  let pair = unpack2x16float(d[i >> 1u]);
  return select(pair.x, pair.y, (i & 1u) == 1u);
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
    let qa = qs[(row * nb + b) * 2u];
    let qb = qs[(row * nb + b) * 2u + 1u];
    let db = scale(row * nb + b);
    let q0 = codes(qa.x);
    let q1 = codes(qa.y);
    let q2 = codes(qa.z);
    let q3 = codes(qa.w);
    let q4 = codes(qb.x);
    let q5 = codes(qb.y);
    let q6 = codes(qb.z);
    let q7 = codes(qb.w);
    for (var t = 0u; t < nt; t++) {
      let xb = (t0 + t) * x_stride + b * 8u;
      let qx = dot(q0, x[xb]) + dot(q1, x[xb + 1u]) + dot(q2, x[xb + 2u]) + dot(q3, x[xb + 3u])
             + dot(q4, x[xb + 4u]) + dot(q5, x[xb + 5u]) + dot(q6, x[xb + 6u]) + dot(q7, x[xb + 7u]);
      acc[t] += db * qx;
    }
  }
  for (var t = 0u; t < nt; t++) {
    y[(t0 + t) * params.rows + row] = acc[t];
  }
}
