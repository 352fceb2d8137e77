// wg_sum with subgroup operations (a part of the _sg variants, shader_variants.py, which start the kernel
// with `enable subgroups;`): subgroupAdd within each subgroup, then each subgroup's sum in workgroup
// memory at the slot of its lowest local invocation index (its head, subgroupMin(lid)), which also sets
// the head's bit in a mask of heads; after a barrier every thread adds the slots of the set bits in
// ascending order. Nothing is assumed about which invocations share a subgroup or how large one is (WGSL
// promises neither: Intel picks 8, 16 or 32 per pipeline, AMD 32 or 64, Adreno 64 or 128). Where subgroup
// g holds invocations g * size .. g * size + size - 1 (Dawn's usual one-dimensional layout) the heads are
// 0, size, 2 size, ... and the sum is added in the order it always was; the order depends on the layout
// alone, never on timing, so a device gives the same bits every run.
// The mask is cleared at the start of each call, a barrier before it is set: nothing rests on workgroup
// memory starting zeroed (a version that did passed alone on lavapipe, failed after other kernels). WORKGROUP_SIZE
// <= 1024. Call it from uniform control flow only (three barriers).
// wg_sum3 sums three vec4s with the same three barriers (the matvec's 8 rows and its NORM sum of squares meet
// in one reduction, not three), each in the order wg_sum adds it: the same bits as three wg_sum calls.

const HEAD_WORDS : u32 = 32u;  // 1024 invocations, one bit each

var<workgroup> red : array<vec4<f32>, WORKGROUP_SIZE>;  // slot h: the sum of the subgroup headed by h
var<workgroup> heads : array<atomic<u32>, HEAD_WORDS>;  // bit b of word w: invocation 32 w + b is a head
override RED3 : u32 = 2u * WORKGROUP_SIZE;  // an override of its own: naga sizes no array by an expression
var<workgroup> red3 : array<vec4<f32>, RED3>;  // wg_sum3's second and third sums, slot h at 2 h

// Sets the bits of the subgroup heads in `heads` (cleared first: nothing rests on workgroup memory starting
// zeroed) after the caller's head stored its sums; two barriers, the second before `heads` is read.
fn mark_heads(lid : u32, head : u32) {
  let words = (WORKGROUP_SIZE + 31u) / 32u;
  if (lid < words) {
    atomicStore(&heads[lid], 0u);
  }
  workgroupBarrier();
  if (lid == head) {
    atomicOr(&heads[lid / 32u], 1u << (lid % 32u));
  }
  workgroupBarrier();
}

// The sum of v over the workgroup, returned to every thread.
fn wg_sum(v : vec4<f32>, lid : u32) -> vec4<f32> {
  let part = subgroupAdd(v);
  let head = subgroupMin(lid);
  if (lid == head) {
    red[lid] = part;
  }
  mark_heads(lid, head);
  var total = vec4<f32>(0.0);
  for (var w = 0u; w < (WORKGROUP_SIZE + 31u) / 32u; w++) {
    var m = atomicLoad(&heads[w]);
    while (m != 0u) {
      total += red[32u * w + countTrailingZeros(m)];
      m &= m - 1u;
    }
  }
  workgroupBarrier();  // the next call clears heads and overwrites red
  return total;
}

// The sums of a, b and c over the workgroup, returned to every thread. Uniform control flow only.
fn wg_sum3(a : vec4<f32>, b : vec4<f32>, c : vec4<f32>, lid : u32) -> array<vec4<f32>, 3> {
  let pa = subgroupAdd(a);
  let pb = subgroupAdd(b);
  let pc = subgroupAdd(c);
  let head = subgroupMin(lid);
  if (lid == head) {
    red[lid] = pa;
    red3[2u * lid] = pb;
    red3[2u * lid + 1u] = pc;
  }
  mark_heads(lid, head);
  var total = array<vec4<f32>, 3>(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
  for (var w = 0u; w < (WORKGROUP_SIZE + 31u) / 32u; w++) {
    var m = atomicLoad(&heads[w]);
    while (m != 0u) {
      let h = 32u * w + countTrailingZeros(m);
      total[0] += red[h];
      total[1] += red3[2u * h];
      total[2] += red3[2u * h + 1u];
      m &= m - 1u;
    }
  }
  workgroupBarrier();  // the next call clears heads and overwrites red, red3
  return total;
}

//#include tree_sum3.wgsl
