// wg_sum for adapters without subgroups (a part of the variants without _sg, shader_variants.py): a
// workgroup-memory tree, log2(WORKGROUP_SIZE) barriers; WORKGROUP_SIZE must be a power of two.
// Call it from uniform control flow only (it holds barriers).

var<workgroup> red : array<vec4<f32>, WORKGROUP_SIZE>;

// The sum of v over the workgroup, returned to every thread.
fn wg_sum(v : vec4<f32>, lid : u32) -> vec4<f32> {
  red[lid] = v;
  workgroupBarrier();
  for (var s = WORKGROUP_SIZE / 2u; s > 0u; s >>= 1u) {
    if (lid < s) {
      red[lid] += red[lid + s];
    }
    workgroupBarrier();
  }
  let total = red[0];
  workgroupBarrier();  // the next call overwrites red
  return total;
}
