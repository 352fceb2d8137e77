// The cpu family's paged prefill attention (paged_prefill_attention[_wide]: composed after
// attention_heads_<128|256>.wgsl by shader_variants.py), causal, chunked: each sequence brings a chunk of q_len
// new query tokens whose K/V were already written to the cache (kv_write.wgsl); they attend to the cached prefix (prefix-cache hits
// or earlier chunks) plus the new tokens up to their own position, all read through the block table.
// New token i of sequence s sits at position context_lens[s] - q_len + i and sees keys 0..that position.
// One invocation per (query head, tile of SLOTS consecutive new tokens of one sequence): the tile's
// tokens share every K/V load and each masks the keys past its own position. Same online softmax as
// decode (paged_attention_common.wgsl).
//
// Dispatch: ceil(num_tiles * n_heads / WORKGROUP_SIZE) workgroups along x, where sequence s has
// ceil(q_len / SLOTS) tiles and num_tiles = starts[1, num_seqs].
//
// Passes: one dispatch walks at most PASS_KEYS / block_size blocks of a tile's keys, so the work of one invocation is
// bounded whatever the context (docs/architecture.md, "Prefill attention in passes"). A tile whose walk is longer
// leaves its online-softmax state (unnormalised acc in `out`, max / sum / next block in `state`) and the next
// dispatch of the same kernel with RESUME set goes on from there: ceil(walked blocks / pass blocks) dispatches
// in all (KVKernels.prefill_passes), the same arithmetic in the same order as one walk, so the result is the
// same bits however many passes it takes. A tile that is done records next block = its end, so later passes
// return at once.

//#include paged_attention_common.wgsl

//#include paged_prefill_tiles.wgsl

@group(0) @binding(7) var<storage, read_write> out : array<vec4<f32>>;    // (num_tokens, n_heads, HEAD_DIM / 4)
// (num_tokens, n_heads): the bits of (m, l), then the next block; as u32, since a GPU may flush a small integer
// carried as f32 bits (a denormal) to zero
@group(0) @binding(8) var<storage, read_write> state : array<vec4<u32>>;

// Keys one dispatch walks for a tile at most, in whole blocks: PASS_KEYS / block_size of them, from the uniform, so
// that one pipeline serves every block size (each pipeline is a compile: ~20 s of llvmpipe's JIT for a 256-wide one).
override PASS_KEYS : u32 = 512u;
override RESUME : bool = false;    // a pass after the first: go on from the state the one before left

@compute @workgroup_size(WORKGROUP_SIZE)
fn main(@builtin(global_invocation_id) gid : vec3<u32>) {
  let head = gid.x % params.n_heads;
  let tile = gid.x / params.n_heads;
  if (tile >= starts[2u * params.num_seqs + 1u]) {
    return;
  }
  let qt = query_tile(tile, SLOTS);
  let slot = vec4<u32>(0u, 1u, 2u, 3u);
  let keys = vec4<u32>(qt.keys0) + select(vec4<u32>(0u), slot, slot < vec4<u32>(qt.live));  // dead slots copy slot 0
  begin_slots(qt.first * params.n_heads + head, params.n_heads, qt.live, keys);
  let kv_head = head / (params.n_heads / params.n_kv_heads);
  let n_keys = qt.keys0 + qt.live - 1u;
  let end = (n_keys + params.block_size - 1u) / params.block_size;
  let row = qt.first * params.n_heads + head;  // slot j's (query row, head) is row + j * n_heads
  var begin = window_first(qt.keys0) / params.block_size;  // slot 0's first key: the walk's start
  if (RESUME) {
    begin = state[row].z;
    if (begin >= end) {
      return;  // done by an earlier pass
    }
    load_state(row, params.n_heads);
  }
  let stop = min(end, begin + max(1u, PASS_KEYS / params.block_size));
  attend_blocks(qt.seq, kv_head, begin, stop, n_keys);
  if (stop == end) {
    write_normalised(row, params.n_heads);
  } else {
    save_acc(row, params.n_heads);
  }
  for (var j = 0u; j < live_slots; j++) {
    state[row + j * params.n_heads] = vec4<u32>(bitcast<u32>(m[j]), bitcast<u32>(l[j]), stop, 0u);
  }
}

// The live slots' unnormalised accumulators into their rows of `out`, for the next pass.
fn save_acc(out_row : u32, row_step : u32) {
  for (var j = 0u; j < live_slots; j++) {
    for (var i = 0u; i < VEC_PER_HEAD; i++) {
      out[(out_row + j * row_step) * VEC_PER_HEAD + i] = acc[j * VEC_PER_HEAD + i];
    }
  }
}

// The live slots' state as the pass before left it (dead slots keep begin_slots' start: never written out).
fn load_state(out_row : u32, row_step : u32) {
  for (var j = 0u; j < live_slots; j++) {
    let s = state[out_row + j * row_step];
    m[j] = bitcast<f32>(s.x);
    l[j] = bitcast<f32>(s.y);
    for (var i = 0u; i < VEC_PER_HEAD; i++) {
      acc[j * VEC_PER_HEAD + i] = out[(out_row + j * row_step) * VEC_PER_HEAD + i];
    }
  }
}
