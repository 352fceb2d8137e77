// SwiGLU in place on gate: gate[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)).
// One thread per element; a 2-D dispatch covers more than 65535 workgroups' worth.

struct Params {
  n : u32,
  row_threads : u32,  // threads per dispatch row: num_workgroups.x * WORKGROUP_SIZE
  _pad0 : u32,
  _pad1 : u32,
}

@group(0) @binding(0) var<storage, read_write> gate : array<f32>;  // (tokens, ffn)
@group(0) @binding(1) var<storage, read> up : array<f32>;          // (tokens, ffn)
@group(0) @binding(2) var<uniform> params : Params;

override WORKGROUP_SIZE : u32 = 64u;

@compute @workgroup_size(WORKGROUP_SIZE)
fn main(@builtin(global_invocation_id) gid : vec3<u32>) {
  let i = gid.y * params.row_threads + gid.x;
  if (i < params.n) {
    let g = gate[i];
    gate[i] = g / (1.0 + exp(-g)) * up[i];
  }
}
