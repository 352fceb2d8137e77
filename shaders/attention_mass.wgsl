// Attention mass per KV block, for importance (H2O-style) eviction (py/pagedkv/kv_retention.py).
// For each sequence, each query head and each of the sequence's new query tokens (one when decoding), the
// softmax probability of every cached key it may see (causal; a window layer's window), summed per block-table entry:
//   mass[seq, head, entry] += sum over the new tokens t, keys k in block entry of softmax(q_t . k * scale)_k
// The host sums the heads. Dispatched only when eviction is on, once per step, on the last layer's
// rotated queries and keys (the same definition as the numpy reference in kernels/ref_attention_mass.py).
//
// One invocation per (sequence, query head): for each new token, one pass for the softmax max and sum
// (online), a second pass adding each key's probability to its block's total. The mass row of an
// invocation is its own, so no atomics. Keys: blocks of block_size tokens' n_kv_heads rows of HEAD_DIM
// values as u32 words, f32 (bitcast) or f16 packed two per word, laid out as the attention kernels read them.
//
// Dispatch: ceil(num_seqs * n_heads / WORKGROUP_SIZE) workgroups along x.

struct Params {
  num_seqs : u32,
  n_heads : u32,
  n_kv_heads : u32,
  block_size : u32,
  max_blocks_per_seq : u32,  // row stride of block_tables and of mass
  scale : f32,
  window : u32,  // a window layer's: a query sees its last `window` keys, no block before them is read; 0: all
}

@group(0) @binding(0) var<storage, read> query : array<f32>;              // (num_tokens, n_heads, HEAD_DIM)
@group(0) @binding(1) var<storage, read> k_cache : array<u32>;            // (num_blocks, block_size, n_kv_heads, ROW_U32)
@group(0) @binding(2) var<storage, read> block_tables : array<u32>;       // (num_seqs, max_blocks_per_seq)
@group(0) @binding(3) var<storage, read> context_lens : array<u32>;       // (num_seqs,) cached tokens, new ones included
@group(0) @binding(4) var<storage, read> query_start_loc : array<u32>;    // (num_seqs + 1,)
@group(0) @binding(5) var<storage, read_write> mass : array<f32>;         // (num_seqs, n_heads, max_blocks_per_seq)
@group(0) @binding(6) var<uniform> params : Params;

override HEAD_DIM : u32 = 64u;
override KV_F16 : bool = false;
override WORKGROUP_SIZE : u32 = 64u;
override ROW_U32 : u32 = select(HEAD_DIM, HEAD_DIM / 2u, KV_F16);
override BLOCK_U32 : u32 = 0u;  // u32s from one block's start to the next; 0: block_size tokens' rows
override HEAD_MAJOR : bool = true;  // a block keeps each kv head's rows together (paged_kv_read.wgsl)
const SCALES_PER_ROW : u32 = 0u;  // f32 / f16 rows: no scale words
//#include kv_rows.wgsl

fn kv_heads() -> u32 {
  return params.n_kv_heads;
}

const NEG_BIG : f32 = -3.0e38;

fn key_elem(row : u32, i : u32) -> f32 {
  if (KV_F16) {
    let pair = unpack2x16float(k_cache[row + i / 2u]);
    return select(pair.x, pair.y, (i & 1u) == 1u);
  }
  return bitcast<f32>(k_cache[row + i]);
}

// Scaled score of query row q_row (head-major offset) against cached token t of sequence seq.
fn score(seq : u32, kv_head : u32, q_off : u32, t : u32) -> f32 {
  let bs = params.block_size;
  let block = block_tables[seq * params.max_blocks_per_seq + t / bs];
  let row = row_in_block(block_start(block, bs), bs, t % bs, kv_head).x;
  var dot = 0.0;
  for (var i = 0u; i < HEAD_DIM; i++) {
    dot += query[q_off + i] * key_elem(row, i);
  }
  return dot * params.scale;
}

@compute @workgroup_size(WORKGROUP_SIZE)
fn main(@builtin(global_invocation_id) gid : vec3<u32>) {
  let seq = gid.x / params.n_heads;
  let head = gid.x % params.n_heads;
  if (seq >= params.num_seqs) {
    return;
  }
  let kv_head = head / (params.n_heads / params.n_kv_heads);
  let ctx = context_lens[seq];
  let q0 = query_start_loc[seq];
  let q_len = query_start_loc[seq + 1u] - q0;
  let out = (seq * params.n_heads + head) * params.max_blocks_per_seq;
  for (var j = 0u; j < q_len; j++) {
    let q_off = ((q0 + j) * params.n_heads + head) * HEAD_DIM;
    let keys = ctx - q_len + j + 1u;  // causal: new token j sees the cache up to itself
    let first = select(0u, keys - params.window, params.window > 0u && keys > params.window);
    var m = NEG_BIG;
    var l = 0.0;
    for (var t = first; t < keys; t++) {
      let s = score(seq, kv_head, q_off, t);
      let m_new = max(m, s);
      l = l * exp(m - m_new) + exp(s - m_new);
      m = m_new;
    }
    for (var t = first; t < keys; t++) {
      let e = out + t / params.block_size;
      mass[e] = mass[e] + exp(score(seq, kv_head, q_off, t) - m) / l;
    }
  }
}
