// Token embedding lookup from an f32 / f16 / bf16 table (embedding_f32 / embedding_f16 / embedding_bf16,
// composed after <type>_words.wgsl by shader_variants.py): out[t] = row
// token_ids[t] in f32, exact. Token ids are range-checked on the host.

struct Params { tokens : u32, hidden : u32, _pad : vec2<u32> }  // hidden: a multiple of 32

override WORKGROUP_SIZE : u32 = 64u;
// A table too large for one binding is split by rows (weight_upload.row_chunks): one dispatch per part, each
// writing the tokens whose rows it holds, ROW_BASE <= id < ROW_END.
override ROW_BASE : u32 = 0u;
override ROW_END : u32 = 0xffffffffu;
override EMBEDDING_SCALE : f32 = 1.0;  // the family's embedding scale (Gemma: sqrt(hidden))

@group(0) @binding(0) var<storage, read> table : array<Word4>;          // (vocab, hidden/4)
@group(0) @binding(1) var<storage, read> token_ids : array<i32>;        // (tokens,)
@group(0) @binding(2) var<storage, read_write> out : array<vec4<f32>>;  // (tokens, hidden/4)
@group(0) @binding(3) var<uniform> params : Params;

// One thread per (token gid.y, weights 4 gid.x .. 4 gid.x + 3 of its row).
@compute @workgroup_size(WORKGROUP_SIZE)
fn main(@builtin(global_invocation_id) gid : vec3<u32>) {
  let words = params.hidden / 4u;
  if (gid.y >= params.tokens || gid.x >= words) {
    return;
  }
  let id = u32(token_ids[gid.y]);
  if (id >= ROW_BASE && id < ROW_END) {  // else another part's row
    out[gid.y * words + gid.x] = weights4(table[(id - ROW_BASE) * words + gid.x]) * EMBEDDING_SCALE;
  }
}
