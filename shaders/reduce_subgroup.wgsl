// wg_sum with subgroup operations (a part of the _sg variants, shader_variants.py, which start the kernel
// with `enable subgroups;`): subgroupAdd within each subgroup, then one slot per subgroup
// in workgroup memory, summed by every thread after one barrier. Assumes what Dawn's backends do for a
// one-dimensional workgroup: subgroup g holds local invocations g * size .. g * size + size - 1 (the
// browser tests check the sums on SwiftShader). Call it from uniform control flow only.

var<workgroup> red : array<vec4<f32>, WORKGROUP_SIZE>;

// The sum of v over the workgroup, returned to every thread.
fn wg_sum(v : vec4<f32>, lid : u32) -> vec4<f32> {
  let part = subgroupAdd(v);
  let size = subgroupAdd(1u);  // the subgroup size, without the subgroup_size builtin in main's signature
  if (subgroupExclusiveAdd(1u) == 0u) {
    red[lid / size] = part;
  }
  workgroupBarrier();
  var total = vec4<f32>(0.0);
  for (var g = 0u; g < (WORKGROUP_SIZE + size - 1u) / size; g++) {
    total += red[g];
  }
  workgroupBarrier();  // the next call overwrites red
  return total;
}
