// Shared part of paged_attention.wgsl and paged_prefill_attention.wgsl, pasted in by the host's
// ShaderLibrary at their `//#include paged_attention_common.wgsl` line (WGSL has no includes).
// Not a kernel on its own: it has no entry point.
//
// KV cache of one layer, K and V alike: (num_blocks, block_size, n_kv_heads, HEAD_DIM) values, stored as
// array<vec4<u32>> words so that one pipeline constant picks the element type without a second binding type:
//   KV_F16 = false: a word is 4 f32 (bitcast), a row of HEAD_DIM values is HEAD_DIM / 4 words;
//   KV_F16 = true:  a word is 8 f16 packed two per u32 (unpack2x16float; no shader-f16 needed),
//                   a row is HEAD_DIM / 8 words.
// Token `pos` of a sequence lives in block block_tables[seq, pos / block_size] at offset pos % block_size.

struct Params {
  num_seqs : u32,
  n_heads : u32,
  n_kv_heads : u32,
  block_size : u32,          // tokens per block, <= MAX_BLOCK_SIZE
  max_blocks_per_seq : u32,  // row stride of block_tables
  partition_blocks : u32,    // flash-decoding: blocks per partition (decode only)
  max_partitions : u32,      // partition stride of the decode scratch buffers (decode only)
  scale : f32,               // softmax scale, usually 1 / sqrt(HEAD_DIM)
}

@group(0) @binding(0) var<storage, read> query : array<vec4<f32>>;     // (num_q_tokens, n_heads, HEAD_DIM / 4)
@group(0) @binding(1) var<storage, read> k_cache : array<vec4<u32>>;   // (num_blocks, block_size, n_kv_heads, ROW_WORDS)
@group(0) @binding(2) var<storage, read> v_cache : array<vec4<u32>>;   // (num_blocks, block_size, n_kv_heads, ROW_WORDS)
@group(0) @binding(3) var<storage, read> block_tables : array<u32>;    // (num_seqs, max_blocks_per_seq)
@group(0) @binding(4) var<storage, read> context_lens : array<u32>;    // (num_seqs,) tokens in the cache, new ones included
@group(0) @binding(5) var<uniform> params : Params;

override HEAD_DIM : u32 = 64u;     // multiple of 8, <= 4 * MAX_VEC
override KV_F16 : bool = false;
override WORKGROUP_SIZE : u32 = 16u;
override ROW_WORDS : u32 = select(HEAD_DIM / 4u, HEAD_DIM / 8u, KV_F16);

const MAX_VEC : u32 = 32u;         // head_dim up to 128
const MAX_BLOCK_SIZE : u32 = 32u;
const NEG_BIG : f32 = -3.0e38;     // finite "minus infinity": exp(NEG_BIG - m) is 0, never NaN

// The running online-softmax state of the one (query token, head) this invocation owns.
var<private> q : array<vec4<f32>, MAX_VEC>;        // the query, pre-multiplied by params.scale
var<private> acc : array<vec4<f32>, MAX_VEC>;      // sum of exp(score - m) * v, unnormalised
var<private> m : f32;                              // running max score
var<private> l : f32;                              // running sum of exp(score - m)
var<private> scores : array<f32, MAX_BLOCK_SIZE>;  // one block's scores, never the whole context

fn load_query(q_row : u32) {
  for (var i = 0u; i < HEAD_DIM / 4u; i++) {
    q[i] = query[q_row * (HEAD_DIM / 4u) + i] * params.scale;
    acc[i] = vec4<f32>(0.0);
  }
  m = NEG_BIG;
  l = 0.0;
}

fn dot_k(word : u32) -> f32 {
  var s = vec4<f32>(0.0);
  for (var w = 0u; w < ROW_WORDS; w++) {
    let x = k_cache[word + w];
    if (KV_F16) {
      s += q[2u * w] * vec4<f32>(unpack2x16float(x.x), unpack2x16float(x.y));
      s += q[2u * w + 1u] * vec4<f32>(unpack2x16float(x.z), unpack2x16float(x.w));
    } else {
      s += q[w] * bitcast<vec4<f32>>(x);
    }
  }
  return s.x + s.y + s.z + s.w;
}

fn add_v(word : u32, p : f32) {
  for (var w = 0u; w < ROW_WORDS; w++) {
    let x = v_cache[word + w];
    if (KV_F16) {
      acc[2u * w] += p * vec4<f32>(unpack2x16float(x.x), unpack2x16float(x.y));
      acc[2u * w + 1u] += p * vec4<f32>(unpack2x16float(x.z), unpack2x16float(x.w));
    } else {
      acc[w] += p * bitcast<vec4<f32>>(x);
    }
  }
}

// Folds keys [block_begin * block_size, n_keys) of blocks [block_begin, block_end) of sequence `seq`
// into the state: scores of a block first, then one rescale per block rather than one per token.
fn attend_blocks(seq : u32, kv_head : u32, block_begin : u32, block_end : u32, n_keys : u32) {
  let bs = params.block_size;
  let token_words = params.n_kv_heads * ROW_WORDS;
  for (var b = block_begin; b < block_end; b++) {
    let physical = block_tables[seq * params.max_blocks_per_seq + b];
    let base = physical * bs * token_words + kv_head * ROW_WORDS;
    let n = min(bs, n_keys - b * bs);
    var block_max = NEG_BIG;
    for (var t = 0u; t < n; t++) {
      scores[t] = dot_k(base + t * token_words);
      block_max = max(block_max, scores[t]);
    }
    let m_new = max(m, block_max);
    let alpha = exp(m - m_new);
    l *= alpha;
    for (var i = 0u; i < HEAD_DIM / 4u; i++) {
      acc[i] *= alpha;
    }
    for (var t = 0u; t < n; t++) {
      let p = exp(scores[t] - m_new);
      l += p;
      add_v(base + t * token_words, p);
    }
    m = m_new;
  }
}
