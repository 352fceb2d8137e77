// Paged decode attention, flash-decoding pass 2: merges the per-partition softmax states written by
// paged_attention_main.wgsl for every sequence whose context spans more than one partition:
//   M = max_p m_p,  out = sum_p exp(m_p - M) * acc_p / sum_p exp(m_p - M) * l_p.
// One invocation per (sequence, head, 4 output values); sequences with one partition were finished in
// pass 1 and are skipped.
//
// Dispatch: ceil(num_seqs * n_heads * HEAD_DIM / 4 / WORKGROUP_SIZE) workgroups along x.
//
// main_gpu, the gpu family's merge: one workgroup per (sequence, head) whose lanes (p, i) split the
// partitions (p, p + PART_LANES, ...) as well as the head's vec4s i, then meet in workgroup memory, so a
// long context's 64 partitions are not walked by one lane. Dispatch: num_seqs * n_heads workgroups.

@group(0) @binding(0) var<storage, read> context_lens : array<u32>;       // (num_seqs,)
@group(0) @binding(1) var<storage, read> part_acc : array<vec4<f32>>;      // (num_seqs, max_partitions, n_heads, HEAD_DIM / 4)
@group(0) @binding(2) var<storage, read> part_stats : array<vec2<f32>>;    // (num_seqs, max_partitions, n_heads): (max, sum)
@group(0) @binding(3) var<storage, read_write> out : array<vec4<f32>>;     // (num_seqs, n_heads, HEAD_DIM / 4)
@group(0) @binding(4) var<uniform> params : MergeParams;  // partition_merge.wgsl

override HEAD_DIM : u32 = 64u;
override WORKGROUP_SIZE : u32 = 64u;

//#include partition_merge.wgsl

@compute @workgroup_size(WORKGROUP_SIZE)
fn main(@builtin(global_invocation_id) gid : vec3<u32>) {
  let vec_per_head = HEAD_DIM / 4u;
  let i = gid.x % vec_per_head;
  let head = (gid.x / vec_per_head) % params.n_heads;
  let seq = gid.x / (vec_per_head * params.n_heads);
  if (seq >= params.num_seqs) {
    return;
  }
  let n_parts = partitions_of(context_lens[seq], params);
  if (n_parts <= 1u) {
    return;
  }
  let first_state = seq * params.max_partitions * params.n_heads + head;
  out[(seq * params.n_heads + head) * vec_per_head + i] = merge_partitions(first_state, n_parts, params.n_heads, i);
}

override PART_LANES : u32 = WORKGROUP_SIZE / (HEAD_DIM / 4u);  // main_gpu: lanes sharing a vec4 of the output

var<workgroup> merged : array<vec4<f32>, WORKGROUP_SIZE>;  // main_gpu: (PART_LANES, HEAD_DIM / 4) partial sums
var<workgroup> merged_total : array<f32, WORKGROUP_SIZE>;  // main_gpu: their weights' sums

@compute @workgroup_size(WORKGROUP_SIZE)
fn main_gpu(@builtin(workgroup_id) wid : vec3<u32>, @builtin(local_invocation_index) lid : u32) {
  let vec_per_head = HEAD_DIM / 4u;
  let i = lid % vec_per_head;
  let lane = lid / vec_per_head;
  let head = wid.x % params.n_heads;
  let seq = wid.x / params.n_heads;
  let n_parts = partitions_of(context_lens[min(seq, params.num_seqs - 1u)], params);
  if (seq >= params.num_seqs || n_parts <= 1u) {
    return;  // the whole workgroup (uniform inputs only)
  }
  let first_state = seq * params.max_partitions * params.n_heads + head;
  var m = -3.0e38;
  for (var p = 0u; p < n_parts; p++) {  // every lane: the same broadcast reads, the same max
    m = max(m, part_stats[first_state + p * params.n_heads].x);
  }
  var total = 0.0;
  var sum = vec4<f32>(0.0);
  for (var p = lane; p < n_parts && lane < PART_LANES; p += PART_LANES) {
    let state = first_state + p * params.n_heads;
    let w = exp(part_stats[state].x - m);
    total += w * part_stats[state].y;
    sum += w * part_acc[state * vec_per_head + i];
  }
  merged[lid] = sum;
  merged_total[lid] = total;
  workgroupBarrier();
  if (lid >= vec_per_head) {
    return;
  }
  for (var r = 1u; r < PART_LANES; r++) {
    sum += merged[r * vec_per_head + i];
    total += merged_total[r * vec_per_head + i];
  }
  out[(seq * params.n_heads + head) * vec_per_head + i] = sum / total;
}
