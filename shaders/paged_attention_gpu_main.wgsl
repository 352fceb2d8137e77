// The body of the gpu family's paged decode attention (paged_attention_gpu[_sg], composed after
// paged_kv_read.wgsl and a reduce_*.wgsl fragment by shader_variants.py).
// Flash-decoding pass 1 shaped for real GPUs, where the cpu family's lone threads (3 of them at 128
// tokens) leave the device idle: one workgroup per (sequence, kv head's tile of SLOTS query heads,
// partition of the context). The partition's block-table slice and the SLOTS queries are staged in
// workgroup memory; the partition is walked in tiles of WORKGROUP_SIZE keys:
//   scores:  lane i scores key i of the tile against all SLOTS heads (one K row per lane, lanes along keys,
//            each K value serving every query head of the GQA group);
//   softmax: MAX_RUNS lanes take the max of a run of the tile's scores each, every lane the max of those
//            (broadcast reads, one barrier between), so the running max m is the same in every lane; a
//            lane keeps the sum of its own keys' weights;
//   values:  lane (r, c) adds keys r, r + KEY_LANES, ... of the tile times their weights into the four
//            values c of the head dimension (lanes along head_dim: neighbours read neighbouring words).
// After the last tile, the weight sums meet in wg_sum() (subgroups or a workgroup tree) and the KEY_LANES
// partial outputs of each column meet in workgroup memory. Private state: a vec4 per head, no arrays.
// Every barrier and reduction sits in control flow that depends only on workgroup_id, the uniform params
// and read-only buffers (the tile loop's bounds), so ragged lengths never make a barrier divergent.
//
// Dispatch: num_seqs * max_partitions * (n_heads / SLOTS) workgroups along x.
// FOLD (paged_attention_gpu_fold.wgsl's main_fold, composed after this file): the queries and the new token's
// K / V are computed in the workgroup, the new key (cache index context_len - 1) is read from new_kv, not from
// the cache; `main` and walk() are the same code in both.

@group(0) @binding(6) var<storage, read_write> out : array<vec4<f32>>;         // (num_seqs, n_heads, HEAD_DIM / 4)
@group(0) @binding(7) var<storage, read_write> part_acc : array<vec4<f32>>;    // (num_seqs, max_partitions, n_heads, HEAD_DIM / 4)
@group(0) @binding(8) var<storage, read_write> part_stats : array<vec2<f32>>;  // (num_seqs, max_partitions, n_heads): (max, sum)

const MAX_PART_BLOCKS : u32 = 128u;  // partition_blocks limit (kv_attention_gpu.py checks it)
const MAX_RUNS : u32 = 16u;          // runs of the tile's scores whose maxima meet in run_max

override KEY_LANES : u32 = WORKGROUP_SIZE / VEC_PER_HEAD;  // lanes sharing a column of the values

override Q_TILE_VECS : u32 = SLOTS * VEC_PER_HEAD;                // the staged queries' vec4s
override FOLD : bool = false;       // the new key and value come from new_kv (paged_attention_gpu_fold.wgsl)
override NEW_KV_VEC4 : u32 = 1u;    // FOLD: 2 * VEC_PER_HEAD (an override of its own: naga sizes no array by an expression)

var<workgroup> q_tile : array<vec4<f32>, Q_TILE_VECS>;             // (SLOTS, VEC_PER_HEAD) queries, pre-scaled
var<workgroup> part_table : array<u32, MAX_PART_BLOCKS>;           // the partition's physical blocks
var<workgroup> tile_scores : array<vec4<f32>, WORKGROUP_SIZE>;     // (keys,) component j: head j
var<workgroup> tile_weights : array<vec4<f32>, WORKGROUP_SIZE>;    // (keys,) exp(score - m); then partial outputs
var<workgroup> run_max : array<vec4<f32>, MAX_RUNS>;               // max score of each run of the tile
var<workgroup> new_kv : array<vec4<f32>, NEW_KV_VEC4>;             // FOLD: the new token's K row, then its V row

