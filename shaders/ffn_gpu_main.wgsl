// A decode layer's whole FFN in one dispatch (ffn_gpu[_sg]_<gate|up type>_<down type>, composed by
// shader_variants.py): the gate | up matvec with its RMSNorm and SwiGLU, then the down projection split along
// K. Workgroup (p, t) owns FFN activations p * 4 SLICE_VEC4 .. of token t (the last workgroup's slice may run
// past ffn: those activations are 0): it computes them exactly as matvec_gpu_main.wgsl would (same rows8,
// same SwiGLU: the same bits), keeps them in workgroup memory, and multiplies them by the matching COLUMNS of
// down, writing a split-K partial of the hidden vector after x's rows in x's buffer, which is bound as y (read
// and written: (tokens, hidden) x, then (parts, tokens, hidden) partials; binding x as well would alias a
// writable binding, and the consumers read the partials through the binding they read x by, within WebGPU's 10
// storage buffers a stage). Nothing is added into the residual stream here: the next layer's q | k | v matvec sums the partials into x on load
// (matvec_io_rope_kv.wgsl, SPLIT_PARTS) and its output projection adds them into x with its residual
// (matvec_io_merge.wgsl), as that projection merges the attention partitions. No workgroup waits on another.
// Parts: the gate | up weight type's parts (qs, scales, y, params; x unused), a reduce_*.wgsl part, and
// down's parts as a `down_` instance (wgsl_instance.py: down_qs, its scales at bindings 16, 17; down_word_dot).
// What it costs against two dispatches: each workgroup reads the token's x (hidden floats, from cache) once
// for its slice, as every gate | up matvec workgroup does, and its down columns are a strided read (one lane a
// down row, SLICE_VEC4 / 8 blocks of it); the consumers read parts x hidden partials instead of one x.
// docs/performance.md has the figures.

override SLICE_VEC4 : u32 = 8u;  // activation vec4s a workgroup computes: a multiple of 8 (whole 32-blocks of down)

var<workgroup> act : array<vec4<f32>, SLICE_VEC4>;  // silu(gate) * up of the slice (GELU: gelu_tanh(gate) * up)

fn x_gain(v : u32) -> vec4<f32> {  // NORM: the gain stored after the gate | up codes
  return gain(v);
}

fn load_x(t : u32, v : u32) -> vec4<f32> {  // x's rows lead y (see above)
  let i = t * params.cols + 4u * v;
  return vec4<f32>(y[i], y[i + 1u], y[i + 2u], y[i + 3u]);
}

//#include matvec_gpu_rows.wgsl

@compute @workgroup_size(WORKGROUP_SIZE)
fn main(@builtin(workgroup_id) wid : vec3<u32>, @builtin(local_invocation_index) lid : u32) {
  let lane = lid % LANES;
  let group = lid / LANES;
  let p = wid.x;
  let t = wid.y;
  let s = f16_norm_scale(t, lane, lid);
  // 8 gate | up rows (4 gate, their 4 up: fused.INTERLEAVE) give one activation vec4; SLICE_VEC4 is a multiple of
  // ROW_GROUPS (plan.py): every group takes the same trips, counted by a uniform j (rows8 holds barriers)
  for (var j = 0u; j < SLICE_VEC4 / ROW_GROUPS; j++) {
    let k = j * ROW_GROUPS + group;
    let r0 = (p * SLICE_VEC4 + k) * ROWS;
    let rows = rows8(t, r0, lane, lid, s);
    if (lane == 0u) {
      act[k] = select(vec4<f32>(0.0), swiglu4(rows[0], rows[1]), r0 < params.rows);
    }
  }
  workgroupBarrier();
  // down (hidden rows, ffn cols): row r's blocks of this slice against act, one lane a row
  let hidden = params.cols;
  let nb = params.rows / 64u;  // down's 32-blocks a row: ffn / 32, ffn = rows / 2
  let slice_blocks = SLICE_VEC4 / 8u;
  let first = p * slice_blocks;
  let blocks = min(slice_blocks, nb - min(first, nb));
  for (var r = lid; r < hidden; r += WORKGROUP_SIZE) {
    var sum = 0.0;
    for (var b = 0u; b < blocks; b++) {
      for (var c = 0u; c < down_WORDS_PER_BLOCK; c++) {
        let v = b * 8u + c * down_X_PER_WORD;
        var u1 = vec4<f32>(0.0);
        if (down_X_PER_WORD == 2u) {
          u1 = act[v + 1u];
        }
        sum += down_word_dot(r * nb + first + b, c, act[v], u1);
      }
    }
    y[((p + 1u) * params.tokens + t) * hidden + r] = sum;
  }
}
