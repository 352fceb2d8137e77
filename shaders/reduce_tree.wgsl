// wg_sum for adapters without subgroups (a part of the variants without _sg, shader_variants.py): a
// workgroup-memory tree, log2(WORKGROUP_SIZE) barriers; WORKGROUP_SIZE must be a power of two.
// Call it from uniform control flow only (it holds barriers). wg_sum3 sums three vec4s with the barriers of one
// (the matvec's 8 rows and its NORM sum of squares in one reduction, not three), each in wg_sum's order.

var<workgroup> red : array<vec4<f32>, WORKGROUP_SIZE>;
override RED3 : u32 = 2u * WORKGROUP_SIZE;  // an override of its own: naga sizes no array by an expression
var<workgroup> red3 : array<vec4<f32>, RED3>;  // wg_sum3's second and third sums, slot i at 2 i

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

// The sums of a, b and c over the workgroup, returned to every thread. Uniform control flow only.
fn wg_sum3(a : vec4<f32>, b : vec4<f32>, c : vec4<f32>, lid : u32) -> array<vec4<f32>, 3> {
  return tree_sum3(a, b, c, lid, WORKGROUP_SIZE);
}

//#include tree_sum3.wgsl
