// The body shared by the gpu-family matvec kernels (matvec_gpu[_sg][_f16]_<dtype>, composed after the
// weight type's parts and a reduce_*.wgsl fragment by shader_variants.py).
// Shaped for real GPUs, where the cpu family's lone 8-row threads leave most lanes idle and read 2 KB
// apart: one workgroup of WORKGROUP_SIZE threads owns ROWS = 8 rows of one token (workgroup_id.y) and
// its lanes stride along K one u32 word of codes at a time, so neighbouring lanes read neighbouring
// words (coalesced) and each activation is loaded once for all 8 rows. The per-lane sums meet in
// wg_sum() (subgroups or a workgroup tree). The including kernel defines WORDS_PER_BLOCK (u32 words of
// codes per 32-weight block), X_PER_WORD (vec4 activations a word meets) and word_dot(block index,
// word within the block, its activations); its io part (matvec_io*.wgsl) load_x(token, vec4 index), the
// activations, x_gain(vec4 index), NORM's gain (the one stored after the codes, matvec_gain.wgsl, or one of
// its own), prefetch(token, r0), which lane 0 calls before the loop along K to load what its epilogue needs
// (so no load waits after the last barrier; r0 may be past the rows), and store8(token, r0, lo, hi), what
// becomes of the 8 rows' results.
// Every branch around a barrier or subgroup operation depends only on workgroup_id, override
// constants or the uniform params (no early return before the reductions).
// ROW_GROUPS > 1 (a matrix whose rows are short, tuned per projection: tuning.py): the workgroup's lanes
// split into ROW_GROUPS groups of LANES, each group owning 8 rows and striding along K by LANES, so a row
// of 72 words does not leave most of 64 lanes idle on its last trip; the groups' sums meet in a
// workgroup-memory tree (tree_sum3.wgsl, in the reduction part's red / red3), which assumes nothing about
// subgroups.
// The 8 rows' sums (two vec4s) and NORM's sum of squares meet in one reduction (wg_sum3 / tree_sum3: the
// barriers of one), not three; each is added in the order a reduction of its own would add it.
// WHOLE_BLOCKS (tuned per projection): where it adds no trip along K (ceil(blocks / LANES) * WORDS_PER_BLOCK <=
// ceil(words / LANES), e.g. K = 2,048 on 64 lanes), a lane takes whole 32-weight blocks, their words back to
// back: the block's scales are the same for its words (read and decoded once where the compiler keeps them)
// and its 16 or 32 bytes of codes and 128 bytes of activations are adjacent (wide loads), where striding by
// words has every lane decode its block's scales for each word. Decided from the uniform params: every lane
// takes the same way. (lavapipe runs it 1.8x slower at K = 2,048: the tuner keeps it only where it wins.)
// NORM (the RMSNorm fused in front, matvec_gain.wgsl): with f32 activations each lane sums the squares of the
// activations it loads anyway and the 8 rows' sums are scaled by 1 / rms at the end (W @ (x * g) * s =
// W @ (x * s * g)). An f16 decoder (X_IN_F16) cannot wait: the raw residual times the gain overflows f16 above
// 65,504 / |g| (outlier activations of a few thousand; Gemma 3's post norms feed larger ones), so there 1 / rms
// comes first, in f32, from a pass of its own over the token's row (cols floats, against rows x cols weights),
// and the f16 operand is the normalised x * g.

//#include matvec_gpu_rows.wgsl

@compute @workgroup_size(WORKGROUP_SIZE)
fn main(@builtin(workgroup_id) wid : vec3<u32>, @builtin(local_invocation_index) lid : u32) {
  let lane = lid % LANES;
  // the grid has ceil(rows / (8 ROW_GROUPS)) columns: the first group's r0 < rows, a later one's may not be
  let r0 = (wid.x * ROW_GROUPS + lid / LANES) * ROWS;
  let t = wid.y;
  if (lane == 0u) {  // the lane that stores: its epilogue's loads run beside the dot products
    prefetch(t, r0);
  }
  let s = f16_norm_scale(t, lane, lid);  // 1 / rms before any activation is cast to f16
  let rows = rows8(t, r0, lane, lid, s);
  if (lane != 0u || r0 >= params.rows) {
    return;
  }
  store8(t, r0, rows[0], rows[1]);
}
