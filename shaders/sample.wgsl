// The next token of each sequence drawn on the GPU, so a sampled step reads back token ids, not logits rows:
// pagedkv.sampling.Sampler's draw (temperature, top-p, the request's seeded random number) in f32.
//   temperature <= 0: argmax (lowest id on ties), as argmax.wgsl.
//   else w_i = exp((l_i - max) / temperature) (the logits row is overwritten with w), Z = sum w;
//   top-p < 1 keeps the smallest set of most likely tokens whose mass reaches top_p (filtered_probs: sorted by
//   w, lower id first on ties): its least likely member's w bits, kappa, are the largest u32 k with
//   S(k) = sum_{bits(w_i) >= k} w_i >= top_p * Z (w >= 0, so u32 order is f32 order), found a 4-bit digit at a
//   time from the top (8 passes over the row, each summing w into the 16 digits under the prefix found so far:
//   S is non-increasing, so the largest digit whose S reaches the goal is kappa's); of the tokens at kappa,
//   the lowest ids that reach the mass are kept;
//   then, in id order, the first kept token whose running mass exceeds u * (the kept mass): numpy's
//   searchsorted(cumsum(probs), u * total, side="right"), u the sampler's rng.random() drawn on the host.
// f32 where numpy works in f64: a draw differs only where u or top_p falls within rounding of a boundary.
// One workgroup per sequence; lanes stride over the row for the sums, own contiguous chunks of ids for the
// id-order draw. Every pass loads 4 tokens a trip: a real GPU runs one workgroup per row, so the latency of
// its loads, not bandwidth, is the cost (on the H200 a pass of one load a trip took ~20 us) (their prefix sums meet in workgroup memory). Every barrier sits in uniform control flow: the
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

//#include sample_reduce.wgsl

var<workgroup> row_settings : vec4<f32>;

// w into its digit's sum (bits (shift + 3)..shift) when its bits above them are `prefix`.
fn add_digit(acc : ptr<function, Digits>, w : f32, prefix : u32, high : u32, shift : u32) {
  add_key_digit(acc, w, bitcast<u32>(w), prefix, high, shift);
}

