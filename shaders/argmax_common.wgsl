// Shared by argmax.wgsl (cpu family) and argmax_gpu.wgsl (gpu family), expanded at their
// `//#include argmax_common.wgsl` line: bindings, and each thread's scan of a strided slice of one
// logits row in increasing index order, published in workgroup memory; the including kernel's
// combine(s, lid) writes out[s] from best_*. Logits are assumed finite (no NaN).

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
const NONE : u32 = 0xffffffffu;  // no element: loses every comparison

var<workgroup> best_value : array<f32, WORKGROUP_SIZE>;
var<workgroup> best_index : array<u32, WORKGROUP_SIZE>;

// Whether (v, i) beats (value, index): larger, or equal with the lower index (numpy's rule).
fn beats(v : f32, i : u32, value : f32, index : u32) -> bool {
  return i != NONE && (index == NONE || v > value || (v == value && i < index));
}

// Thread lid's best over row s's indices lid, lid + WORKGROUP_SIZE, ..., stored at best_*[lid].
fn scan(s : u32, lid : u32) {
  let base = s * params.vocab;
  var value = 0.0;  // placeholder until the first element
  var index = NONE;
  for (var i = lid; i < params.vocab; i += WORKGROUP_SIZE) {
    let v = logits[base + i];
    if (index == NONE || v > value) {
      value = v;
      index = i;
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
