// The logits a shaped draw reads, before sample.wgsl draws from them: pagedkv.sampling's order on each row of
// raw logits, written into `shaped` (the raw row stays for the log-probs):
//   log-probs (top_n != NONE): lse = log sum exp(raw) and the top_n best ids of the raw row (value descending,
//     lower id first on ties), found one per pass (each pass the best after the one before), as
//     pagedkv.logprobs.token_logprob lists them; the chosen token's own comes in sample_post.wgsl;
//   logit bias and penalties: shaped = (raw + bias) - presence * (count > 0) - frequency * count, the counts of
//     the ids this request generated (a (slots, vocab) table sample_post.wgsl keeps on the device);
//   min-p and top-k (temperature > 0 only): an id whose w = exp((l - max) / temperature) (sample.wgsl's weight)
//     is below min_p, or that is not among the top_k best (lower ids first on ties), gets DROPPED, so
//     sample.wgsl gives it w = 0 and top-p reads the mass of what min-p and top-k kept.
// top-k's cut is the k-th largest value's order key (f32 bits mapped so u32 order is f32 order), found 4 bits a
// pass from the top by counting the keys under each digit (8 passes over the row, as sample.wgsl's top-p cut);
// of the ids at the cut, the lowest ids that make k are kept (each lane's contiguous chunk, ranked by a prefix
// sum).
// f32 where numpy works in f64: an id differs only where rounding moves it across a cut.
//
// Dispatch: (seqs, 1, 1) workgroups.

struct Params {
  vocab : u32,
  seqs : u32,
  lp_base : u32,  // where the log-probs rows start in `io`, in words (after the ids of max_num_seqs rows)
  _pad : u32,
}

struct Row {
  top_k : u32,  // 0: off
  min_p : f32,  // 0: off
  presence : f32,
  frequency : f32,
  counts : u32,  // the row's slot in `counts`; NONE: no presence / frequency penalty
  bias_start : u32,  // the row's (id, bias bits) pairs: bias[bias_start .. bias_start + bias_len)
  bias_len : u32,
  top_n : u32,  // NONE: no log-probs; else how many best ids to list (0..20)
}

@group(0) @binding(0) var<storage, read> logits : array<f32>;  // (seqs, vocab) raw
@group(0) @binding(1) var<storage, read> settings : array<vec4<f32>>;  // (seqs,): temperature, top_p, u, 0
@group(0) @binding(2) var<storage, read> rows : array<Row>;  // (seqs,)
@group(0) @binding(3) var<storage, read> bias : array<vec2<u32>>;  // (pairs,): id, bitcast<u32>(bias)
@group(0) @binding(4) var<storage, read> counts : array<u32>;  // (slots, vocab)
@group(0) @binding(5) var<storage, read_write> shaped : array<f32>;  // (seqs, vocab)
@group(0) @binding(6) var<storage, read_write> io : array<u32>;  // ids (max seqs,), then (seqs, LP_STRIDE) log-probs
@group(0) @binding(7) var<uniform> params : Params;

override WORKGROUP_SIZE : u32 = 256u;  // a power of two
const NONE : u32 = 0xffffffffu;
const DROPPED : f32 = -3.0e38;  // exp((DROPPED - max) / temperature) is 0 for every temperature allowed
const LP_STRIDE : u32 = 42u;  // chosen log-prob, lse, 20 ids, 20 log-probs
const MAX_TOP : u32 = 20u;

//#include sample_reduce.wgsl

var<workgroup> row_out : Row;
var<workgroup> st_out : vec4<f32>;

// The order key of an f32: u32 order is the floats' order (negatives flipped whole, positives above them).
fn order_key(v : f32) -> u32 {
  let bits = bitcast<u32>(v);
  return select(bits | 0x80000000u, ~bits, (bits >> 31u) == 1u);
}

fn penalty(r : Row, i : u32) -> f32 {
  if (r.counts == NONE) {
    return 0.0;
  }
  let c = counts[r.counts * params.vocab + i];
  return r.presence * select(0.0, 1.0, c > 0u) + r.frequency * f32(c);
}

// The workgroup's best (value, lowest id) of the raw row strictly after (pv, pid) in the listing order.
fn next_best(base : u32, pv : f32, pid : u32, first : bool, lid : u32) -> vec2<u32> {
  var best = -3.4e38;
  for (var i = lid; i < params.vocab; i += WORKGROUP_SIZE) {
    let v = logits[base + i];
    if (first || v < pv || (v == pv && i > pid)) {
      best = max(best, v);
    }
  }
  let m = max_f(best, lid);
  var id = NONE;
  for (var i = lid; i < params.vocab; i += WORKGROUP_SIZE) {
    let v = logits[base + i];
    if (v == m && (first || v < pv || i > pid)) {
      id = min(id, i);
    }
  }
  return vec2<u32>(bitcast<u32>(m), minmax_u(id, lid, 0u));
}

