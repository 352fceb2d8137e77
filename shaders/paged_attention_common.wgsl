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
//
// Loop order, for SwiftShader (and any GPU without register-indexed arrays): the head dimension is walked
// in slices of 16 values held in mat4x4 registers, with the block's tokens inside, so the query slice and
// the accumulator slice are fetched once per block instead of once per token. Only the K/V loads are per
// token. Measured on SwiftShader: ~2x faster than a token-outer loop over private arrays.

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

override HEAD_DIM : u32 = 64u;     // multiple of 16, <= 4 * MAX_VEC
override KV_F16 : bool = false;
override WORKGROUP_SIZE : u32 = 16u;
override ROW_WORDS : u32 = select(HEAD_DIM / 4u, HEAD_DIM / 8u, KV_F16);

const MAX_VEC : u32 = 32u;         // head_dim up to 128
const MAX_BLOCK_SIZE : u32 = 32u;
const NEG_BIG : f32 = -3.0e38;     // finite "minus infinity": exp(NEG_BIG - m) is 0, never NaN

// The running online-softmax state of the one (query token, head) this invocation owns.
var<private> q_base : u32;                         // first query vec4 of this (token, head)
var<private> acc : array<vec4<f32>, MAX_VEC>;      // sum of exp(score - m) * v, unnormalised
var<private> m : f32;                              // running max score
var<private> l : f32;                              // running sum of exp(score - m)
var<private> scores : array<f32, MAX_BLOCK_SIZE>;  // one block's scores / weights, never the whole context

fn load_query(q_row : u32) {
  q_base = q_row * (HEAD_DIM / 4u);
  for (var i = 0u; i < HEAD_DIM / 4u; i++) {
    acc[i] = vec4<f32>(0.0);
  }
  m = NEG_BIG;
  l = 0.0;
}

fn unpack8(x : vec4<u32>, y : vec4<u32>) -> mat4x4<f32> {
  return mat4x4<f32>(vec4<f32>(unpack2x16float(x.x), unpack2x16float(x.y)),
                     vec4<f32>(unpack2x16float(x.z), unpack2x16float(x.w)),
                     vec4<f32>(unpack2x16float(y.x), unpack2x16float(y.y)),
                     vec4<f32>(unpack2x16float(y.z), unpack2x16float(y.w)));
}

// Values 16 * s .. 16 * s + 15 of the K (or V) row starting at word `row`.
fn k_slice(row : u32, s : u32) -> mat4x4<f32> {
  if (KV_F16) {
    return unpack8(k_cache[row + 2u * s], k_cache[row + 2u * s + 1u]);
  }
  let w = row + 4u * s;
  return mat4x4<f32>(bitcast<vec4<f32>>(k_cache[w]), bitcast<vec4<f32>>(k_cache[w + 1u]),
                     bitcast<vec4<f32>>(k_cache[w + 2u]), bitcast<vec4<f32>>(k_cache[w + 3u]));
}

fn v_slice(row : u32, s : u32) -> mat4x4<f32> {
  if (KV_F16) {
    return unpack8(v_cache[row + 2u * s], v_cache[row + 2u * s + 1u]);
  }
  let w = row + 4u * s;
  return mat4x4<f32>(bitcast<vec4<f32>>(v_cache[w]), bitcast<vec4<f32>>(v_cache[w + 1u]),
                     bitcast<vec4<f32>>(v_cache[w + 2u]), bitcast<vec4<f32>>(v_cache[w + 3u]));
}

// Folds keys [block_begin * block_size, n_keys) of blocks [block_begin, block_end) of sequence `seq`
// into the state: a block's scores first, then one rescale per block rather than one per token.
fn attend_blocks(seq : u32, kv_head : u32, block_begin : u32, block_end : u32, n_keys : u32) {
  let bs = params.block_size;
  let token_words = params.n_kv_heads * ROW_WORDS;
  for (var b = block_begin; b < block_end; b++) {
    let physical = block_tables[seq * params.max_blocks_per_seq + b];
    let base = physical * bs * token_words + kv_head * ROW_WORDS;
    let n = min(bs, n_keys - b * bs);
    for (var t = 0u; t < n; t++) {
      scores[t] = 0.0;
    }
    for (var s = 0u; s < HEAD_DIM / 16u; s++) {
      let qs = q_base + 4u * s;
      let q = mat4x4<f32>(query[qs], query[qs + 1u], query[qs + 2u], query[qs + 3u]) * params.scale;
      for (var t = 0u; t < n; t++) {
        let k = k_slice(base + t * token_words, s);
        scores[t] += dot(q[0], k[0]) + dot(q[1], k[1]) + dot(q[2], k[2]) + dot(q[3], k[3]);
      }
    }
    var block_max = NEG_BIG;
    for (var t = 0u; t < n; t++) {
      block_max = max(block_max, scores[t]);
    }
    let m_new = max(m, block_max);
    let alpha = exp(m - m_new);
    l *= alpha;
    for (var t = 0u; t < n; t++) {
      scores[t] = exp(scores[t] - m_new);  // now the softmax weight of token t
      l += scores[t];
    }
    for (var s = 0u; s < HEAD_DIM / 16u; s++) {
      var a = mat4x4<f32>(acc[4u * s], acc[4u * s + 1u], acc[4u * s + 2u], acc[4u * s + 3u]) * alpha;
      for (var t = 0u; t < n; t++) {
        a += v_slice(base + t * token_words, s) * scores[t];
      }
      acc[4u * s] = a[0];
      acc[4u * s + 1u] = a[1];
      acc[4u * s + 2u] = a[2];
      acc[4u * s + 3u] = a[3];
    }
    m = m_new;
  }
}
