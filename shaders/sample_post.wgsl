// After sample.wgsl drew a shaped row's token (sample_shape.wgsl): its log-prob under the raw logits (raw - lse,
// next to the best ids sample_shape.wgsl listed) and, for a row with presence / frequency penalties, one more
// of it in the request's counts, so the next step (maybe already submitted: decode_chain.py) reads them.
//
// Dispatch: (ceil(seqs / WORKGROUP_SIZE), 1, 1) workgroups, one invocation a row.

struct Params {
  vocab : u32,
  seqs : u32,
  lp_base : u32,  // where the log-probs rows start in `io`, in words
  _pad : u32,
}

struct Row {  // sample_shape.wgsl's
  top_k : u32,
  min_p : f32,
  presence : f32,
  frequency : f32,
  counts : u32,
  bias_start : u32,
  bias_len : u32,
  top_n : u32,
}

@group(0) @binding(0) var<storage, read> logits : array<f32>;  // (seqs, vocab) raw
@group(0) @binding(1) var<storage, read> rows : array<Row>;  // (seqs,)
@group(0) @binding(2) var<storage, read_write> io : array<u32>;  // ids (max seqs,), then (seqs, LP_STRIDE)
@group(0) @binding(3) var<storage, read_write> counts : array<u32>;  // (slots, vocab)
@group(0) @binding(4) var<uniform> params : Params;

override WORKGROUP_SIZE : u32 = 64u;
const NONE : u32 = 0xffffffffu;
const LP_STRIDE : u32 = 42u;

@compute @workgroup_size(WORKGROUP_SIZE)
fn main(@builtin(global_invocation_id) gid : vec3<u32>) {
  let s = gid.x;
  if (s >= params.seqs) {
    return;
  }
  let r = rows[s];
  let id = io[s];
  if (r.top_n != NONE) {
    let out = params.lp_base + s * LP_STRIDE;
    io[out] = bitcast<u32>(logits[s * params.vocab + id] - bitcast<f32>(io[out + 1u]));
  }
  if (r.counts != NONE) {
    counts[r.counts * params.vocab + id] += 1u;
  }
}
