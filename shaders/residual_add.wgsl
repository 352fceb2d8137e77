// Residual add: x[i] += y[i] over one f32 vector (the residual stream after attention / MLP).
// One thread per element; the dispatch covers ceil(n / WORKGROUP_SIZE) workgroups.

struct Params {
  n : u32,
}

@group(0) @binding(0) var<storage, read_write> x : array<f32>;   // (n,)
@group(0) @binding(1) var<storage, read> y : array<f32>;         // (n,)
@group(0) @binding(2) var<uniform> params : Params;

override WORKGROUP_SIZE : u32 = 64u;

@compute @workgroup_size(WORKGROUP_SIZE)
fn main(@builtin(global_invocation_id) gid : vec3<u32>) {
  let i = gid.x;
  if (i < params.n) {
    x[i] = x[i] + y[i];
  }
}
