// The next token of each sequence drawn on the GPU, so a sampled step reads back token ids, not logits rows:
// pagedkv.sampling.Sampler's draw (temperature, top-p, the request's seeded random number) in f32.
//   temperature <= 0: argmax (lowest id on ties), as argmax.wgsl.
//   else w_i = exp((l_i - max) / temperature) (the logits row is overwritten with w), Z = sum w;
//   top-p < 1 keeps the smallest set of most likely tokens whose mass reaches top_p (filtered_probs: sorted by
//   w, lower id first on ties): its least likely member's w bits, kappa, are the largest u32 k with
//   sum_{bits(w_i) >= k} w_i >= top_p * Z (w >= 0, so u32 order is f32 order), found by bisection over the
//   bits; of the tokens at kappa, the lowest ids that reach the mass are kept;
//   then, in id order, the first kept token whose running mass exceeds u * (the kept mass): numpy's
//   searchsorted(cumsum(probs), u * total, side="right"), u the sampler's rng.random() drawn on the host.
// f32 where numpy works in f64: a draw differs only where u or top_p falls within rounding of a boundary.
// One workgroup per sequence; lanes stride over the row for the sums, own contiguous chunks of ids for the
// id-order draw (their prefix sums meet in workgroup memory). Every barrier sits in uniform control flow: the
// settings and the sums that steer loops are read with workgroupUniformLoad.
//
// Dispatch: (seqs, 1, 1) workgroups.

struct Params {
  vocab : u32,
  seqs : u32,
  _pad0 : u32,
  _pad1 : u32,
}

@group(0) @binding(0) var<storage, read_write> logits : array<f32>;  // (seqs, vocab); left holding w
@group(0) @binding(1) var<storage, read> settings : array<vec4<f32>>;  // (seqs,): temperature, top_p, u, unused
@group(0) @binding(2) var<storage, read_write> out : array<u32>;     // (seqs,) token ids
@group(0) @binding(3) var<uniform> params : Params;

override WORKGROUP_SIZE : u32 = 256u;  // a power of two
const NONE : u32 = 0xffffffffu;

var<workgroup> red_f : array<f32, WORKGROUP_SIZE>;
var<workgroup> red_u : array<u32, WORKGROUP_SIZE>;
var<workgroup> sum_f_out : f32;
var<workgroup> sum_u_out : u32;
var<workgroup> row_settings : vec4<f32>;

// The sum of v over the workgroup, uniform.
fn sum_f(v : f32, lid : u32) -> f32 {
  red_f[lid] = v;
  for (var s = WORKGROUP_SIZE / 2u; s > 0u; s >>= 1u) {
    workgroupBarrier();
    if (lid < s) {
      red_f[lid] += red_f[lid + s];
    }
  }
  workgroupBarrier();
  if (lid == 0u) {
    sum_f_out = red_f[0];
  }
  return workgroupUniformLoad(&sum_f_out);
}

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

// sum of w over the row's tokens whose w bits are >= k.
fn mass_from(base : u32, k : u32, lid : u32) -> f32 {
  var m = 0.0;
  for (var i = lid; i < params.vocab; i += WORKGROUP_SIZE) {
    let w = logits[base + i];
    if (bitcast<u32>(w) >= k) {
      m += w;
    }
  }
  return sum_f(m, lid);
}

@compute @workgroup_size(WORKGROUP_SIZE)
fn main(@builtin(workgroup_id) wid : vec3<u32>, @builtin(local_invocation_index) lid : u32) {
  let s = wid.x;
  if (s >= params.seqs) {  // the whole workgroup
    return;
  }
  if (lid == 0u) {
    row_settings = settings[s];
  }
  let st = workgroupUniformLoad(&row_settings);
  let base = s * params.vocab;
  var top = -3.0e38;
  for (var i = lid; i < params.vocab; i += WORKGROUP_SIZE) {
    top = max(top, logits[base + i]);
  }
  let m = max_f(top, lid);
  if (st.x <= 0.0) {  // greedy: the lowest id holding the max
    var first = NONE;
    for (var i = lid; i < params.vocab; i += WORKGROUP_SIZE) {
      if (logits[base + i] == m) {
        first = min(first, i);
      }
    }
    let id = minmax_u(first, lid, 0u);
    if (lid == 0u) {
      out[s] = id;
    }
    return;
  }
  var z = 0.0;
  for (var i = lid; i < params.vocab; i += WORKGROUP_SIZE) {
    let w = exp((logits[base + i] - m) / st.x);
    logits[base + i] = w;
    z += w;
  }
  let total = sum_f(z, lid);
  // kappa and how many of the tokens at kappa are kept (all: no top-p)
  var kappa = 0u;
  var keep_ties = NONE;
  if (st.y < 1.0) {
    let goal = st.y * total;
    var lo = 0u;  // mass_from(lo) >= goal
    var hi = bitcast<u32>(1.0) + 1u;  // mass_from(hi) < goal (no w exceeds 1)
    var above = 0.0;  // mass_from(hi)
    while (hi - lo > 1u) {
      let mid = lo + (hi - lo) / 2u;
      let mass = mass_from(base, mid, lid);
      if (mass >= goal) {
        lo = mid;
      } else {
        hi = mid;
        above = mass;
      }
    }
    kappa = lo;
    let w_kappa = bitcast<f32>(kappa);
    if (w_kappa > 0.0) {
      keep_ties = u32(clamp(ceil((goal - above) / w_kappa), 1.0, 4.0e9));
    }
  }
  // id order: lane lid owns ids [lid * chunk, lid * chunk + chunk)
  let chunk = (params.vocab + WORKGROUP_SIZE - 1u) / WORKGROUP_SIZE;
  let start = min(lid * chunk, params.vocab);
  let end = min(start + chunk, params.vocab);
  var ties = 0u;
  for (var i = start; i < end; i++) {
    ties += select(0u, 1u, bitcast<u32>(logits[base + i]) == kappa);
  }
  let ties_before = exclusive_u(ties, lid);
  var kept = 0.0;
  var rank = ties_before;
  var last = NONE;
  for (var i = start; i < end; i++) {
    let w = logits[base + i];
    let bits = bitcast<u32>(w);
    if (bits > kappa || (bits == kappa && rank < keep_ties)) {
      kept += w;
      last = i;
    }
    rank += select(0u, 1u, bits == kappa);
  }
  let before = exclusive_f(kept, lid);
  let draw = st.z * sum_f(kept, lid);
  var found = NONE;
  if (before <= draw && draw < before + kept) {
    var running = before;
    rank = ties_before;
    for (var i = start; i < end; i++) {
      let w = logits[base + i];
      let bits = bitcast<u32>(w);
      if (bits > kappa || (bits == kappa && rank < keep_ties)) {
        running += w;
        if (running > draw && found == NONE) {
          found = i;
        }
      }
      rank += select(0u, 1u, bits == kappa);
    }
  }
  let id = minmax_u(found, lid, 0u);
  let fallback = minmax_u(select(last, 0u, last == NONE), lid, 1u);  // rounding: the last kept token
  if (lid == 0u) {
    out[s] = select(id, fallback, id == NONE);
  }
}
