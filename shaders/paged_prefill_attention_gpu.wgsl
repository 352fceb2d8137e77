// Paged prefill attention of the gpu family (causal, chunked; the same contract as
// paged_prefill_attention_main.wgsl), tiled flash-attention style for real GPUs: one workgroup of
// WORKGROUP_SIZE lanes per (tile of QUERY_TILE new tokens of one sequence, SLOTS query heads of one kv
// head), i.e. ROWS = QUERY_TILE * SLOTS <= 16 query rows (row r: token r / SLOTS, head r % SLOTS) that
// share every K/V load. It walks the keys the tile's last token sees in tiles of KEYS keys, read through
// the block table and dequantized once into workgroup memory (K, then V in the same place):
//   scores:  lanes take (row, key) pairs, dot products between staged rows (broadcast reads);
//   softmax: lane r < ROWS updates row r's running max and sum (online softmax) and turns its scores
//            into weights, while all lanes stage the V tile;
//   values:  lane (row lid % ROWS, columns lid / ROWS + k * WORKGROUP_SIZE / ROWS) rescales and adds,
//            neighbouring lanes reading the same V word (broadcast).
// Four barriers per key tile, all in a loop whose bounds come from the uniform params and read-only
// buffers only; a lane's accumulator is four vec4s (4 * WORKGROUP_SIZE / ROWS columns: head_dim 128 at 16 rows,
// 256 at 8), no arrays.
//
// Dispatch: num_tiles * (n_heads / SLOTS) workgroups along x, where sequence s has ceil(q_len / QUERY_TILE)
// tiles and num_tiles = starts[1, num_seqs].
//
// Passes, as in the cpu family (paged_prefill_attention_main.wgsl; docs/architecture.md, "Prefill attention in
// passes"): one dispatch walks at most PASS_TILES key tiles, so a lane's loop back-edges are bounded whatever the
// context (llvmpipe ends every loop of an invocation past 65,535 of them: at head_dim 256 a 4-key tile costs 73,
// so one walk went wrong past 3,588 keys). A longer walk leaves each row's unnormalised accumulator in `out` and
// (max, sum, next key) in `state`; the same kernel with RESUME set goes on from there, the same arithmetic in the
// same order, so the result is the same bits however many passes it takes.

//#include paged_kv_read.wgsl

//#include paged_prefill_tiles.wgsl

@group(0) @binding(7) var<storage, read_write> out : array<vec4<f32>>;  // (num_tokens, n_heads, HEAD_DIM / 4)
// (num_tokens, n_heads): the bits of (m, l), then the tile's next key; as u32, since a GPU may flush a small
// integer carried as f32 bits (a denormal) to zero
@group(0) @binding(8) var<storage, read_write> state : array<vec4<u32>>;

override ROWS : u32 = 16u;       // query rows a workgroup may hold (QUERY_TILE * SLOTS <= ROWS): 8 for head_dim 256
override Q_VECS : u32 = ROWS * VEC_PER_HEAD;  // the staged queries' vec4s
const MAX_KEYS : u32 = 32u;      // keys per tile at most
override QUERY_TILE : u32 = 4u;  // new tokens per workgroup
override KEYS : u32 = 16u;       // keys per tile: KEYS * HEAD_DIM <= 1024 and KEYS <= MAX_KEYS (the host picks)
override PASS_TILES : u32 = 256u;  // key tiles one dispatch walks at most
override RESUME : bool = false;    // a pass after the first: go on from the state the one before left

var<workgroup> q_rows : array<vec4<f32>, Q_VECS>;        // (ROWS, VEC_PER_HEAD) queries, pre-scaled
var<workgroup> kv_tile : array<vec4<f32>, 256u>;         // (KEYS, VEC_PER_HEAD) K values, then V values
var<workgroup> probs : array<f32, 512u>;                 // (ROWS, KEYS) scores, then softmax weights
var<workgroup> row_m : array<f32, ROWS>;                 // running max score of each row
var<workgroup> row_l : array<f32, ROWS>;                 // running sum of exp(score - m)
var<workgroup> row_alpha : array<f32, ROWS>;             // this tile's rescale of each row's accumulator
var<workgroup> row_keys : array<u32, ROWS>;              // keys each row sees (0: a dead row)
var<workgroup> resume_at : u32;                          // RESUME: the tile's next key, as the pass before left it

