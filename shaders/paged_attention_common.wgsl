// Shared part of paged_attention_main.wgsl and paged_prefill_attention_main.wgsl, pasted in by the host's
// ShaderLibrary at their `//#include paged_attention_common.wgsl` line (WGSL has no includes).
// Not a kernel on its own: it has no entry point.
//
// Work split, for SwiftShader (whose loads from storage and from dynamically indexed private arrays are
// per-lane gathers) and GPUs alike: an invocation owns SLOTS (query token, head) pairs that read the same
// kv head -- decode: consecutive query heads of one GQA group; prefill: consecutive query tokens of one
// head -- so every K/V value it loads serves all of them. It walks the head dimension in slices of 16
// values held in mat4x4 registers with the block's tokens inside, so query and accumulator slices are
// fetched once per block instead of once per token. Measured on SwiftShader: the slices gave ~2-3x over a
// token-outer loop, 3 heads per invocation a further ~2.4x at 4,096 tokens of decode, 4 query tokens per
// invocation ~2.6x for prefill (512-token prompt).

//#include paged_kv_read.wgsl

// MAX_VEC (head_dim / 4 at most) comes from the variant's attention_heads_<128|256>.wgsl part.
// Keys scored and rescaled together: a block of at most MAX_CHUNK keys is one chunk, a longer one (a multiple of
// MAX_CHUNK, GpuKVLayout checks) is walked MAX_CHUNK keys at a time, so `scores` stays this small whatever the block.
const MAX_CHUNK : u32 = 32u;

// The running online-softmax state of the invocation's slots; vec4 component j belongs to slot j
// (components past SLOTS are unused).
var<private> q_base : u32;                                // first query vec4 of slot 0
var<private> q_step : u32;                                // query vec4s from one slot to the next
var<private> live_slots : u32;                            // slots with a real query (prefill tails have fewer)
var<private> slot_keys : vec4<u32>;                       // keys each slot may see: causal limit
var<private> acc : array<vec4<f32>, 4u * MAX_VEC>;        // (SLOTS, VEC_PER_HEAD) sum of exp(score - m) * v
var<private> m : vec4<f32>;                               // running max score
var<private> l : vec4<f32>;                               // running sum of exp(score - m)
var<private> scores : array<vec4<f32>, MAX_CHUNK>;  // one chunk's scores / weights, never the whole context

// Starts the state: slot j is query row q_row + j * row_step and sees keys [0, keys[j]); slots from
// `live` on repeat slot 0 and are never written out.
fn begin_slots(q_row : u32, row_step : u32, live : u32, keys : vec4<u32>) {
  q_base = q_row * VEC_PER_HEAD;
  q_step = row_step * VEC_PER_HEAD;
  live_slots = live;
  slot_keys = keys;
  for (var i = 0u; i < SLOTS * VEC_PER_HEAD; i++) {
    acc[i] = vec4<f32>(0.0);
  }
  m = vec4<f32>(NEG_BIG);
  l = vec4<f32>(0.0);
}
// Slice s of slot j: its query (pre-scaled) or its accumulator.
fn q_slice(j : u32, s : u32) -> mat4x4<f32> {
  if (j >= SLOTS) {
    return mat4x4<f32>();
  }
  let i = q_base + select(0u, j, j < live_slots) * q_step + 4u * s;
  return mat4x4<f32>(query[i], query[i + 1u], query[i + 2u], query[i + 3u]) * params.scale;
}

fn acc_slice(j : u32, s : u32) -> mat4x4<f32> {
  let i = j * VEC_PER_HEAD + 4u * s;
  return mat4x4<f32>(acc[i], acc[i + 1u], acc[i + 2u], acc[i + 3u]);
}

fn set_acc_slice(j : u32, s : u32, a : mat4x4<f32>) {
  let i = j * VEC_PER_HEAD + 4u * s;
  acc[i] = a[0];
  acc[i + 1u] = a[1];
  acc[i + 2u] = a[2];
  acc[i + 3u] = a[3];
}

