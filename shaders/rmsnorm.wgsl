// RMSNorm: out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * weight, one workgroup per token; with ADD,
// out[t] += that instead (a post norm's residual add: x += rms_norm(y), Gemma 3's post-attention / post-FFN norms).
// Each thread sums the squares of a strided slice; a single barrier publishes the
// partial sums and every thread adds them all up itself (one barrier instead of a
// log2(WORKGROUP_SIZE)-step tree: SwiftShader runs barriers slowly).

struct Params {
  hidden : u32,
  tokens : u32,
  eps : f32,
  _pad : u32,
}

@group(0) @binding(0) var<storage, read> x : array<f32>;          // (tokens, hidden)
@group(0) @binding(1) var<storage, read> weight : array<f32>;     // (hidden,)
@group(0) @binding(2) var<storage, read_write> out : array<f32>;  // (tokens, hidden)
@group(0) @binding(3) var<uniform> params : Params;

override WORKGROUP_SIZE : u32 = 64u;
override ADD : bool = false;

var<workgroup> partial : array<f32, WORKGROUP_SIZE>;

@compute @workgroup_size(WORKGROUP_SIZE)
fn main(@builtin(workgroup_id) wid : vec3<u32>, @builtin(local_invocation_index) lid : u32) {
  let t = wid.x;  // uniform per workgroup, so the early return keeps the barrier uniform
  if (t >= params.tokens) {
    return;
  }
  let base = t * params.hidden;
  var sum_sq = 0.0;
  for (var i = lid; i < params.hidden; i += WORKGROUP_SIZE) {
    let v = x[base + i];
    sum_sq += v * v;
  }
  partial[lid] = sum_sq;
  workgroupBarrier();
  var total = 0.0;
  for (var i = 0u; i < WORKGROUP_SIZE; i++) {
    total += partial[i];
  }
  let inv_rms = 1.0 / sqrt(total / f32(params.hidden) + params.eps);
  for (var i = lid; i < params.hidden; i += WORKGROUP_SIZE) {
    let normed = x[base + i] * inv_rms * weight[i];
    if (ADD) {
      out[base + i] += normed;
    } else {
      out[base + i] = normed;
    }
  }
}