// Stages values (v) or keys of keys k0 .. k0 + KEYS - 1 of the sequence (zeros past n_keys) as f32.
fn stage_tile(v : bool, seq : u32, kv_head : u32, k0 : u32, n_keys : u32, lid : u32) {
  let slices = HEAD_DIM / 16u;
  let bs = params.block_size;
  for (var i = lid; i < KEYS * slices; i += WORKGROUP_SIZE) {
    let key = i / slices;
    let s = i % slices;
    let pos = k0 + key;
    var x = mat4x4<f32>();
    if (pos < n_keys) {
      x = kv_slice(v, kv_row(block_tables[seq * params.max_blocks_per_seq + pos / bs], pos % bs, kv_head), s);
    }
    let at = key * VEC_PER_HEAD + 4u * s;
    kv_tile[at] = x[0];
    kv_tile[at + 1u] = x[1];
    kv_tile[at + 2u] = x[2];
    kv_tile[at + 3u] = x[3];
  }
}

// The weighted sum of the staged V rows for output vec4 c of row r, plus the rescaled `acc`.
fn add_values(acc : vec4<f32>, r : u32, c : u32) -> vec4<f32> {
  var sum = acc * row_alpha[r];
  for (var key = 0u; key < KEYS; key++) {
    sum += kv_tile[key * VEC_PER_HEAD + c] * probs[r * KEYS + key];
  }
  return sum;
}

// Row r of the workgroup's tile as a (new token, head) row of `out` and `state`: token r / SLOTS, head + r % SLOTS.
fn row_of(qt : QueryTile, head : u32, r : u32) -> u32 {
  return (qt.first + r / SLOTS) * params.n_heads + head + r % SLOTS;
}

