// Rotary position embedding on the stacked q | k | v projection output plus its bias (zeros for models
// without one; qwen2 has one), split into q, k and v:
// q and k rotated (adjacent-pair convention: pairs (2i, 2i+1), as GGUF llama weights and
// numpy_ref.rope_adjacent use), v copied. The split costs no dispatch of its own: one matvec
// computes q, k and v over stacked weight rows (backends/webgpu/fused.py) and this pass lays them out
// as the KV-cache kernels read them.
// cos/sin come from a (max_positions, head_dim/2) table built once on the host
// with the reference's own f32 angles, so no large-angle sin/cos runs on the GPU.
// One thread per (token, pair); q pairs first, then k pairs, then v pairs.
// ROTATE false (a layer without rotary, SmolLM3's NoPE layers): q and k are split and written unrotated.
// main_qk_norm (Qwen3, Gemma 3): each q and k head first gets its RMSNorm over head_dim (gains q_gain / k_gain,
// eps from params) before it rotates; WORKGROUP_SIZE must be head_dim / 2, so a workgroup is one head of one
// token (grid: n_heads + 2 n_kv_heads heads along x) and its lanes sum the head's squares together.

struct Params {
  tokens : u32,
  n_heads : u32,
  n_kv_heads : u32,
  head_dim : u32,
  eps : f32,  // main_qk_norm's RMSNorm eps
}

@group(0) @binding(0) var<storage, read> qkv : array<vec2<f32>>;      // (tokens, (n_heads + 2 n_kv_heads) * head_dim / 2)
@group(0) @binding(1) var<storage, read_write> q : array<vec2<f32>>;  // (tokens, n_heads * head_dim / 2)
@group(0) @binding(2) var<storage, read_write> k : array<vec2<f32>>;  // (tokens, n_kv_heads * head_dim / 2)
@group(0) @binding(3) var<storage, read_write> v : array<vec2<f32>>;  // (tokens, n_kv_heads * head_dim / 2)
@group(0) @binding(4) var<storage, read> positions : array<i32>;      // (tokens,)
@group(0) @binding(5) var<storage, read> cos_sin : array<vec2<f32>>;  // (max_positions, head_dim / 2)
@group(0) @binding(6) var<storage, read> bias : array<vec2<f32>>;     // ((n_heads + 2 n_kv_heads) * head_dim / 2,)
@group(0) @binding(7) var<uniform> params : Params;

@group(0) @binding(8) var<storage, read> q_gain : array<vec2<f32>>;    // (head_dim / 2,) main_qk_norm only
@group(0) @binding(9) var<storage, read> k_gain : array<vec2<f32>>;    // (head_dim / 2,) main_qk_norm only

override WORKGROUP_SIZE : u32 = 64u;
override ROTATE : bool = true;

var<workgroup> partial : array<f32, WORKGROUP_SIZE>;  // main_qk_norm: the head's pairs' sums of squares

fn rotate(x : vec2<f32>, cs : vec2<f32>) -> vec2<f32> {
  return vec2<f32>(x.x * cs.x - x.y * cs.y, x.x * cs.y + x.y * cs.x);
}

// Pair p of token t, x its value plus bias (normed where main_qk_norm norms it): rotated into q or k, or copied
// into v.
fn put_pair(t : u32, p : u32, x : vec2<f32>) {
  let half = params.head_dim / 2u;
  let q_pairs = params.n_heads * half;
  let k_pairs = params.n_kv_heads * half;
  if (p >= q_pairs + k_pairs) {
    v[t * k_pairs + (p - q_pairs - k_pairs)] = x;
    return;
  }
  var y = x;
  if (ROTATE) {
    y = rotate(x, cos_sin[u32(positions[t]) * half + p % half]);
  }
  if (p < q_pairs) {
    q[t * q_pairs + p] = y;
  } else {
    k[t * k_pairs + (p - q_pairs)] = y;
  }
}

@compute @workgroup_size(WORKGROUP_SIZE)
fn main(@builtin(global_invocation_id) gid : vec3<u32>) {
  let t = gid.y;
  let row = (params.n_heads + 2u * params.n_kv_heads) * params.head_dim / 2u;
  let p = gid.x;
  if (t >= params.tokens || p >= row) {
    return;
  }
  put_pair(t, p, qkv[t * row + p] + bias[p]);
}

@compute @workgroup_size(WORKGROUP_SIZE)
fn main_qk_norm(@builtin(workgroup_id) wid : vec3<u32>, @builtin(local_invocation_index) lid : u32) {
  let t = wid.y;  // every branch below depends on the workgroup only: the barrier stays uniform
  let head = wid.x;  // a q head, a k head, or a v head (copied unnormed)
  let half = params.head_dim / 2u;
  let row = (params.n_heads + 2u * params.n_kv_heads) * half;
  if (t >= params.tokens || head >= params.n_heads + 2u * params.n_kv_heads) {
    return;
  }
  let p = head * half + lid;
  var x = qkv[t * row + p] + bias[p];
  if (head < params.n_heads + params.n_kv_heads) {
    partial[lid] = dot(x, x);
    workgroupBarrier();
    var total = 0.0;
    for (var i = 0u; i < WORKGROUP_SIZE; i++) {
      total += partial[i];
    }
    let inv_rms = 1.0 / sqrt(total / f32(params.head_dim) + params.eps);
    let gain = select(k_gain[lid], q_gain[lid], head < params.n_heads);
    x = x * inv_rms * gain;
  }
  put_pair(t, p, x);
}
