// Rotary position embedding on the stacked q | k | v projection output plus its bias (zeros for models
// without one; qwen2 has one), split into q, k and v:
// q and k rotated (adjacent-pair convention: pairs (2i, 2i+1), as GGUF llama weights and
// numpy_ref.rope_adjacent use), v copied. The split costs no dispatch of its own: one matvec
// computes q, k and v over stacked weight rows (backends/webgpu/fused.py) and this pass lays them out
// as the KV-cache kernels read them.
// cos/sin come from a (max_positions, head_dim/2) table built once on the host
// with the reference's own f32 angles, so no large-angle sin/cos runs on the GPU.
// One thread per (token, pair); q pairs first, then k pairs, then v pairs.

struct Params {
  tokens : u32,
  n_heads : u32,
  n_kv_heads : u32,
  head_dim : u32,
}

@group(0) @binding(0) var<storage, read> qkv : array<vec2<f32>>;      // (tokens, (n_heads + 2 n_kv_heads) * head_dim / 2)
@group(0) @binding(1) var<storage, read_write> q : array<vec2<f32>>;  // (tokens, n_heads * head_dim / 2)
@group(0) @binding(2) var<storage, read_write> k : array<vec2<f32>>;  // (tokens, n_kv_heads * head_dim / 2)
@group(0) @binding(3) var<storage, read_write> v : array<vec2<f32>>;  // (tokens, n_kv_heads * head_dim / 2)
@group(0) @binding(4) var<storage, read> positions : array<i32>;      // (tokens,)
@group(0) @binding(5) var<storage, read> cos_sin : array<vec2<f32>>;  // (max_positions, head_dim / 2)
@group(0) @binding(6) var<storage, read> bias : array<vec2<f32>>;     // ((n_heads + 2 n_kv_heads) * head_dim / 2,)
@group(0) @binding(7) var<uniform> params : Params;

override WORKGROUP_SIZE : u32 = 64u;

fn rotate(x : vec2<f32>, cs : vec2<f32>) -> vec2<f32> {
  return vec2<f32>(x.x * cs.x - x.y * cs.y, x.x * cs.y + x.y * cs.x);
}

@compute @workgroup_size(WORKGROUP_SIZE)
fn main(@builtin(global_invocation_id) gid : vec3<u32>) {
  let t = gid.y;
  let half = params.head_dim / 2u;
  let q_pairs = params.n_heads * half;
  let k_pairs = params.n_kv_heads * half;
  let row = q_pairs + 2u * k_pairs;
  let p = gid.x;
  if (t >= params.tokens || p >= row) {
    return;
  }
  let x = qkv[t * row + p] + bias[p];
  if (p >= q_pairs + k_pairs) {
    v[t * k_pairs + (p - q_pairs - k_pairs)] = x;
    return;
  }
  let cs = cos_sin[u32(positions[t]) * half + p % half];
  if (p < q_pairs) {
    q[t * q_pairs + p] = rotate(x, cs);
  } else {
    k[t * k_pairs + (p - q_pairs)] = rotate(x, cs);
  }
}
