// Token embedding lookup from the repacked Q8_0 table (py/pagedkv/model/layout.py):
// out[t] = dequantized row token_ids[t]. One thread per (token, 4 weights): one u32
// of int8 codes in, one vec4<f32> out. Token ids are range-checked on the host.

struct Params {
  tokens : u32,
  hidden : u32,   // multiple of 32
  _pad0 : u32,
  _pad1 : u32,
}

@group(0) @binding(0) var<storage, read> qs : array<u32>;               // (vocab, hidden/4): 4 int8 codes
@group(0) @binding(1) var<storage, read> d : array<u32>;                // (vocab * hidden/32) f16, two per u32
@group(0) @binding(2) var<storage, read> token_ids : array<i32>;        // (tokens,)
@group(0) @binding(3) var<storage, read_write> out : array<vec4<f32>>;  // (tokens, hidden/4)
@group(0) @binding(4) var<uniform> params : Params;

override WORKGROUP_SIZE : u32 = 64u;
// A table too large for one binding is split by rows (weight_upload.row_chunks): one dispatch per part, each
// writing the tokens whose rows it holds, ROW_BASE <= id < ROW_END.
override ROW_BASE : u32 = 0u;
override ROW_END : u32 = 0xffffffffu;
override EMBEDDING_SCALE : f32 = 1.0;  // the family's embedding scale (Gemma: sqrt(hidden)), after dequantization

fn codes(w : u32) -> vec4<f32> {
  return vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(w) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u));
}

@compute @workgroup_size(WORKGROUP_SIZE)
fn main(@builtin(global_invocation_id) gid : vec3<u32>) {
  let t = gid.y;
  let j = gid.x;  // word index within the row: weights 4j..4j+3
  let words = params.hidden / 4u;
  if (t >= params.tokens || j >= words) {
    return;
  }
  let id = u32(token_ids[t]);
  if (id < ROW_BASE || id >= ROW_END) {
    return;  // another part's row
  }
  let row = id - ROW_BASE;
  let s = row * (params.hidden / 32u) + j / 8u;
  let pair = unpack2x16float(d[s >> 1u]);
  let scale = select(pair.x, pair.y, (s & 1u) == 1u);
  out[t * words + j] = scale * codes(qs[row * words + j]) * EMBEDDING_SCALE;
}
