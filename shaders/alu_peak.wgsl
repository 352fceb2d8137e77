// Arithmetic probe for benchmarks: the adapter's f32 multiply-add rate with every operand in registers
// (no loads in the loop), the compute side of the roofline. Each thread runs ITERATIONS x 8 independent
// vec4 multiply-adds (32 lanes of a * m + c) on four chains and writes one sum so nothing is optimized away.

struct Params {
  iterations : u32,
  _pad0 : u32,
  _pad1 : u32,
  _pad2 : u32,
}

@group(0) @binding(0) var<storage, read_write> out : array<f32>;  // (num_workgroups * WORKGROUP_SIZE,)
@group(0) @binding(1) var<uniform> params : Params;

override WORKGROUP_SIZE : u32 = 32u;

@compute @workgroup_size(WORKGROUP_SIZE)
fn main(@builtin(global_invocation_id) gid : vec3<u32>) {
  var a0 = vec4<f32>(f32(gid.x));
  var a1 = a0 + 1.0;
  var a2 = a0 + 2.0;
  var a3 = a0 + 3.0;
  let m = vec4<f32>(0.999);
  let c = vec4<f32>(0.001);
  for (var i = 0u; i < params.iterations; i++) {
    a0 = a0 * m + c;
    a1 = a1 * m + c;
    a2 = a2 * m + c;
    a3 = a3 * m + c;
    a0 = a0 * m + c;
    a1 = a1 * m + c;
    a2 = a2 * m + c;
    a3 = a3 * m + c;
  }
  out[gid.x] = dot(a0 + a1 + a2 + a3, vec4<f32>(1.0));
}