@compute @workgroup_size(WORKGROUP_SIZE)
fn main(@builtin(workgroup_id) wid : vec3<u32>, @builtin(local_invocation_index) lid : u32) {
  let head_tiles = params.n_heads / SLOTS;
  let tile = wid.x / head_tiles;
  let head = (wid.x % head_tiles) * SLOTS;
  if (tile >= starts[2u * params.num_seqs + 1u]) {
    return;  // the whole workgroup (uniform inputs only)
  }
  let qt = query_tile(tile, QUERY_TILE);
  let kv_head = head / (params.n_heads / params.n_kv_heads);
  for (var i = lid; i < ROWS * VEC_PER_HEAD; i += WORKGROUP_SIZE) {
    let r = i / VEC_PER_HEAD;
    var q = vec4<f32>(0.0);
    if (r / SLOTS < qt.live) {  // r / SLOTS >= QUERY_TILE >= live past the tile's rows
      q = query[((qt.first + r / SLOTS) * params.n_heads + head + r % SLOTS) * VEC_PER_HEAD + i % VEC_PER_HEAD];
    }
    q_rows[i] = q * params.scale;
  }
  let live_row = lid < ROWS && lid / SLOTS < qt.live;
  if (lid < ROWS) {
    row_m[lid] = NEG_BIG;
    row_l[lid] = 0.0;
    row_keys[lid] = select(0u, qt.keys0 + lid / SLOTS, live_row);
    if (RESUME && live_row) {
      let st = state[row_of(qt, head, lid)];
      row_m[lid] = bitcast<f32>(st.x);
      row_l[lid] = bitcast<f32>(st.y);
    }
  }
  let n_keys = qt.keys0 + qt.live - 1u;  // keys the tile's last token sees
  var begin = window_first(qt.keys0);  // row 0's window starts first
  if (RESUME) {
    if (lid == 0u) {
      resume_at = state[row_of(qt, head, 0u)].z;
    }
    begin = workgroupUniformLoad(&resume_at);  // one value for the whole workgroup: the loop below has barriers
    if (begin >= n_keys) {
      return;  // done by an earlier pass (the whole workgroup)
    }
  }
  let stop = min(n_keys, begin + PASS_TILES * KEYS);
  let r_out = lid % ROWS;  // the lane's output row and its first column
  let c_out = lid / ROWS;
  let c_step = WORKGROUP_SIZE / ROWS;
  let writes = r_out / SLOTS < qt.live && c_out < VEC_PER_HEAD;  // a live row's columns: its lanes keep them
  let row = row_of(qt, head, r_out) * VEC_PER_HEAD;
  var a0 = vec4<f32>(0.0);
  var a1 = vec4<f32>(0.0);
  var a2 = vec4<f32>(0.0);
  var a3 = vec4<f32>(0.0);
  if (RESUME && writes) {  // the unnormalised accumulators the pass before saved
    a0 = out[row + c_out];
    if (c_out + c_step < VEC_PER_HEAD) { a1 = out[row + c_out + c_step]; }
    if (c_out + 2u * c_step < VEC_PER_HEAD) { a2 = out[row + c_out + 2u * c_step]; }
    if (c_out + 3u * c_step < VEC_PER_HEAD) { a3 = out[row + c_out + 3u * c_step]; }
  }
  for (var k0 = begin; k0 < stop; k0 += KEYS) {
    stage_tile(false, qt.seq, kv_head, k0, n_keys, lid);
    workgroupBarrier();  // K staged (and, on the first tile, the queries and row state)
    for (var i = lid; i < ROWS * KEYS; i += WORKGROUP_SIZE) {
      let r = i / KEYS;
      let key = i % KEYS;
      var sc = 0.0;
      for (var c = 0u; c < VEC_PER_HEAD; c++) {
        sc += dot(q_rows[r * VEC_PER_HEAD + c], kv_tile[key * VEC_PER_HEAD + c]);
      }
      let pos = k0 + key;
      probs[i] = select(NEG_BIG, sc, pos < row_keys[r] && pos >= window_first(row_keys[r]));  // causal, window
    }
    workgroupBarrier();  // scores done: K may be overwritten
    if (lid < ROWS) {
      var mx = NEG_BIG;
      for (var key = 0u; key < KEYS; key++) {
        mx = max(mx, probs[lid * KEYS + key]);
      }
      let m_new = max(row_m[lid], mx);
      var sum = 0.0;
      for (var key = 0u; key < KEYS; key++) {
        let p = exp(probs[lid * KEYS + key] - m_new);
        probs[lid * KEYS + key] = p;
        sum += p;
      }
      row_alpha[lid] = exp(row_m[lid] - m_new);
      row_l[lid] = row_l[lid] * row_alpha[lid] + sum;
      row_m[lid] = m_new;
    }
    stage_tile(true, qt.seq, kv_head, k0, n_keys, lid);
    workgroupBarrier();  // weights and V staged
    if (c_out < VEC_PER_HEAD) { a0 = add_values(a0, r_out, c_out); }
    if (c_out + c_step < VEC_PER_HEAD) { a1 = add_values(a1, r_out, c_out + c_step); }
    if (c_out + 2u * c_step < VEC_PER_HEAD) { a2 = add_values(a2, r_out, c_out + 2u * c_step); }
    if (c_out + 3u * c_step < VEC_PER_HEAD) { a3 = add_values(a3, r_out, c_out + 3u * c_step); }
    workgroupBarrier();  // the next tile overwrites kv_tile and probs
  }
  if (live_row) {  // every pass leaves its next key; a later pass of a finished tile returns at once
    state[row_of(qt, head, lid)] = vec4<u32>(bitcast<u32>(row_m[lid]), bitcast<u32>(row_l[lid]), stop, 0u);
  }
  if (!writes) {
    return;
  }
  // The last pass normalises; an earlier one leaves the accumulators as they are for the next.
  let inv_l = select(1.0, 1.0 / row_l[r_out], stop == n_keys);
  out[row + c_out] = a0 * inv_l;
  if (c_out + c_step < VEC_PER_HEAD) { out[row + c_out + c_step] = a1 * inv_l; }
  if (c_out + 2u * c_step < VEC_PER_HEAD) { out[row + c_out + 2u * c_step] = a2 * inv_l; }
  if (c_out + 3u * c_step < VEC_PER_HEAD) { out[row + c_out + 3u * c_step] = a3 * inv_l; }
}
