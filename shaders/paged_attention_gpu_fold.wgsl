// The decode attention that computes its own q | k | v (paged_attention_gpu[_sg]_fold_<dtype>, entry point
// main_fold; composed by shader_variants.py after paged_kv_read.wgsl, a reduce_*.wgsl part and
// paged_attention_gpu_main.wgsl, whose walk() it runs, with the q | k | v weight type's parts, attention_qkv_io.wgsl
// and matvec_gpu_rows.wgsl as its `qkv_` instance at bindings 16..). One dispatch a decode layer fewer: the
// q | k | v matvec (matvec_io_rope_kv.wgsl) no longer runs ahead of the attention.
// Each workgroup (sequence, partition, tile of SLOTS query heads of one kv head):
//   1. stages the residual row of its sequence, x plus the SPLIT_PARTS partials the previous layer's fused FFN
//      left after x's rows (in their order, as matvec_io_rope_kv.wgsl's load_x adds them: the same x);
//   2. computes its SLOTS heads' q rows with the matvec's own rows8 (RMSNorm with the gain stored after the
//      codes), rotates them and stages them times the softmax scale in q_tile, as `main` stages them;
//   3. the partition holding the new token (cache index context_len - 1) only: computes the kv head's k (rotated)
//      and v rows, rounds them as the cache stores them (f16: as the other kernels unpack it) into new_kv, which
//      walk() reads for that key instead of the cache. The cache binding is read by every other workgroup of the
//      dispatch, so the new row cannot go through it (no workgroup waits on another); the first tile of the kv
//      head's query heads writes it to the cache for the steps after (one writer a cache word). f32 and f16
//      caches only: a quantized row's scales need the whole row's maximum, which kv_write_quant computes.
//   4. walks the partition (walk()) and writes its state; a single partition's too (no `out`: the output
//      projection's merge, matvec_io_merge.wgsl with STATES_ONLY, merges one state into acc / l, the bits `main`
//      writes), which keeps this kernel within WebGPU's 10 storage buffers a stage.
// The new token's rotary position follows the context lengths in their buffer: context_lens[num_seqs + seq].
// Redundant work, against the separate q | k | v dispatch: every workgroup re-reads and re-sums its residual
// row and recomputes its heads' q (partitions x the q rows); the last partition's workgroups compute their kv
// head's k and v (head_tile < a GQA group: once per tile). docs/performance.md has the figures.

@group(0) @binding(9) var<storage, read> cos_sin : array<vec2<f32>>;  // (max_positions, HEAD_DIM / 2)

override SPLIT_PARTS : u32 = 0u;  // the previous layer's FFN partials pending after x's rows (0: x is whole)
override X_VEC4 : u32 = 1u;       // hidden / 4: the staged residual row
override ROTATE : bool = true;    // false: a layer without rotary

var<workgroup> xs : array<vec4<f32>, X_VEC4>;  // the sequence's residual row (attention_qkv_io.wgsl's load_x)

//#include rope_pairs.wgsl

// 8 rows of one head (e: the first's place in the head, a multiple of 8) rotated at position pos.
fn rotated(rows : array<vec4<f32>, 2>, pos : u32, e : u32) -> array<vec4<f32>, 2> {
  if (!ROTATE) {
    return rows;
  }
  let i = pos * (HEAD_DIM / 2u) + e / 2u;
  return array<vec4<f32>, 2>(rope4(cos_sin[i], cos_sin[i + 1u], rows[0]), rope4(cos_sin[i + 2u], cos_sin[i + 3u], rows[1]));
}

// v as the cache gives it back: f16 rounds (unpack2x16float of pack2x16float, as paged_kv_read.wgsl unpacks it).
fn as_cached(v : vec4<f32>) -> vec4<f32> {
  if (KV_FORMAT == 1u) {
    return vec4<f32>(unpack2x16float(pack2x16float(v.xy)), unpack2x16float(pack2x16float(v.zw)));
  }
  return v;
}

fn put_cache(is_v : bool, i : u32, word : vec4<u32>) {
  if (is_v) {
    v_cache[i] = word;
  } else {
    k_cache[i] = word;
  }
}

