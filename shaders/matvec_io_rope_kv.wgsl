// The io part of the stacked q | k | v projection in a matvec step (matvec_gpu_*_rope_kv): what rope.wgsl and
// kv_write.wgsl did in two dispatches of their own happens in this projection's epilogue. A workgroup's 8 rows
// r0..r0+7 (r0 a multiple of 8) are 4 whole adjacent pairs of one head (HEAD_DIM a multiple of 8), so lane 0
// has everything it needs: it adds the bias, rotates q and k (adjacent-pair convention, cos / sin from the
// host's (max_positions, HEAD_DIM / 2) table, as rope.wgsl), and stores
//   q rows into y, the (tokens, Q_ROWS) f32 queries the attention kernels read;
//   k and v rows into the cache slot slot_mapping[t] (KV_OUT 0: f32, 1: f16 packed two per u32, one vec4<u32>
//   word per 8 values: each cache word has one writer), laid out as paged_kv_read.wgsl reads them;
//   or, KV_OUT 2 (quantized caches), into (tokens, KV_ROWS) f32 rows for kv_write_quant.wgsl.
// Bindings after the matvec's own: positions, the cos / sin table, the stacked bias (zeros where the model has
// none), slot_mapping, and K's and V's destination (the layer's cache buffers, or the f32 rows).
// SPLIT_PARTS > 0: the previous layer's fused FFN (ffn_gpu_main.wgsl) has not added its down projection into x;
// its partials follow x's rows in x's buffer ((tokens, cols) x, then (SPLIT_PARTS, tokens, cols): no binding of
// their own, which would pass WebGPU's 10 storage buffers a stage), and x's row is read as x + the partials (each
// workgroup sums the row it reads; the output projection, matvec_io_merge.wgsl, adds them into x).

@group(0) @binding(8) var<storage, read> positions : array<i32>;         // (tokens,)
@group(0) @binding(9) var<storage, read> cos_sin : array<vec2<f32>>;     // (max_positions, HEAD_DIM / 2)
@group(0) @binding(10) var<storage, read> bias : array<vec4<f32>>;       // (Q_ROWS + 2 KV_ROWS,)
@group(0) @binding(11) var<storage, read> slot_mapping : array<u32>;     // (tokens,)
@group(0) @binding(12) var<storage, read_write> k_out : array<vec4<u32>>;
@group(0) @binding(13) var<storage, read_write> v_out : array<vec4<u32>>;

override HEAD_DIM : u32 = 64u;
override Q_ROWS : u32 = 576u;       // n_heads * HEAD_DIM
override KV_ROWS : u32 = 192u;      // n_kv_heads * HEAD_DIM
override KV_OUT : u32 = 1u;         // 0 f32 cache, 1 f16 cache, 2 f32 rows for kv_write_quant
override BLOCK_U32 : u32 = 0u;      // u32s from one block's start to the next; 0: blocks follow each other
override BLOCK_TOKENS : u32 = 16u;  // tokens per block (the cache's block_size)
override HEAD_MAJOR : bool = true;  // a block keeps each kv head's rows together (paged_kv_read.wgsl)
override ROTATE : bool = true;      // false: a layer without rotary (q and k stored unrotated)
override SPLIT_PARTS : u32 = 0u;    // the previous layer's FFN partials pending after x's rows (0: x is whole)
override ROW_U32 : u32 = select(HEAD_DIM, HEAD_DIM / 2u, KV_OUT == 1u);  // u32s of one head's f32 / f16 row

fn x_gain(v : u32) -> vec4<f32> {  // NORM: the gain stored after the codes
  return gain(v);
}

fn load_x(t : u32, v : u32) -> vec4<f32> {
  let row = params.cols / 4u;
  var u = x[t * row + v];
  for (var p = 0u; p < SPLIT_PARTS; p++) {  // in the partials' order, as the output projection adds them
    u += x[((p + 1u) * params.tokens + t) * row + v];
  }
  return u;
}

//#include rope_pairs.wgsl

const SCALES_PER_ROW : u32 = 0u;  // f32 / f16 rows: no scale words

fn kv_heads() -> u32 {
  return KV_ROWS / HEAD_DIM;
}

//#include kv_slots.wgsl

// What the epilogue reads besides the sums, loaded by lane 0 before the dot products (prefetch) so that after
// the last barrier it only computes and stores: the 8 rows' bias, their 4 pairs' cos / sin at token t's
// position, and the K / V row's first cache u32.
var<private> pre_bias : array<vec4<f32>, 2>;
var<private> pre_cs : array<vec2<f32>, 4>;
var<private> pre_base : u32;

fn prefetch(t : u32, r0 : u32) {
  if (r0 >= Q_ROWS + 2u * KV_ROWS) {
    return;
  }
  pre_bias[0] = bias[r0 / 4u];
  pre_bias[1] = bias[r0 / 4u + 1u];
  if (ROTATE && r0 < Q_ROWS + KV_ROWS) {
    let i = u32(positions[t]) * (HEAD_DIM / 2u) + (r0 % HEAD_DIM) / 2u;  // r0's pair; the 4 pairs follow
    for (var j = 0u; j < 4u; j++) {
      pre_cs[j] = cos_sin[i + j];
    }
  }
  if (r0 >= Q_ROWS && KV_OUT != 2u) {
    let e = r0 - Q_ROWS - select(0u, KV_ROWS, r0 >= Q_ROWS + KV_ROWS);
    pre_base = slot_row(slot_mapping[t], e / HEAD_DIM).x;
  }
}

fn put_kv(is_v : bool, i : u32, word : vec4<u32>) {
  if (is_v) {
    v_out[i] = word;
  } else {
    k_out[i] = word;
  }
}

fn store8(t : u32, r0 : u32, lo : vec4<f32>, hi : vec4<f32>) {
  var a = lo + pre_bias[0];
  var b = hi + pre_bias[1];
  if (ROTATE && r0 < Q_ROWS + KV_ROWS) {
    a = rope4(pre_cs[0], pre_cs[1], a);
    b = rope4(pre_cs[2], pre_cs[3], b);
  }
  if (r0 < Q_ROWS) {
    let o = t * Q_ROWS + r0;
    y[o] = a.x;
    y[o + 1u] = a.y;
    y[o + 2u] = a.z;
    y[o + 3u] = a.w;
    y[o + 4u] = b.x;
    y[o + 5u] = b.y;
    y[o + 6u] = b.z;
    y[o + 7u] = b.w;
    return;
  }
  let is_v = r0 >= Q_ROWS + KV_ROWS;
  let e = r0 - Q_ROWS - select(0u, KV_ROWS, is_v);  // the first of the 8 values within the token's K (V) row
  if (KV_OUT == 2u) {
    let i = (t * KV_ROWS + e) / 4u;
    put_kv(is_v, i, bitcast<vec4<u32>>(a));
    put_kv(is_v, i + 1u, bitcast<vec4<u32>>(b));
    return;
  }
  let base = pre_base;
  let d = e % HEAD_DIM;  // the first of the 8 values within the head's row
  if (KV_OUT == 1u) {
    put_kv(is_v, (base + d / 2u) / 4u, vec4<u32>(pack2x16float(a.xy), pack2x16float(a.zw), pack2x16float(b.xy),
                                                 pack2x16float(b.zw)));
  } else {
    put_kv(is_v, (base + d) / 4u, bitcast<vec4<u32>>(a));
    put_kv(is_v, (base + d) / 4u + 1u, bitcast<vec4<u32>>(b));
  }
}