// Over the row's tokens whose bits above `shift + 4` are `prefix` (high: those bits' mask), the mass of each
// value of bits (shift + 3)..shift, summed over the workgroup (uniform).
fn digit_masses(base : u32, prefix : u32, high : u32, shift : u32, lid : u32) -> Digits {
  var acc = Digits(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
  let n = params.vocab;
  var i = lid;
  for (; i + 3u * WORKGROUP_SIZE < n; i += 4u * WORKGROUP_SIZE) {  // four independent loads a trip
    let w0 = logits[base + i];
    let w1 = logits[base + i + WORKGROUP_SIZE];
    let w2 = logits[base + i + 2u * WORKGROUP_SIZE];
    let w3 = logits[base + i + 3u * WORKGROUP_SIZE];
    add_digit(&acc, w0, prefix, high, shift);
    add_digit(&acc, w1, prefix, high, shift);
    add_digit(&acc, w2, prefix, high, shift);
    add_digit(&acc, w3, prefix, high, shift);
  }
  for (; i < n; i += WORKGROUP_SIZE) {
    add_digit(&acc, logits[base + i], prefix, high, shift);
  }
  return Digits(sum_v(acc.d0, lid), sum_v(acc.d1, lid), sum_v(acc.d2, lid), sum_v(acc.d3, lid));
}

// Four of a lane's strided ids from i (i, i + WORKGROUP_SIZE, ...; the caller keeps i + 3 WORKGROUP_SIZE in the
// row): four independent loads in flight, where a GPU's lone workgroup would otherwise wait on each.
fn strided4(base : u32, i : u32) -> vec4<f32> {
  return vec4<f32>(logits[base + i], logits[base + i + WORKGROUP_SIZE], logits[base + i + 2u * WORKGROUP_SIZE],
                   logits[base + i + 3u * WORKGROUP_SIZE]);
}

// Ids i .. i + 3 of a lane's chunk (the caller keeps i + 3 in it).
fn run4(base : u32, i : u32) -> vec4<f32> {
  return vec4<f32>(logits[base + i], logits[base + i + 1u], logits[base + i + 2u], logits[base + i + 3u]);
}

// Token i (weight w) in id order: kept when above kappa or among the first keep_ties tokens at kappa.
fn kept_at(w : f32, kappa : u32, keep_ties : u32, rank : ptr<function, u32>) -> bool {
  let bits = bitcast<u32>(w);
  let keep = bits > kappa || (bits == kappa && *rank < keep_ties);
  *rank += select(0u, 1u, bits == kappa);
  return keep;
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
  let n = params.vocab;
  var top4 = vec4<f32>(-3.0e38);
  var i = lid;
  for (; i + 3u * WORKGROUP_SIZE < n; i += 4u * WORKGROUP_SIZE) {
    top4 = max(top4, strided4(base, i));
  }
  for (; i < n; i += WORKGROUP_SIZE) {
    top4.x = max(top4.x, logits[base + i]);
  }
  let m = max_f(max(max(top4.x, top4.y), max(top4.z, top4.w)), lid);
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
  var z4 = vec4<f32>(0.0);
  i = lid;
  for (; i + 3u * WORKGROUP_SIZE < n; i += 4u * WORKGROUP_SIZE) {
    let w = exp((strided4(base, i) - m) / st.x);
    logits[base + i] = w.x;
    logits[base + i + WORKGROUP_SIZE] = w.y;
    logits[base + i + 2u * WORKGROUP_SIZE] = w.z;
    logits[base + i + 3u * WORKGROUP_SIZE] = w.w;
    z4 += w;
  }
  for (; i < n; i += WORKGROUP_SIZE) {
    let w = exp((logits[base + i] - m) / st.x);
    logits[base + i] = w;
    z4.x += w;
  }
  // Lanes read other lanes' w below (the id-order chunks): storage needs its own barrier, workgroupBarrier()
  // orders workgroup memory only (NVIDIA happens to order both; WebGPU promises neither).
  storageBarrier();
  let total = sum_f((z4.x + z4.y) + (z4.z + z4.w), lid);
  // kappa and how many of the tokens at kappa are kept (all: no top-p)
  var kappa = 0u;
  var keep_ties = NONE;
  if (st.y < 1.0) {
    let goal = st.y * total;
    var cut = RadixCut(0u, 0u, 0.0);  // above: S(prefix | ~high + 1), the mass over every value under prefix
    for (var level = 0u; level < 8u; level++) {  // uniform: every lane holds the same sums
      let shift = 28u - 4u * level;
      cut_digit(&cut, digit_masses(base, cut.prefix, cut.high, shift, lid), goal, shift);
    }
    let above = cut.above;
    kappa = cut.prefix;
    let w_kappa = bitcast<f32>(kappa);
    if (w_kappa > 0.0) {
      keep_ties = u32(clamp(ceil((goal - above) / w_kappa), 1.0, 4.0e9));
    }
  }
  // id order: lane lid owns ids [lid * chunk, lid * chunk + chunk)
  let chunk = (n + WORKGROUP_SIZE - 1u) / WORKGROUP_SIZE;
  let start = min(lid * chunk, n);
  let end = min(start + chunk, n);
  var ties = 0u;
  i = start;
  for (; i + 4u <= end; i += 4u) {
    let at = select(vec4<u32>(0u), vec4<u32>(1u), bitcast<vec4<u32>>(run4(base, i)) == vec4<u32>(kappa));
    ties += dot(at, vec4<u32>(1u));
  }
  for (; i < end; i++) {
    ties += select(0u, 1u, bitcast<u32>(logits[base + i]) == kappa);
  }
  let ties_before = exclusive_u(ties, lid);
  var kept = 0.0;
  var rank = ties_before;
  var last = NONE;
  i = start;
  for (; i + 4u <= end; i += 4u) {
    let w4 = run4(base, i);
    for (var k = 0u; k < 4u; k++) {
      if (kept_at(w4[k], kappa, keep_ties, &rank)) {
        kept += w4[k];
        last = i + k;
      }
    }
  }
  for (; i < end; i++) {
    let w = logits[base + i];
    if (kept_at(w, kappa, keep_ties, &rank)) {
      kept += w;
      last = i;
    }
  }
  let before = exclusive_f(kept, lid);
  let draw = st.z * sum_f(kept, lid);
  var found = NONE;
  if (before <= draw && draw < before + kept) {  // this lane's chunk holds the draw: walk it again
    var running = before;
    rank = ties_before;
    i = start;
    for (; i + 4u <= end && found == NONE; i += 4u) {
      let w4 = run4(base, i);
      for (var k = 0u; k < 4u; k++) {
        if (found == NONE && kept_at(w4[k], kappa, keep_ties, &rank)) {
          running += w4[k];
          if (running > draw) {
            found = i + k;
          }
        }
      }
    }
    for (; i < end && found == NONE; i++) {
      let w = logits[base + i];
      if (kept_at(w, kappa, keep_ties, &rank)) {
        running += w;
        if (running > draw) {
          found = i;
        }
      }
    }
  }
  let id = minmax_u(found, lid, 0u);
  let fallback = minmax_u(select(last, 0u, last == NONE), lid, 1u);  // rounding: the last kept token
  if (lid == 0u) {
    out[s] = select(id, fallback, id == NONE);
  }
}
