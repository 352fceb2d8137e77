// The 8-row dot products of the gpu-family matvec (matvec_gpu_main.wgsl, whose header says how they are shaped)
// as functions, so that a kernel that multiplies two matrices in one dispatch (ffn_gpu_main.wgsl: gate | up,
// then down) runs the first exactly as the matvec does (`//#include matvec_gpu_rows.wgsl`). The including
// kernel composes the weight type's parts and a reduce_*.wgsl part before it and defines the io functions
// (load_x, x_gain).

const ROWS : u32 = 8u;
override ROW_GROUPS : u32 = 1u;  // 1, 2, 4 or 8, dividing WORKGROUP_SIZE into groups of at least 8 lanes
override LANES : u32 = WORKGROUP_SIZE / ROW_GROUPS;
override WHOLE_BLOCKS : bool = false;

fn row_sum3(a : vec4<f32>, b : vec4<f32>, c : vec4<f32>, lid : u32) -> array<vec4<f32>, 3> {
  if (ROW_GROUPS == 1u) {
    return wg_sum3(a, b, c, lid);
  }
  return tree_sum3(a, b, c, lid, LANES);
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

// 1 / rms of token t's row where NORM && X_IN_F16, from a pass of its own before any activation is cast to
// f16; else 1 (NORM with f32 activations scales the sums afterwards: rows8's third sum). Uniform control flow.
fn f16_norm_scale(t : u32, lane : u32, lid : u32) -> f32 {
  if (!(NORM && X_IN_F16)) {
    return 1.0;
  }
  var ss = 0.0;
  for (var v = lane; v < params.cols / 4u; v += LANES) {
    let u = load_x(t, v);
    ss += dot(u, u);
  }
  let zero = vec4<f32>(0.0);
  return 1.0 / sqrt(row_sum3(vec4<f32>(ss, 0.0, 0.0, 0.0), zero, zero, lid)[0].x / f32(params.cols) + params.eps);
}

// Rows r0..r0+7 of token t against its activations, summed over lid's group of LANES lanes (lane: lid's place
// in it) and returned to each of them: the 8 sums, scaled by 1 / rms where NORM with f32 activations (s:
// f16_norm_scale's). Rows past the end repeat the last row. Uniform control flow only.
fn rows8(t : u32, r0 : u32, lane : u32, lid : u32, s : f32) -> array<vec4<f32>, 2> {
  let nb = params.cols / 32u;
  let last = params.rows - 1u;
  let ri = vec4<u32>(min(r0, last), min(r0 + 1u, last), min(r0 + 2u, last), min(r0 + 3u, last)) * nb;
  let rj = vec4<u32>(min(r0 + 4u, last), min(r0 + 5u, last), min(r0 + 6u, last), min(r0 + 7u, last)) * nb;
  var acc = Acc(vec4<f32>(0.0), vec4<f32>(0.0), 0.0);
  let words = nb * WORDS_PER_BLOCK;
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
  return array<vec4<f32>, 2>(lo, hi);
}
