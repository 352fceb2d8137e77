// Y = X @ W^T for many tokens (prefill), W in the repacked Q8_0 layout of
// py/pagedkv/model/layout.py, dequantization fused, f32 accumulation.
// Same register tiling as matmul_q4_1.wgsl (ROWS x TOKENS outputs per thread,
// no workgroup barriers); rows / tokens past the end are clamped, never written.

struct Params {
  rows : u32,
  cols : u32,     // multiple of 32
  tokens : u32,
  _pad : u32,
}

@group(0) @binding(0) var<storage, read> qs : array<vec2<u32>>;  // (rows, cols/8): 8 int8 codes per vec2
@group(0) @binding(1) var<storage, read> d : array<u32>;         // (rows * cols/32) f16 scales, two per u32
@group(0) @binding(2) var<storage, read> x : array<vec4<f32>>;   // (tokens, cols/4)
@group(0) @binding(3) var<storage, read_write> y : array<f32>;   // (tokens, rows)
@group(0) @binding(4) var<uniform> params : Params;

override WORKGROUP_SIZE : u32 = 64u;
const ROWS : u32 = 4u;
const TOKENS : u32 = 4u;

fn codes(w : u32) -> vec4<f32> {
  return vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(w) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u));
}

fn scale(i : u32) -> f32 {
  let pair = unpack2x16float(d[i >> 1u]);
  return select(pair.x, pair.y, (i & 1u) == 1u);
}

@compute @workgroup_size(WORKGROUP_SIZE)
fn main(@builtin(global_invocation_id) gid : vec3<u32>) {
  let r0 = gid.x * ROWS;
  let t0 = gid.y * TOKENS;
  if (r0 >= params.rows || t0 >= params.tokens) {
    return;
  }
  let nb = params.cols / 32u;
  let words = params.cols / 8u;
  let x_stride = params.cols / 4u;
  var row : array<u32, ROWS>;
  for (var i = 0u; i < ROWS; i++) {
    row[i] = min(r0 + i, params.rows - 1u);
  }
  var tok : array<u32, TOKENS>;
  for (var j = 0u; j < TOKENS; j++) {
    tok[j] = min(t0 + j, params.tokens - 1u) * x_stride;
  }
  var acc : array<vec4<f32>, ROWS>;  // acc[i][j]: row r0 + i, token t0 + j
  for (var b = 0u; b < nb; b++) {
    var s : array<f32, ROWS>;
    for (var i = 0u; i < ROWS; i++) {
      s[i] = scale(row[i] * nb + b);
    }
    for (var k = b * 4u; k < b * 4u + 4u; k++) {
      var lo : array<vec4<f32>, ROWS>;  // dequantized weights 8k..8k+3
      var hi : array<vec4<f32>, ROWS>;  // dequantized weights 8k+4..8k+7
      for (var i = 0u; i < ROWS; i++) {
        let w = qs[row[i] * words + k];
        lo[i] = s[i] * codes(w.x);
        hi[i] = s[i] * codes(w.y);
      }
      for (var j = 0u; j < TOKENS; j++) {
        let x_lo = x[tok[j] + 2u * k];
        let x_hi = x[tok[j] + 2u * k + 1u];
        for (var i = 0u; i < ROWS; i++) {
          acc[i][j] += dot(lo[i], x_lo) + dot(hi[i], x_hi);
        }
      }
    }
  }
  for (var j = 0u; j < min(TOKENS, params.tokens - t0); j++) {
    for (var i = 0u; i < min(ROWS, params.rows - r0); i++) {
      y[(t0 + j) * params.rows + r0 + i] = acc[i][j];
    }
  }
}
