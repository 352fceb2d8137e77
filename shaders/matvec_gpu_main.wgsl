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
// workgroup-memory tree of their own (group_sum3, in the reduction part's red / red3), which assumes nothing
// about subgroups.
// The 8 rows' sums (two vec4s) and NORM's sum of squares meet in one reduction (wg_sum3 / group_sum3: the
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

const ROWS : u32 = 8u;
override ROW_GROUPS : u32 = 1u;  // 1, 2, 4 or 8, dividing WORKGROUP_SIZE into groups of at least 8 lanes
override LANES : u32 = WORKGROUP_SIZE / ROW_GROUPS;
override WHOLE_BLOCKS : bool = false;

// The sums of a, b and c over lid's group of LANES lanes, returned to each of them, in the reduction part's
// workgroup memory (red: WORKGROUP_SIZE vec4s, red3: twice that). Uniform control flow only.
fn group_sum3(a : vec4<f32>, b : vec4<f32>, c : vec4<f32>, lid : u32) -> array<vec4<f32>, 3> {
  red[lid] = a;
  red3[2u * lid] = b;
  red3[2u * lid + 1u] = c;
  workgroupBarrier();
  let lane = lid % LANES;
  for (var s = LANES / 2u; s > 0u; s >>= 1u) {
    if (lane < s) {
      red[lid] += red[lid + s];
      red3[2u * lid] += red3[2u * (lid + s)];
      red3[2u * lid + 1u] += red3[2u * (lid + s) + 1u];
    }
    workgroupBarrier();
  }
  let first = lid - lane;
  let total = array<vec4<f32>, 3>(red[first], red3[2u * first], red3[2u * first + 1u]);
  workgroupBarrier();  // the next call overwrites red, red3
  return total;
}

fn row_sum3(a : vec4<f32>, b : vec4<f32>, c : vec4<f32>, lid : u32) -> array<vec4<f32>, 3> {
  if (ROW_GROUPS == 1u) {
    return wg_sum3(a, b, c, lid);
  }
  return group_sum3(a, b, c, lid);
}

struct Acc {
  lo : vec4<f32>,  // rows r0 .. r0+3
  hi : vec4<f32>,  // rows r0+4 .. r0+7
  ss : f32,  // sum of x^2 (NORM)
}

// Word j of the 8 rows (ri, rj: their first blocks) against token t's activations, into acc. s: 1 / rms where
// NORM && X_IN_F16 (known before the sums), else 1.
fn add_word(acc : ptr<function, Acc>, t : u32, j : u32, ri : vec4<u32>, rj : vec4<u32>, s : f32) {
  let v = j * X_PER_WORD;  // the word's first activation vec4 within the row
  var u0 = load_x(t, v);
  var u1 = vec4<f32>(0.0);
  if (X_PER_WORD == 2u) {
    u1 = load_x(t, v + 1u);
  }
  if (NORM) {
    if (!X_IN_F16) {
      (*acc).ss += dot(u0, u0) + dot(u1, u1);
    }
    u0 *= x_gain(v) * s;
    if (X_PER_WORD == 2u) {
      u1 *= x_gain(v + 1u) * s;
    }
  }
  let b = j / WORDS_PER_BLOCK;
  let c = j % WORDS_PER_BLOCK;
  let i = ri + b;
  let k = rj + b;
  (*acc).lo += vec4<f32>(word_dot(i.x, c, u0, u1), word_dot(i.y, c, u0, u1), word_dot(i.z, c, u0, u1),
                         word_dot(i.w, c, u0, u1));
  (*acc).hi += vec4<f32>(word_dot(k.x, c, u0, u1), word_dot(k.y, c, u0, u1), word_dot(k.z, c, u0, u1),
                         word_dot(k.w, c, u0, u1));
}

@compute @workgroup_size(WORKGROUP_SIZE)
fn main(@builtin(workgroup_id) wid : vec3<u32>, @builtin(local_invocation_index) lid : u32) {
  let lane = lid % LANES;
  // the grid has ceil(rows / (8 ROW_GROUPS)) columns: the first group's r0 < rows, a later one's may not be
  let r0 = (wid.x * ROW_GROUPS + lid / LANES) * ROWS;
  let t = wid.y;
  let nb = params.cols / 32u;
  let last = params.rows - 1u;
  let ri = vec4<u32>(min(r0, last), min(r0 + 1u, last), min(r0 + 2u, last), min(r0 + 3u, last)) * nb;
  let rj = vec4<u32>(min(r0 + 4u, last), min(r0 + 5u, last), min(r0 + 6u, last), min(r0 + 7u, last)) * nb;
  var acc = Acc(vec4<f32>(0.0), vec4<f32>(0.0), 0.0);
  if (lane == 0u) {  // the lane that stores: its epilogue's loads run beside the dot products
    prefetch(t, r0);
  }
  let words = nb * WORDS_PER_BLOCK;
  var s = 1.0;
  if (NORM && X_IN_F16) {  // 1 / rms before any activation is cast to f16
    var ss = 0.0;
    for (var v = lane; v < params.cols / 4u; v += LANES) {
      let u = load_x(t, v);
      ss += dot(u, u);
    }
    let zero = vec4<f32>(0.0);
    s = 1.0 / sqrt(row_sum3(vec4<f32>(ss, 0.0, 0.0, 0.0), zero, zero, lid)[0].x / f32(params.cols) + params.eps);
  }
  if (WHOLE_BLOCKS && (nb + LANES - 1u) / LANES * WORDS_PER_BLOCK <= (words + LANES - 1u) / LANES) {
    for (var b = lane; b < nb; b += LANES) {
      for (var c = 0u; c < WORDS_PER_BLOCK; c++) {
        add_word(&acc, t, b * WORDS_PER_BLOCK + c, ri, rj, s);
      }
    }
  } else {
    for (var j = lane; j < words; j += LANES) {
      add_word(&acc, t, j, ri, rj, s);
    }
  }
  let sums = row_sum3(acc.lo, acc.hi, vec4<f32>(acc.ss, 0.0, 0.0, 0.0), lid);
  var lo = sums[0];
  var hi = sums[1];
  if (NORM && !X_IN_F16) {
    let inv_rms = 1.0 / sqrt(sums[2].x / f32(params.cols) + params.eps);
    lo *= inv_rms;
    hi *= inv_rms;
  }
  if (lane != 0u || r0 >= params.rows) {
    return;
  }
  store8(t, r0, lo, hi);
}
