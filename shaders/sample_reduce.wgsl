// Workgroup reductions of the sampling kernels (sample.wgsl, sample_shape.wgsl): max, min / max, sums and
// exclusive prefix sums over the WORKGROUP_SIZE lanes (a power of two), each result uniform where it steers
// control flow (workgroupUniformLoad), called from uniform control flow only (every one holds barriers); and
// the radix search both kernels' cuts make (sample.wgsl's top-p, sample_shape.wgsl's top-k): the 16 digit sums
// of a value under the 4 bits of its key at `shift`, and the digit those sums select.

var<workgroup> red_f : array<f32, WORKGROUP_SIZE>;
var<workgroup> red_u : array<u32, WORKGROUP_SIZE>;
var<workgroup> red_v : array<vec4<f32>, WORKGROUP_SIZE>;
var<workgroup> sum_v_out : vec4<f32>;
var<workgroup> sum_f_out : f32;
var<workgroup> sum_u_out : u32;

// The max of v over the workgroup, uniform.
fn max_f(v : f32, lid : u32) -> f32 {
  red_f[lid] = v;
  for (var s = WORKGROUP_SIZE / 2u; s > 0u; s >>= 1u) {
    workgroupBarrier();
    if (lid < s) {
      red_f[lid] = max(red_f[lid], red_f[lid + s]);
    }
  }
  workgroupBarrier();
  if (lid == 0u) {
    sum_f_out = red_f[0];
  }
  return workgroupUniformLoad(&sum_f_out);
}

// min (op 0) or max (op 1) of v over the workgroup, uniform.
fn minmax_u(v : u32, lid : u32, op : u32) -> u32 {
  red_u[lid] = v;
  for (var s = WORKGROUP_SIZE / 2u; s > 0u; s >>= 1u) {
    workgroupBarrier();
    if (lid < s) {
      red_u[lid] = select(min(red_u[lid], red_u[lid + s]), max(red_u[lid], red_u[lid + s]), op == 1u);
    }
  }
  workgroupBarrier();
  if (lid == 0u) {
    sum_u_out = red_u[0];
  }
  return workgroupUniformLoad(&sum_u_out);
}

// The sums of v over lanes 0..lid-1 (Hillis-Steele in red_f / red_u; each step reads, then writes).
fn exclusive_f(v : f32, lid : u32) -> f32 {
  workgroupBarrier();
  red_f[lid] = v;
  for (var s = 1u; s < WORKGROUP_SIZE; s <<= 1u) {
    workgroupBarrier();
    let add = select(0.0, red_f[lid - min(s, lid)], lid >= s);
    workgroupBarrier();
    red_f[lid] += add;
  }
  workgroupBarrier();
  return red_f[lid] - v;
}

fn exclusive_u(v : u32, lid : u32) -> u32 {
  workgroupBarrier();
  red_u[lid] = v;
  for (var s = 1u; s < WORKGROUP_SIZE; s <<= 1u) {
    workgroupBarrier();
    let add = select(0u, red_u[lid - min(s, lid)], lid >= s);
    workgroupBarrier();
    red_u[lid] += add;
  }
  workgroupBarrier();
  return red_u[lid] - v;
}

// The sum of v over the workgroup, uniform.
fn sum_f(v : f32, lid : u32) -> f32 {
  return sum_v(vec4<f32>(v, 0.0, 0.0, 0.0), lid).x;
}

fn sum_v(v : vec4<f32>, lid : u32) -> vec4<f32> {
  workgroupBarrier();
  red_v[lid] = v;
  for (var s = WORKGROUP_SIZE / 2u; s > 0u; s >>= 1u) {
    workgroupBarrier();
    if (lid < s) {
      red_v[lid] += red_v[lid + s];
    }
  }
  workgroupBarrier();
  if (lid == 0u) {
    sum_v_out = red_v[0];
  }
  return workgroupUniformLoad(&sum_v_out);
}

struct Digits {
  d0 : vec4<f32>,  // sums of digits 0-3
  d1 : vec4<f32>,
  d2 : vec4<f32>,
  d3 : vec4<f32>,  // digits 12-15
}

// v into its digit's sum (the key's bits (shift + 3)..shift) when the key's bits above them are `prefix` (high:
// their mask).
fn add_key_digit(acc : ptr<function, Digits>, v : f32, key : u32, prefix : u32, high : u32, shift : u32) {
  let d = vec4<u32>((key >> shift) & 15u);
  let z = vec4<f32>(0.0);
  let on = vec4<f32>(select(0.0, v, (key & high) == prefix));
  (*acc).d0 += select(z, on, d == vec4<u32>(0u, 1u, 2u, 3u));
  (*acc).d1 += select(z, on, d == vec4<u32>(4u, 5u, 6u, 7u));
  (*acc).d2 += select(z, on, d == vec4<u32>(8u, 9u, 10u, 11u));
  (*acc).d3 += select(z, on, d == vec4<u32>(12u, 13u, 14u, 15u));
}

fn digit_mass(m : Digits, d : u32) -> f32 {
  let q = select(select(m.d0, m.d1, d >= 4u), select(m.d2, m.d3, d >= 12u), d >= 8u);
  return q[d & 3u];
}

// A radix search's state: the cut's digits found so far (in place), their mask, and the sum over the keys that
// exceed every key under `prefix`.
struct RadixCut {
  prefix : u32,
  high : u32,
  above : f32,
}

// One level of the search from the top: of the digit sums `m` at `shift` (over the keys under cut.prefix), the
// largest digit d whose sum of every key at or above it reaches `goal` (0 when rounding left even digit 0
// short) goes into the prefix, and the digits above d into `above`. The sums at or above a key never grow as
// the key does, so the digit found is the cut's. Uniform when `m` and `goal` are.
fn cut_digit(cut : ptr<function, RadixCut>, m : Digits, goal : f32, shift : u32) {
  var d = 15u;
  var run = 0.0;  // the sum of the digits above d
  loop {
    let here = digit_mass(m, d);
    if ((*cut).above + run + here >= goal || d == 0u) {
      break;
    }
    run += here;
    d -= 1u;
  }
  (*cut).above += run;
  (*cut).prefix |= d << shift;
  (*cut).high |= 15u << shift;
}