// One u32 of the V cache: values are read word by word, since 4-bit rows are not vec4-aligned.
fn v_word(at : u32) -> u32 {
  return kv_word4(true, at / 4u)[at % 4u];
}

// Values 4c .. 4c + 3 of the V row `at` (kv_row).
fn v_vec4(at : KVRow, c : u32) -> vec4<f32> {
  let row = at.data;
  if (KV_FORMAT == 0u) {
    return bitcast<vec4<f32>>(v_cache[row / 4u + c]);
  }
  if (KV_FORMAT == 1u) {
    return vec4<f32>(unpack2x16float(v_word(row + 2u * c)), unpack2x16float(v_word(row + 2u * c + 1u)));
  }
  let scale = v_word(at.scales + 4u * c / KV_GROUP);
  if (KV_FORMAT == 5u) {
    let dm = unpack2x16float(scale);
    return uint4x4(v_word(row + c / 2u) >> (16u * (c % 2u))) * dm.x + vec4<f32>(dm.y);
  }
  if (KV_FORMAT == 4u) {
    return int4x4(v_word(row + c / 2u) >> (16u * (c % 2u))) * bitcast<f32>(scale);
  }
  if (KV_FORMAT == 3u) {
    return e4m3x4(v_word(row + c)) * bitcast<f32>(scale);
  }
  return int8x4(v_word(row + c)) * bitcast<f32>(scale);
}

// Slice s (16 values) of the staged query of head j of the tile.
fn q_staged(j : u32, s : u32) -> mat4x4<f32> {
  let i = j * VEC_PER_HEAD + 4u * s;
  return mat4x4<f32>(q_tile[i], q_tile[i + 1u], q_tile[i + 2u], q_tile[i + 3u]);
}

// The scores of the K row `at` (kv_row), or of the new key in new_kv where `fresh`, for the SLOTS heads
// (components past SLOTS are 0).
fn key_scores(at : KVRow, fresh : bool) -> vec4<f32> {
  var sc = vec4<f32>(0.0);
  for (var s = 0u; s < HEAD_DIM / 16u; s++) {
    var k : mat4x4<f32>;
    if (fresh) {
      k = mat4x4<f32>(new_kv[4u * s], new_kv[4u * s + 1u], new_kv[4u * s + 2u], new_kv[4u * s + 3u]);
    } else {
      k = k_slice(at, s);
    }
    sc.x += dot16(q_staged(0u, s), k);
    if (SLOTS > 1u) { sc.y += dot16(q_staged(1u, s), k); }
    if (SLOTS > 2u) { sc.z += dot16(q_staged(2u, s), k); }
    if (SLOTS > 3u) { sc.w += dot16(q_staged(3u, s), k); }
  }
  return sc;
}

// The max of the tile's scores (all written to tile_scores before the call), in every lane. Uniform
// control flow only (one barrier; the caller's barrier before the next write to tile_scores covers run_max).
fn tile_max(lid : u32) -> vec4<f32> {
  let run = (WORKGROUP_SIZE + MAX_RUNS - 1u) / MAX_RUNS;
  if (lid < MAX_RUNS) {
    var mx = vec4<f32>(NEG_BIG);
    for (var i = lid * run; i < min(lid * run + run, WORKGROUP_SIZE); i++) {
      mx = max(mx, tile_scores[i]);
    }
    run_max[lid] = mx;
  }
  workgroupBarrier();
  var mx = run_max[0];
  for (var k = 1u; k < min(MAX_RUNS, WORKGROUP_SIZE); k++) {
    mx = max(mx, run_max[k]);
  }
  return mx;
}

