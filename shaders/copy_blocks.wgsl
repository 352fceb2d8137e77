// Copy whole KV blocks inside one layer's pool, K and V together: for each pair (src, dst) in
// `block_pairs`, block dst becomes a copy of block src (copy-on-write of a shared prefix block, or
// gathering blocks before a swap). The data is copied as raw words, so f32 and packed f16 caches alike.
// The host guarantees no block is both a source and a destination, so invocations never race.
// One invocation per (pair, word of the block).
//
// Dispatch: ceil(num_pairs * block_words / WORKGROUP_SIZE) workgroups along x.

struct Params {
  num_pairs : u32,
  block_words : u32,  // block_size * n_kv_heads * row words (vec4<u32>) of one block
}

@group(0) @binding(0) var<storage, read> block_pairs : array<vec2<u32>>;   // (num_pairs,) (src, dst)
@group(0) @binding(1) var<storage, read_write> k_cache : array<vec4<u32>>; // (num_blocks, block_words)
@group(0) @binding(2) var<storage, read_write> v_cache : array<vec4<u32>>; // (num_blocks, block_words)
@group(0) @binding(3) var<uniform> params : Params;

override WORKGROUP_SIZE : u32 = 64u;

@compute @workgroup_size(WORKGROUP_SIZE)
fn main(@builtin(global_invocation_id) gid : vec3<u32>) {
  let pair = gid.x / params.block_words;
  if (pair >= params.num_pairs) {
    return;
  }
  let word = gid.x % params.block_words;
  let blocks = block_pairs[pair];
  k_cache[blocks.y * params.block_words + word] = k_cache[blocks.x * params.block_words + word];
  v_cache[blocks.y * params.block_words + word] = v_cache[blocks.x * params.block_words + word];
}
