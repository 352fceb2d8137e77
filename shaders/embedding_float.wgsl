// Token embedding lookup from an f32 / f16 / bf16 table (embedding_f32 / embedding_f16 / embedding_bf16,
// expanded at their `//#include embedding_float.wgsl` line after <type>_words.wgsl): out[t] = row
// token_ids[t] in f32, exact. One thread per (token, 4 weights). Token ids are range-checked on the host.

struct Params {
  tokens : u32,
  hidden : u32,   // multiple of 32
  _pad0 : u32,
  _pad1 : u32,
}

@group(0) @binding(0) var<storage, read> table : array<Word4>;          // (vocab, hidden/4)
@group(0) @binding(1) var<storage, read> token_ids : array<i32>;        // (tokens,)
@group(0) @binding(2) var<storage, read_write> out : array<vec4<f32>>;  // (tokens, hidden/4)
@group(0) @binding(3) var<uniform> params : Params;

override WORKGROUP_SIZE : u32 = 64u;

@compute @workgroup_size(WORKGROUP_SIZE)
fn main(@builtin(global_invocation_id) gid : vec3<u32>) {
  let t = gid.y;
  let j = gid.x;  // weights 4j..4j+3 of the row
  let words = params.hidden / 4u;
  if (t >= params.tokens || j >= words) {
    return;
  }
  out[t * words + j] = weights4(table[u32(token_ids[t]) * words + j]);
}