// The new token's 8 values e.. of its K (V) row, rounded as cached, into new_kv; the writer also into the cache
// row starting at u32 `at` (matvec_io_rope_kv.wgsl's words: one vec4<u32> of 8 f16, two of 4 f32).
fn put_new(is_v : bool, e : u32, a : vec4<f32>, b : vec4<f32>, at : u32, writer : bool) {
  let o = select(0u, VEC_PER_HEAD, is_v) + e / 4u;
  new_kv[o] = a;
  new_kv[o + 1u] = b;
  if (!writer) {
    return;
  }
  if (KV_FORMAT == 1u) {
    put_cache(is_v, (at + e / 2u) / 4u, vec4<u32>(pack2x16float(a.xy), pack2x16float(a.zw), pack2x16float(b.xy),
                                                  pack2x16float(b.zw)));
  } else {
    put_cache(is_v, (at + e) / 4u, bitcast<vec4<u32>>(a));
    put_cache(is_v, (at + e) / 4u + 1u, bitcast<vec4<u32>>(b));
  }
}

// Steps 2 and 3 above: q_tile, and new_kv in the new token's partition. Uniform control flow only (rows8 holds
// barriers; the branch depends on workgroup_id and read-only buffers).
fn fold_qkv(it : Item, lid : u32) {
  let lane = lid % qkv_LANES;
  let group = lid / qkv_LANES;
  let s = qkv_f16_norm_scale(0u, lane, lid);
  let pos = context_lens[params.num_seqs + it.seq];
  let q_octets = SLOTS * HEAD_DIM / 8u;  // 8 rows a row group's rows8
  for (var j = 0u; j < (q_octets + qkv_ROW_GROUPS - 1u) / qkv_ROW_GROUPS; j++) {
    let k = j * qkv_ROW_GROUPS + group;
    let rows = qkv_rows8(0u, it.head * HEAD_DIM + 8u * k, lane, lid, s);
    if (lane == 0u && k < q_octets) {
      let q = rotated(rows, pos, (8u * k) % HEAD_DIM);
      q_tile[2u * k] = q[0] * params.scale;
      q_tile[2u * k + 1u] = q[1] * params.scale;
    }
  }
  if (it.part + 1u != it.n_parts) {
    return;
  }
  let kv_octets = HEAD_DIM / 8u;
  let last = it.ctx_len - 1u;
  let bs = params.block_size;
  let at = kv_row(part_table[last / bs - it.first], last % bs, it.kv_head).data;
  let writer = it.head % (params.n_heads / params.n_kv_heads) == 0u;  // the kv head's first tile
  for (var j = 0u; j < (2u * kv_octets + qkv_ROW_GROUPS - 1u) / qkv_ROW_GROUPS; j++) {
    let k = j * qkv_ROW_GROUPS + group;
    let is_v = k >= kv_octets;
    let e = 8u * (k % kv_octets);
    let r0 = (params.n_heads + select(0u, params.n_kv_heads, is_v) + it.kv_head) * HEAD_DIM + e;
    var rows = qkv_rows8(0u, r0, lane, lid, s);
    if (lane == 0u && k < 2u * kv_octets) {
      if (!is_v) {
        rows = rotated(rows, pos, e);
      }
      put_new(is_v, e, as_cached(rows[0]), as_cached(rows[1]), at, writer);
    }
  }
}

@compute @workgroup_size(WORKGROUP_SIZE)
fn main_fold(@builtin(workgroup_id) wid : vec3<u32>, @builtin(local_invocation_index) lid : u32) {
  let it = item_of(wid);
  if (!it.live) {
    return;  // the whole workgroup: its inputs are all uniform
  }
  stage_table(it, lid);
  for (var v = lid; v < X_VEC4; v += WORKGROUP_SIZE) {
    var u = qkv_x[it.seq * X_VEC4 + v];
    for (var p = 0u; p < SPLIT_PARTS; p++) {  // in the partials' order, as the output projection adds them
      u += qkv_x[((p + 1u) * params.num_seqs + it.seq) * X_VEC4 + v];
    }
    xs[v] = u;
  }
  workgroupBarrier();
  fold_qkv(it, lid);
  // The walk reads the new row from new_kv, never the cache words the writer stored; the storage barrier (one a
  // workgroup) orders them anyway, so the static check (tests/test_storage_barriers.py) holds with no exception.
  storageBarrier();
  workgroupBarrier();
  let w = walk(it, lid);
  if (lid >= VEC_PER_HEAD) {
    return;
  }
  let state = (it.seq * params.max_partitions + it.part) * params.n_heads + it.head;
  put_state(state, lid, 0u, w.a0, w.m.x, w.l.x);
  if (SLOTS > 1u) { put_state(state, lid, 1u, w.a1, w.m.y, w.l.y); }
  if (SLOTS > 2u) { put_state(state, lid, 2u, w.a2, w.m.z, w.l.z); }
  if (SLOTS > 3u) { put_state(state, lid, 3u, w.a3, w.m.w, w.l.w); }
}
