// Token embedding lookup from a nibble-coded table (every type but Q8_0; embedding_<type>, composed after
// <type>_weights.wgsl or q4_1_scales.wgsl by shader_variants.py):
// out[t] = dequantized row token_ids[t], as embedding.wgsl does for Q8_0. One thread per (token, 4 weights).

struct Params { tokens : u32, hidden : u32, _pad0 : u32, _pad1 : u32 }  // hidden: a multiple of the block

@group(0) @binding(0) var<storage, read> qs : array<u32>;               // (vocab, hidden/8): 8 nibbles per word
@group(0) @binding(2) var<storage, read> token_ids : array<i32>;        // (tokens,)
@group(0) @binding(3) var<storage, read_write> out : array<vec4<f32>>;  // (tokens, hidden/4)
@group(0) @binding(4) var<uniform> params : Params;

override WORKGROUP_SIZE : u32 = 64u;
// A table too large for one binding is split by rows (weight_upload.row_chunks): one dispatch per part, each
// writing the tokens whose rows it holds, ROW_BASE <= id < ROW_END.
override ROW_BASE : u32 = 0u;
override ROW_END : u32 = 0xffffffffu;
override EMBEDDING_SCALE : f32 = 1.0;  // the family's embedding scale (Gemma: sqrt(hidden))
//#include nibble_codes.wgsl

@compute @workgroup_size(WORKGROUP_SIZE)
fn main(@builtin(global_invocation_id) gid : vec3<u32>) {
  let t = gid.y;
  let j = gid.x;  // weights 4j..4j+3 of the row: half (j % 2) of nibble word j / 2
  let words = params.hidden / 4u;
  if (t >= params.tokens || j >= words) {
    return;
  }
  let id = u32(token_ids[t]);
  if (id < ROW_BASE || id >= ROW_END) {
    return;  // another part's row
  }
  let row = id - ROW_BASE;
  let w = qs[row * (params.hidden / 8u) + j / 2u];
  let s = scales(row * (params.hidden / 32u) + j / 8u);
  let part = j & 1u;
  let nib = select(nibbles_lo(w), nibbles_hi(w), part == 1u);
  out[t * words + j] = dequant(nib, select(SCALE_LO, SCALE_HI, part == 1u), s, j / 2u, part) * EMBEDDING_SCALE;
}
