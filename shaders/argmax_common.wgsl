// Shared by argmax.wgsl (cpu family) and argmax_gpu.wgsl (gpu family), expanded at their
// `//#include argmax_common.wgsl` line: bindings, and each thread's scan of a strided slice of one
// logits row in increasing index order, published in workgroup memory; the including kernel's
// combine(s, lid) writes out[s] from best_*. Logits are assumed finite (no NaN).
// WINNERS_OF > 0: row s holds the LM head's per-workgroup winners instead of logits (matvec_io_argmax.wgsl):
// ceil(vocab / WINNERS_OF) pairs (value, f32(index)), in increasing index order, so the scan keeps its rule.

struct Params {
  vocab : u32,
  seqs : u32,
  _pad0 : u32,
  _pad1 : u32,
}

@group(0) @binding(0) var<storage, read> logits : array<f32>;     // (seqs, vocab)
@group(0) @binding(1) var<storage, read_write> out : array<u32>;  // (seqs,)
@group(0) @binding(2) var<uniform> params : Params;

override WORKGROUP_SIZE : u32 = 256u;
override WINNERS_OF : u32 = 0u;
const NONE : u32 = 0xffffffffu;  // no element: loses every comparison

var<workgroup> best_value : array<f32, WORKGROUP_SIZE>;
var<workgroup> best_index : array<u32, WORKGROUP_SIZE>;

// Whether (v, i) beats (value, index): larger, or equal with the lower index (numpy's rule).
fn beats(v : f32, i : u32, value : f32, index : u32) -> bool {
  return i != NONE && (index == NONE || v > value || (v == value && i < index));
}

// Thread lid's best over row s's indices lid, lid + WORKGROUP_SIZE, ..., stored at best_*[lid].
fn scan(s : u32, lid : u32) {
  var count = params.vocab;
  if (WINNERS_OF > 0u) {
    let per = max(WINNERS_OF, 1u);  // Tint folds the division with the constant even where WINNERS_OF is 0
    count = (params.vocab + per - 1u) / per;
  }
  let base = s * count;
  var value = 0.0;  // placeholder until the first element
  var index = NONE;
  for (var i = lid; i < count; i += WORKGROUP_SIZE) {
    var v = logits[base + i];
    var at = i;
    if (WINNERS_OF > 0u) {
      v = logits[2u * (base + i)];
      at = u32(logits[2u * (base + i) + 1u]);
    }
    if (index == NONE || v > value) {
      value = v;
      index = at;
    }
  }
  best_value[lid] = value;
  best_index[lid] = index;
}

@compute @workgroup_size(WORKGROUP_SIZE)
fn main(@builtin(workgroup_id) wid : vec3<u32>, @builtin(local_invocation_index) lid : u32) {
  let s = wid.x;
  if (s >= params.seqs) {  // a whole workgroup: combine() may hold barriers
    return;
  }
  scan(s, lid);
  workgroupBarrier();
  combine(s, lid);
}
