// Whole-block copies of one layer's KV pool, K and V together, as raw words (f32 and packed f16 alike).
//   main:           block dst becomes a copy of block src for each (src, dst) in block_pairs
//                   (copy-on-write of a shared prefix block). The host guarantees no block is both a
//                   source and a destination, so invocations never race.
//   gather_blocks:  staging[i] = block block_ids[i] (swap-out: the staging buffer is then read back).
//   scatter_blocks: block block_ids[i] = staging[i] (swap-in after the staging buffer was written).
// One invocation per (block of the list, word of the block).
//
// Dispatch: ceil(num_blocks_listed * block_words / WORKGROUP_SIZE) workgroups along x.

struct Params {
  count : u32,        // pairs (main) or block ids (gather / scatter)
  block_words : u32,  // block_size * n_kv_heads * row words (vec4<u32>) of one block
  block_stride : u32, // words from one block's start to the next: block_words, or a shared page's
}

@group(0) @binding(0) var<storage, read> block_pairs : array<vec2<u32>>;    // (count,) (src, dst)
@group(0) @binding(1) var<storage, read_write> k_cache : array<vec4<u32>>;  // (num_blocks, block_stride)
@group(0) @binding(2) var<storage, read_write> v_cache : array<vec4<u32>>;  // (num_blocks, block_stride)
@group(0) @binding(3) var<uniform> params : Params;
@group(0) @binding(4) var<storage, read> block_ids : array<u32>;            // (count,)
@group(0) @binding(5) var<storage, read_write> staging : array<vec4<u32>>;  // (2, count, block_words): K then V

override WORKGROUP_SIZE : u32 = 64u;

@compute @workgroup_size(WORKGROUP_SIZE)
fn main(@builtin(global_invocation_id) gid : vec3<u32>) {
  let pair = gid.x / params.block_words;
  if (pair >= params.count) {
    return;
  }
  let word = gid.x % params.block_words;
  let blocks = block_pairs[pair];
  k_cache[blocks.y * params.block_stride + word] = k_cache[blocks.x * params.block_stride + word];
  v_cache[blocks.y * params.block_stride + word] = v_cache[blocks.x * params.block_stride + word];
}

@compute @workgroup_size(WORKGROUP_SIZE)
fn gather_blocks(@builtin(global_invocation_id) gid : vec3<u32>) {
  let i = gid.x / params.block_words;
  if (i >= params.count) {
    return;
  }
  let word = gid.x % params.block_words;
  let src = block_ids[i] * params.block_stride + word;
  staging[gid.x] = k_cache[src];
  staging[params.count * params.block_words + gid.x] = v_cache[src];
}

@compute @workgroup_size(WORKGROUP_SIZE)
fn scatter_blocks(@builtin(global_invocation_id) gid : vec3<u32>) {
  let i = gid.x / params.block_words;
  if (i >= params.count) {
    return;
  }
  let word = gid.x % params.block_words;
  let dst = block_ids[i] * params.block_stride + word;
  k_cache[dst] = staging[gid.x];
  v_cache[dst] = staging[params.count * params.block_words + gid.x];
}
