// Y = X @ W^T for many tokens (prefill), W in the repacked Q4_1 layout of
// py/pagedkv/model/layout.py, dequantization fused, f32 accumulation.
// Register tiling rather than workgroup tiling: each thread owns a ROWS x TOKENS
// output tile, dequantizes each weight once for TOKENS tokens and loads each
// activation once for ROWS rows, with no workgroup barriers (SwiftShader runs
// barriers slowly; its workgroup memory is CPU cache like everything else).
// Rows / tokens past the end are clamped to the last one and never written.

struct Params {
  rows : u32,
  cols : u32,     // multiple of 32
  tokens : u32,
  _pad : u32,
}

@group(0) @binding(0) var<storage, read> qs : array<u32>;        // (rows, cols/8): 8 nibbles per word
@group(0) @binding(1) var<storage, read> dm : array<u32>;        // (rows, cols/32): f16 d | f16 m << 16
@group(0) @binding(2) var<storage, read> x : array<vec4<f32>>;   // (tokens, cols/4)
@group(0) @binding(3) var<storage, read_write> y : array<f32>;   // (tokens, rows)
@group(0) @binding(4) var<uniform> params : Params;

override WORKGROUP_SIZE : u32 = 64u;
const ROWS : u32 = 4u;
const TOKENS : u32 = 4u;

fn nibbles_lo(w : u32) -> vec4<f32> {
  return vec4<f32>((vec4<u32>(w) >> vec4<u32>(0u, 4u, 8u, 12u)) & vec4<u32>(15u));
}

fn nibbles_hi(w : u32) -> vec4<f32> {
  return vec4<f32>((vec4<u32>(w) >> vec4<u32>(16u, 20u, 24u, 28u)) & vec4<u32>(15u));
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
    var s : array<vec2<f32>, ROWS>;  // (d, m) of block b per row
    for (var i = 0u; i < ROWS; i++) {
      s[i] = unpack2x16float(dm[row[i] * nb + b]);
    }
    for (var k = b * 4u; k < b * 4u + 4u; k++) {
      var lo : array<vec4<f32>, ROWS>;  // dequantized weights 8k..8k+3
      var hi : array<vec4<f32>, ROWS>;  // dequantized weights 8k+4..8k+7
      for (var i = 0u; i < ROWS; i++) {
        let w = qs[row[i] * words + k];
        lo[i] = s[i].x * nibbles_lo(w) + s[i].y;
        hi[i] = s[i].x * nibbles_hi(w) + s[i].y;
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