// Sums column c of `partial` over the KEY_LANES lanes holding it (lane lid = r * VEC_PER_HEAD + c);
// the total is valid in lanes r == 0. Uniform control flow only (two barriers).
fn column_sum(partial : vec4<f32>, lid : u32) -> vec4<f32> {
  tile_weights[lid] = partial;
  workgroupBarrier();
  var total = partial;
  if (lid < VEC_PER_HEAD) {
    for (var r = 1u; r < KEY_LANES; r++) {
      total += tile_weights[r * VEC_PER_HEAD + lid];
    }
  }
  workgroupBarrier();
  return total;
}

// Column c of head j of the tile: normalised into `out` when the context is one partition, else the
// partition's unnormalised state for paged_attention_reduce.wgsl.
fn put_head(row : u32, state : u32, n_parts : u32, c : u32, j : u32, acc : vec4<f32>, m : f32, l : f32) {
  if (n_parts == 1u) {
    out[(row + j) * VEC_PER_HEAD + c] = acc / l;
    return;
  }
  put_state(state, c, j, acc, m, l);
}

// Column c of head j's unnormalised partition state (matvec_io_merge.wgsl / paged_attention_reduce.wgsl merge it).
fn put_state(state : u32, c : u32, j : u32, acc : vec4<f32>, m : f32, l : f32) {
  part_acc[(state + j) * VEC_PER_HEAD + c] = acc;
  if (c == 0u) {
    part_stats[state + j] = vec2<f32>(m, l);
  }
}

// What a workgroup works on: sequence seq's query heads head .. head + SLOTS - 1 against partition part of
// its context (blocks first .. first + n_part_blocks - 1 of n_blocks, n_parts partitions); live false: past
// the batch or the sequence's partitions (the whole workgroup returns: its inputs are all uniform).
struct Item {
  seq : u32,
  head : u32,
  kv_head : u32,
  part : u32,
  n_parts : u32,
  first : u32,
  n_part_blocks : u32,
  ctx_len : u32,
  live : bool,
}

fn item_of(wid : vec3<u32>) -> Item {
  let n_tiles = params.n_heads / SLOTS;
  let head = (wid.x % n_tiles) * SLOTS;  // the tile's first query head
  let part = (wid.x / n_tiles) % params.max_partitions;
  let seq = wid.x / (n_tiles * params.max_partitions);
  let bs = params.block_size;
  let ctx_len = context_lens[min(seq, params.num_seqs - 1u)];
  let n_blocks = (ctx_len + bs - 1u) / bs;
  let n_parts = (n_blocks + params.partition_blocks - 1u) / params.partition_blocks;
  let first = part * params.partition_blocks;
  let live = seq < params.num_seqs && part < n_parts;
  return Item(seq, head, head / (params.n_heads / params.n_kv_heads), part, n_parts, first,
              select(0u, min(params.partition_blocks, n_blocks - first), live), ctx_len, live);
}

// The partition's block-table slice into part_table (read after the caller's barrier).
fn stage_table(it : Item, lid : u32) {
  for (var i = lid; i < it.n_part_blocks; i += WORKGROUP_SIZE) {
    part_table[i] = block_tables[it.seq * params.max_blocks_per_seq + it.first + i];
  }
}

// The partition's unnormalised outputs (lanes r == 0 hold the column sums) and their (max, sum) states.
struct Walked {
  a0 : vec4<f32>,
  a1 : vec4<f32>,
  a2 : vec4<f32>,
  a3 : vec4<f32>,
  m : vec4<f32>,
  l : vec4<f32>,
}

