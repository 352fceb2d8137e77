// Rotary position embedding in place on q and k, adjacent-pair convention
// (pairs (2i, 2i+1), as GGUF llama weights and numpy_ref.rope_adjacent use).
// cos/sin come from a (max_positions, head_dim/2) table built once on the host
// with the reference's own f32 angles, so no large-angle sin/cos runs on the GPU.
// One thread per (token, head, pair); q heads first, then k heads.

struct Params {
  tokens : u32,
  n_heads : u32,
  n_kv_heads : u32,
  head_dim : u32,
}

@group(0) @binding(0) var<storage, read_write> q : array<vec2<f32>>;  // (tokens, n_heads * head_dim / 2)
@group(0) @binding(1) var<storage, read_write> k : array<vec2<f32>>;  // (tokens, n_kv_heads * head_dim / 2)
@group(0) @binding(2) var<storage, read> positions : array<i32>;      // (tokens,)
@group(0) @binding(3) var<storage, read> cos_sin : array<vec2<f32>>;  // (max_positions, head_dim / 2)
@group(0) @binding(4) var<uniform> params : Params;

override WORKGROUP_SIZE : u32 = 64u;

fn rotate(v : vec2<f32>, cs : vec2<f32>) -> vec2<f32> {
  return vec2<f32>(v.x * cs.x - v.y * cs.y, v.x * cs.y + v.y * cs.x);
}

@compute @workgroup_size(WORKGROUP_SIZE)
fn main(@builtin(global_invocation_id) gid : vec3<u32>) {
  let t = gid.y;
  let half = params.head_dim / 2u;
  let q_pairs = params.n_heads * half;
  let k_pairs = params.n_kv_heads * half;
  let p = gid.x;
  if (t >= params.tokens || p >= q_pairs + k_pairs) {
    return;
  }
  let cs = cos_sin[u32(positions[t]) * half + p % half];
  if (p < q_pairs) {
    let i = t * q_pairs + p;
    q[i] = rotate(q[i], cs);
  } else {
    let i = t * k_pairs + (p - q_pairs);
    k[i] = rotate(k[i], cs);
  }
}
