// The body shared by the gpu-family prefill matmuls (matmul_gpu_<dtype>, composed after <dtype>_weights.wgsl
// and gpu_<dtype>_words.wgsl by shader_variants.py).
// Y (tokens, rows) = X (tokens, cols) @ W^T, tiled through workgroup memory for real GPUs: a workgroup of
// WORKGROUP_SIZE threads owns a tile of 8 * ROW_GROUPS rows x THREAD_TOKENS * WORKGROUP_SIZE / ROW_GROUPS
// tokens. For each 32-weight block along K it stages the tile's activations (neighbouring lanes read
// neighbouring vec4s of a token) and its rows' weights, dequantized once for every token (neighbouring lanes
// read neighbouring code words of a row: the layout's rows are contiguous along K), then every thread
// multiplies its own 8-row x THREAD_TOKENS-token register tile out of workgroup memory. A thread's 8 rows are
// consecutive, so the SWIGLU epilogue finds 4 gate rows and their 4 up rows in its own registers.
// THREAD_TOKENS 4 (the default) reuses each staged weight most; 2 or 1 launch 2x / 4x the threads for the same
// tokens, for a GPU that a short prompt's 4-token tiles leave mostly idle (first-boot tuning picks).
// Rows / tokens past the end are clamped when staged, never written. The barriers sit in the loop over
// blocks, whose bound is the uniform params.cols: uniform control flow (no early return before them).

override ROW_GROUPS : u32 = 8u;  // threads along rows; WORKGROUP_SIZE / ROW_GROUPS along tokens
override THREAD_TOKENS : u32 = 4u;  // tokens of a thread's register tile: 4, 2 or 1
const BLOCK_VEC4 : u32 = 8u;     // vec4s of one 32-weight block
const STRIDE : u32 = 9u;         // vec4s per staged row: one of padding, so a thread's rows fall in different banks

var<workgroup> w_tile : array<vec4<f32>, 8u * ROW_GROUPS * STRIDE>;  // (tile rows, 8 + 1) dequantized weights
var<workgroup> x_tile : array<vec4<f32>, THREAD_TOKENS * (WORKGROUP_SIZE / ROW_GROUPS) * STRIDE>;  // (tile tokens, 8 + 1)

// Rows r..r+3 of one token: weights a..d (4 weights each) against activations u.
fn dot4(a : vec4<f32>, b : vec4<f32>, c : vec4<f32>, d : vec4<f32>, u : vec4<f32>) -> vec4<f32> {
  return vec4<f32>(dot(a, u), dot(b, u), dot(c, u), dot(d, u));
}

//#include matmul_tile_store.wgsl

// Block b of the tile's activations and weights into workgroup memory.
fn stage(b : u32, row0 : u32, tok0 : u32, lid : u32) {
  let tile_tokens = THREAD_TOKENS * (WORKGROUP_SIZE / ROW_GROUPS);
  let last_token = params.tokens - 1u;
  for (var i = lid; i < tile_tokens * BLOCK_VEC4; i += WORKGROUP_SIZE) {
    let t = min(tok0 + i / BLOCK_VEC4, last_token);
    x_tile[(i / BLOCK_VEC4) * STRIDE + i % BLOCK_VEC4] = x[t * (params.cols / 4u) + b * BLOCK_VEC4 + i % BLOCK_VEC4];
  }
  let nb = params.cols / 32u;
  let last_row = params.rows - 1u;
  for (var i = lid; i < 8u * ROW_GROUPS * WORDS_PER_BLOCK; i += WORKGROUP_SIZE) {
    let r = i / WORDS_PER_BLOCK;
    let c = i % WORDS_PER_BLOCK;
    let w = word_weights(min(row0 + r, last_row) * nb + b, c);
    w_tile[r * STRIDE + c * X_PER_WORD] = w[0];
    if (X_PER_WORD == 2u) {
      w_tile[r * STRIDE + c * X_PER_WORD + 1u] = w[1];
    }
  }
}

@compute @workgroup_size(WORKGROUP_SIZE)
fn main(@builtin(workgroup_id) wid : vec3<u32>, @builtin(local_invocation_index) lid : u32) {
  let row0 = wid.x * 8u * ROW_GROUPS;
  let tok0 = wid.y * THREAD_TOKENS * (WORKGROUP_SIZE / ROW_GROUPS);
  let wr = (lid % ROW_GROUPS) * 8u;  // this thread's first row and first token within the tile
  let xt = (lid / ROW_GROUPS) * THREAD_TOKENS;
  // [2j]: token xt + j, rows wr..wr+3; [2j + 1]: rows wr+4..wr+7. Indexed by constants only: registers.
  var acc : array<vec4<f32>, 8>;
  for (var b = 0u; b < params.cols / 32u; b++) {
    stage(b, row0, tok0, lid);
    workgroupBarrier();
    for (var k = 0u; k < BLOCK_VEC4; k++) {
      let w = wr * STRIDE + k;
      let wa = w_tile[w];
      let wb = w_tile[w + STRIDE];
      let wc = w_tile[w + 2u * STRIDE];
      let wd = w_tile[w + 3u * STRIDE];
      let we = w_tile[w + 4u * STRIDE];
      let wf = w_tile[w + 5u * STRIDE];
      let wg = w_tile[w + 6u * STRIDE];
      let wh = w_tile[w + 7u * STRIDE];
      var u = x_tile[xt * STRIDE + k];
      acc[0] += dot4(wa, wb, wc, wd, u);
      acc[1] += dot4(we, wf, wg, wh, u);
      if (THREAD_TOKENS > 1u) {  // a pipeline constant: the branches not taken are compiled out
        u = x_tile[(xt + 1u) * STRIDE + k];
        acc[2] += dot4(wa, wb, wc, wd, u);
        acc[3] += dot4(we, wf, wg, wh, u);
      }
      if (THREAD_TOKENS > 2u) {
        u = x_tile[(xt + 2u) * STRIDE + k];
        acc[4] += dot4(wa, wb, wc, wd, u);
        acc[5] += dot4(we, wf, wg, wh, u);
        u = x_tile[(xt + 3u) * STRIDE + k];
        acc[6] += dot4(wa, wb, wc, wd, u);
        acc[7] += dot4(we, wf, wg, wh, u);
      }
    }
    workgroupBarrier();  // the next block overwrites the tiles
  }
  let r0 = row0 + wr;
  let t0 = tok0 + xt;
  if (r0 >= params.rows || t0 >= params.tokens) {
    return;
  }
  put_tile(t0, r0, THREAD_TOKENS, acc[0], acc[1], acc[2], acc[3], acc[4], acc[5], acc[6], acc[7]);
}
