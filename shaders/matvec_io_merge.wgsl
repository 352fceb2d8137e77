// The io part of the output projection in a decode step (matvec_gpu_*_merge): the flash-decoding merge of
// paged_attention_reduce.wgsl runs in this projection's prologue instead of a dispatch of its own. x is the
// attention output of the decode tokens (one per sequence, so token t is sequence t); a sequence whose
// context spans one partition has its row there already (written by the attention kernel), the others'
// values are merged here from the partitions' states, which the previous dispatch finished writing
// (partition_merge.wgsl, as paged_attention_reduce.wgsl merges them).
// Every workgroup merges the vec4s its lanes read (the whole row: each needs all of it); that costs
// partitions x hidden values read per workgroup, from cache, and saves the merge dispatch.
// Bindings after the matvec's own: context_lens, the partition states and the merge's uniform (the step's
// "reduce" slot, the same words paged_attention_reduce reads). SPLIT_PARTS > 0: the previous layer's fused FFN
// (ffn_gpu_main.wgsl) left its down projection as partials after x's rows in x's buffer (y here: (tokens, rows)
// x, then (SPLIT_PARTS, tokens, rows)), added into x here with the residual (ACCUMULATE: each row of x has one
// reader and writer), in the order this layer's q | k | v read them.

@group(0) @binding(8) var<storage, read> context_lens : array<u32>;    // (num_seqs,)
@group(0) @binding(9) var<storage, read> part_acc : array<vec4<f32>>;  // (num_seqs, max_partitions, n_heads, HEAD_DIM / 4)
@group(0) @binding(10) var<storage, read> part_stats : array<vec2<f32>>;  // (num_seqs, max_partitions, n_heads): (max, sum)
@group(0) @binding(11) var<uniform> merge : MergeParams;  // partition_merge.wgsl

override HEAD_DIM : u32 = 64u;
override SPLIT_PARTS : u32 = 0u;  // the previous layer's FFN partials pending after y's rows (ACCUMULATE only)
// The attention left a state for a single partition too (paged_attention_gpu_fold.wgsl, which has no binding for
// a whole row): merged as one partition, acc * exp(0) / (exp(0) * l), the bits of the row it would have written.
override STATES_ONLY : bool = false;

//#include partition_merge.wgsl
//#include matvec_io_accumulate.wgsl

fn prefetch(t : u32, r0 : u32) {  // x's old rows (ACCUMULATE), loaded while the dot products run
  prefetch_y(t, r0);
  if (!ACCUMULATE || r0 >= params.rows) {
    return;
  }
  for (var i = 0u; i < 8u; i++) {
    let r = min(r0 + i, params.rows - 1u);
    for (var p = 0u; p < SPLIT_PARTS; p++) {
      y_old[i] += y[((p + 1u) * params.tokens + t) * params.rows + r];
    }
  }
}

fn x_gain(v : u32) -> vec4<f32> {  // NORM: the gain stored after the codes
  return gain(v);
}

fn load_x(t : u32, v : u32) -> vec4<f32> {
  let n_parts = partitions_of(context_lens[t], merge);
  if (n_parts <= 1u && !STATES_ONLY) {
    return x[t * (params.cols / 4u) + v];
  }
  let vec_per_head = HEAD_DIM / 4u;
  let first = t * merge.max_partitions * merge.n_heads + v / vec_per_head;  // the state of (t, partition 0, head)
  return merge_partitions(first, n_parts, merge.n_heads, v % vec_per_head);
}

fn store8(t : u32, r0 : u32, lo : vec4<f32>, hi : vec4<f32>) {
  store8_accumulated(t, r0, lo, hi);
}