fn log_probs(s : u32, base : u32, top_n : u32, lid : u32) {
  var m = -3.4e38;
  for (var i = lid; i < params.vocab; i += WORKGROUP_SIZE) {
    m = max(m, logits[base + i]);
  }
  m = max_f(m, lid);
  var z = 0.0;
  for (var i = lid; i < params.vocab; i += WORKGROUP_SIZE) {
    z += exp(logits[base + i] - m);
  }
  let lse = m + log(sum_f(z, lid));
  let out = params.lp_base + s * LP_STRIDE;
  var pv = 0.0;
  var pid = NONE;
  for (var k = 0u; k < min(top_n, MAX_TOP); k++) {  // uniform: top_n is the row's
    let best = next_best(base, pv, pid, k == 0u, lid);
    pv = bitcast<f32>(best.x);
    pid = best.y;
    if (lid == 0u) {
      io[out + 2u + k] = pid;
      io[out + 2u + MAX_TOP + k] = bitcast<u32>(pv - lse);
    }
  }
  if (lid == 0u) {
    io[out + 1u] = bitcast<u32>(lse);
  }
}

// Over the shaped row's ids whose order keys' bits above `shift + 4` are `prefix` (high: their mask), how many
// have each value of the key's bits (shift + 3)..shift (uniform; f32 sums of counts below 2^24 are exact).
fn digit_counts(base : u32, prefix : u32, high : u32, shift : u32, lid : u32) -> Digits {
  var acc = Digits(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
  for (var i = lid; i < params.vocab; i += WORKGROUP_SIZE) {
    add_key_digit(&acc, 1.0, order_key(shaped[base + i]), prefix, high, shift);
  }
  return Digits(sum_v(acc.d0, lid), sum_v(acc.d1, lid), sum_v(acc.d2, lid), sum_v(acc.d3, lid));
}

// Drop every id outside the top_k best of the shaped row (lower ids first among equal values).
fn top_k(base : u32, k : u32, lid : u32) {
  // the k-th best's key, `cut`: the largest key with at least k ids at or above it, a digit a pass from the top
  // (8 passes: cut_digit, as sample.wgsl finds the top-p cut); cut.above counts the ids whose keys exceed it
  var cut = RadixCut(0u, 0u, 0.0);
  let goal = f32(k);
  for (var level = 0u; level < 8u; level++) {  // uniform: every lane holds the same counts
    let shift = 28u - 4u * level;
    cut_digit(&cut, digit_counts(base, cut.prefix, cut.high, shift, lid), goal, shift);
  }
  let keep_ties = k - u32(cut.above);
  let n = params.vocab;
  let chunk = (n + WORKGROUP_SIZE - 1u) / WORKGROUP_SIZE;
  let start = min(lid * chunk, n);
  let end = min(start + chunk, n);
  var ties = 0u;
  for (var i = start; i < end; i++) {
    ties += select(0u, 1u, order_key(shaped[base + i]) == cut.prefix);
  }
  var rank = exclusive_u(ties, lid);
  for (var i = start; i < end; i++) {
    let key = order_key(shaped[base + i]);
    if (key < cut.prefix || (key == cut.prefix && rank >= keep_ties)) {
      shaped[base + i] = DROPPED;
    }
    rank += select(0u, 1u, key == cut.prefix);
  }
}

@compute @workgroup_size(WORKGROUP_SIZE)
fn main(@builtin(workgroup_id) wid : vec3<u32>, @builtin(local_invocation_index) lid : u32) {
  let s = wid.x;
  if (s >= params.seqs) {  // the whole workgroup
    return;
  }
  if (lid == 0u) {
    row_out = rows[s];
    st_out = settings[s];
  }
  let r = workgroupUniformLoad(&row_out);
  let st = workgroupUniformLoad(&st_out);
  let base = s * params.vocab;
  if (r.top_n != NONE) {
    log_probs(s, base, r.top_n, lid);
  }
  for (var i = lid; i < params.vocab; i += WORKGROUP_SIZE) {
    shaped[base + i] = logits[base + i] - penalty(r, i);
  }
  storageBarrier();
  for (var j = lid; j < r.bias_len; j += WORKGROUP_SIZE) {  // distinct ids: no two lanes write one
    let pair = bias[r.bias_start + j];
    shaped[base + pair.x] = (logits[base + pair.x] + bitcast<f32>(pair.y)) - penalty(r, pair.x);
  }
  storageBarrier();
  if (st.x <= 0.0) {  // greedy: sample.wgsl takes the argmax of the shaped row
    return;
  }
  if (r.min_p > 0.0) {
    var m = -3.4e38;
    for (var i = lid; i < params.vocab; i += WORKGROUP_SIZE) {
      m = max(m, shaped[base + i]);
    }
    m = max_f(m, lid);
    for (var i = lid; i < params.vocab; i += WORKGROUP_SIZE) {
      if (exp((shaped[base + i] - m) / st.x) < r.min_p) {
        shaped[base + i] = DROPPED;
      }
    }
    storageBarrier();
  }
  if (r.top_k > 0u && r.top_k < params.vocab) {
    top_k(base, r.top_k, lid);
  }
}
