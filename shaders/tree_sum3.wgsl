// The workgroup-memory tree both reduction parts share (`//#include tree_sum3.wgsl` in reduce_tree.wgsl and
// reduce_subgroup.wgsl, which declare its red / red3): reduce_tree's wg_sum3 over the whole workgroup, and the
// gpu-family matvec's ROW_GROUPS > 1 sums over groups of lanes (matvec_gpu_rows.wgsl), which assume nothing
// about subgroups. Uniform control flow only.

// The sums of a, b and c over lid's group of `width` lanes (a power of two dividing WORKGROUP_SIZE: lanes
// lid - lid % width ..), returned to each of them; width WORKGROUP_SIZE adds in wg_sum's order.
fn tree_sum3(a : vec4<f32>, b : vec4<f32>, c : vec4<f32>, lid : u32, width : u32) -> array<vec4<f32>, 3> {
  red[lid] = a;
  red3[2u * lid] = b;
  red3[2u * lid + 1u] = c;
  workgroupBarrier();
  let lane = lid % width;
  for (var s = width / 2u; s > 0u; s >>= 1u) {
    if (lane < s) {
      red[lid] += red[lid + s];
      red3[2u * lid] += red3[2u * (lid + s)];
      red3[2u * lid + 1u] += red3[2u * (lid + s) + 1u];
    }
    workgroupBarrier();
  }
  let first = lid - lane;
  let total = array<vec4<f32>, 3>(red[first], red3[2u * first], red3[2u * first + 1u]);
  workgroupBarrier();  // the next call overwrites red, red3
  return total;
}