// Folds keys [block_begin * block_size, n_keys) of blocks [block_begin, block_end) of sequence `seq`
// into the state, a chunk of keys at a time (MAX_CHUNK; a block of at most MAX_CHUNK keys is one chunk): the
// chunk's scores first, then one rescale per chunk rather than one per token. Chunks never straddle a block.
// The `SLOTS > j` tests are on a pipeline constant: the compiler drops the unused slots' code.
// Keys before a slot's window (window_first) are masked like those past its position, and the walk starts at
// the chunk of slot 0's first key, the earliest of the slots' (decode: one position; prefill: slot 0 first).
fn attend_blocks(seq : u32, kv_head : u32, block_begin : u32, block_end : u32, n_keys : u32) {
  let bs = params.block_size;
  let size = min(bs, MAX_CHUNK);
  let per_block = bs / size;  // chunks of a block
  let lo = vec4<u32>(window_first(slot_keys.x), window_first(slot_keys.y), window_first(slot_keys.z),
                     window_first(slot_keys.w));
  for (var c = max(block_begin * per_block, lo.x / size); c < block_end * per_block && c * size < n_keys; c++) {
    let b = c / per_block;
    let first = c * size;  // the chunk's first key; its offset in block b is first - b * bs
    let physical = block_tables[seq * params.max_blocks_per_seq + b];
    let n = min(size, n_keys - first);
    for (var t = 0u; t < n; t++) {
      scores[t] = vec4<f32>(0.0);
    }
    for (var s = 0u; s < HEAD_DIM / 16u; s++) {
      let q0 = q_slice(0u, s);
      let q1 = q_slice(1u, s);
      let q2 = q_slice(2u, s);
      let q3 = q_slice(3u, s);
      for (var t = 0u; t < n; t++) {
        let k = k_slice(kv_row(physical, first - b * bs + t, kv_head), s);
        var sc = vec4<f32>(dot16(q0, k), 0.0, 0.0, 0.0);
        if (SLOTS > 1u) { sc.y = dot16(q1, k); }
        if (SLOTS > 2u) { sc.z = dot16(q2, k); }
        if (SLOTS > 3u) { sc.w = dot16(q3, k); }
        scores[t] += sc;
      }
    }
    var chunk_max = vec4<f32>(NEG_BIG);
    for (var t = 0u; t < n; t++) {
      let pos = vec4<u32>(first + t);
      scores[t] = select(scores[t], vec4<f32>(NEG_BIG), (pos >= slot_keys) | (pos < lo));  // causal mask, window
      chunk_max = max(chunk_max, scores[t]);
    }
    let m_new = max(m, chunk_max);
    let alpha = exp(m - m_new);
    l *= alpha;
    for (var t = 0u; t < n; t++) {
      scores[t] = exp(scores[t] - m_new);  // now the softmax weights of token t
      l += scores[t];
    }
    for (var s = 0u; s < HEAD_DIM / 16u; s++) {
      var a0 = acc_slice(0u, s) * alpha.x;
      var a1 = mat4x4<f32>();
      var a2 = mat4x4<f32>();
      var a3 = mat4x4<f32>();
      if (SLOTS > 1u) { a1 = acc_slice(1u, s) * alpha.y; }
      if (SLOTS > 2u) { a2 = acc_slice(2u, s) * alpha.z; }
      if (SLOTS > 3u) { a3 = acc_slice(3u, s) * alpha.w; }
      for (var t = 0u; t < n; t++) {
        let v = v_slice(kv_row(physical, first - b * bs + t, kv_head), s);
        let w = scores[t];
        a0 += v * w.x;
        if (SLOTS > 1u) { a1 += v * w.y; }
        if (SLOTS > 2u) { a2 += v * w.z; }
        if (SLOTS > 3u) { a3 += v * w.w; }
      }
      set_acc_slice(0u, s, a0);
      if (SLOTS > 1u) { set_acc_slice(1u, s, a1); }
      if (SLOTS > 2u) { set_acc_slice(2u, s, a2); }
      if (SLOTS > 3u) { set_acc_slice(3u, s, a3); }
    }
    m = m_new;
  }
}

// Writes the live slots' normalised outputs to rows out_row + j * row_step of `out`
// (declared by each kernel as (rows, HEAD_DIM / 4) vec4s).
fn write_normalised(out_row : u32, row_step : u32) {
  for (var j = 0u; j < live_slots; j++) {
    for (var i = 0u; i < VEC_PER_HEAD; i++) {
      out[(out_row + j * row_step) * VEC_PER_HEAD + i] = acc[j * VEC_PER_HEAD + i] / l[j];
    }
  }
}