// The walk of the partition's keys in tiles (see above), the queries staged in q_tile and the table in
// part_table. Uniform control flow only.
fn walk(it : Item, lid : u32) -> Walked {
  let bs = params.block_size;
  let first = it.first;
  let ctx_len = it.ctx_len;
  let kv_head = it.kv_head;
  let key_end = min((first + it.n_part_blocks) * bs, ctx_len);
  let key_begin = max(first * bs, window_first(ctx_len));  // a window layer reads no key before its window
  let c = lid % VEC_PER_HEAD;  // the lane's four values of the head dimension
  let r = lid / VEC_PER_HEAD;  // its key lane (lanes past KEY_LANES * VEC_PER_HEAD add no values)
  var m = vec4<f32>(NEG_BIG);
  var l = vec4<f32>(0.0);
  var a0 = vec4<f32>(0.0);
  var a1 = vec4<f32>(0.0);
  var a2 = vec4<f32>(0.0);
  var a3 = vec4<f32>(0.0);
  for (var t0 = key_begin; t0 < key_end; t0 += WORKGROUP_SIZE) {
    let key = t0 + lid;
    var sc = vec4<f32>(NEG_BIG);
    if (key < key_end) {
      let b = key / bs - first;
      sc = key_scores(kv_row(part_table[b], key % bs, kv_head), FOLD && key + 1u == ctx_len);
    }
    tile_scores[lid] = sc;
    workgroupBarrier();
    let m_new = max(m, tile_max(lid));
    let alpha = exp(m - m_new);
    let w = exp(sc - m_new);
    l = l * alpha + w;
    m = m_new;
    tile_weights[lid] = w;
    workgroupBarrier();
    a0 *= alpha.x;
    a1 *= alpha.y;
    a2 *= alpha.z;
    a3 *= alpha.w;
    let n = min(WORKGROUP_SIZE, key_end - t0);
    for (var i = r; i < n && r < KEY_LANES; i += KEY_LANES) {
      let key_i = t0 + i;
      var v : vec4<f32>;
      if (FOLD && key_i + 1u == ctx_len) {
        v = new_kv[VEC_PER_HEAD + c];
      } else {
        v = v_vec4(kv_row(part_table[key_i / bs - first], key_i % bs, kv_head), c);
      }
      let p = tile_weights[i];
      a0 += v * p.x;
      if (SLOTS > 1u) { a1 += v * p.y; }
      if (SLOTS > 2u) { a2 += v * p.z; }
      if (SLOTS > 3u) { a3 += v * p.w; }
    }
    workgroupBarrier();  // the next tile overwrites the scores and weights
  }
  l = wg_sum(l, lid);
  a0 = column_sum(a0, lid);
  if (SLOTS > 1u) { a1 = column_sum(a1, lid); }
  if (SLOTS > 2u) { a2 = column_sum(a2, lid); }
  if (SLOTS > 3u) { a3 = column_sum(a3, lid); }
  return Walked(a0, a1, a2, a3, m, l);
}

@compute @workgroup_size(WORKGROUP_SIZE)
fn main(@builtin(workgroup_id) wid : vec3<u32>, @builtin(local_invocation_index) lid : u32) {
  let it = item_of(wid);
  if (!it.live) {
    return;  // the whole workgroup: its inputs are all uniform
  }
  stage_table(it, lid);
  for (var i = lid; i < SLOTS * VEC_PER_HEAD; i += WORKGROUP_SIZE) {
    q_tile[i] = query[(it.seq * params.n_heads + it.head) * VEC_PER_HEAD + i] * params.scale;
  }
  workgroupBarrier();
  let w = walk(it, lid);
  if (lid >= VEC_PER_HEAD) {
    return;
  }
  let c = lid;
  let row = it.seq * params.n_heads + it.head;  // the tile's first output row
  let state = (it.seq * params.max_partitions + it.part) * params.n_heads + it.head;
  put_head(row, state, it.n_parts, c, 0u, w.a0, w.m.x, w.l.x);
  if (SLOTS > 1u) { put_head(row, state, it.n_parts, c, 1u, w.a1, w.m.y, w.l.y); }
  if (SLOTS > 2u) { put_head(row, state, it.n_parts, c, 2u, w.a2, w.m.z, w.l.z); }
  if (SLOTS > 3u) { put_head(row, state, it.n_parts, c, 3u, w.a3, w.m.w, w.l.w); }
}
