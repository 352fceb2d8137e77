// The per-dispatch floor (bench/kernels.py): a dispatch of one workgroup that does no work. Its one store is
// never taken (params.flag is 0), so the pass costs only launching it.

struct Params {
  flag : u32,
}

@group(0) @binding(0) var<storage, read_write> out : array<u32>;
@group(0) @binding(1) var<uniform> params : Params;

override WORKGROUP_SIZE : u32 = 1u;

@compute @workgroup_size(WORKGROUP_SIZE)
fn main(@builtin(global_invocation_id) gid : vec3<u32>) {
  if (params.flag != 0u) {
    out[gid.x] = params.flag;
  }
}
