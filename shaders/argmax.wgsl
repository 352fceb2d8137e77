// Greedy sampling on the GPU: out[s] = argmax of logits row s, lowest index on
// ties (numpy's rule), so decode reads back one u32 per sequence instead of the
// whole (vocab,) f32 row. One workgroup per sequence: each thread scans a strided
// slice in increasing index order, one barrier publishes the per-thread winners,
// and thread 0 combines them. Logits are assumed finite (no NaN).

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

var<workgroup> best_value : array<f32, WORKGROUP_SIZE>;
var<workgroup> best_index : array<u32, WORKGROUP_SIZE>;

@compute @workgroup_size(WORKGROUP_SIZE)
fn main(@builtin(workgroup_id) wid : vec3<u32>, @builtin(local_invocation_index) lid : u32) {
  let s = wid.x;
  if (s >= params.seqs) {
    return;
  }
  let base = s * params.vocab;
  var value = 0.0;  // placeholder until the first element (index sentinel below)
  var index = 0xffffffffu;  // no element: loses every comparison below
  for (var i = lid; i < params.vocab; i += WORKGROUP_SIZE) {
    let v = logits[base + i];
    if (index == 0xffffffffu || v > value) {
      value = v;
      index = i;
    }
  }
  best_value[lid] = value;
  best_index[lid] = index;
  workgroupBarrier();
  if (lid == 0u) {
    for (var j = 1u; j < WORKGROUP_SIZE; j++) {
      let v = best_value[j];
      let i = best_index[j];
      if (i != 0xffffffffu && (v > value || (v == value && i < index))) {
        value = v;
        index = i;
      }
    }
    out[s] = index;
  }
}
