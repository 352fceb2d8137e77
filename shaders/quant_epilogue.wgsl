// Epilogues shared by the quantized matvec_* / matmul_* kernels (expanded by ShaderLibrary at their
// `//#include quant_epilogue.wgsl` line): ACCUMULATE (residual add), SWIGLU, and the output layout of a
// projection that is not stacked (Y_STRIDE / Y_OFFSET, SILU_MUL). The including kernel binds `y` and `params`.

// ACCUMULATE: y += W @ x instead of y = W @ x (the residual add fused into the output projections;
// each element of y is read and written by one thread only).
override ACCUMULATE : bool = false;
// SWIGLU: W holds gate and up rows interleaved by fours (gate r..r+3, up r..r+3, ...; backends/webgpu/fused.py), so
// a thread's 8 rows are 4 gate rows and their 4 up rows: it writes act = silu(gate) * up, (tokens, rows / 2),
// and the SwiGLU costs no dispatch of its own. rows must be a multiple of 8.
override SWIGLU : bool = false;
// GELU: the gated activation is GELU's tanh form (Gemma's GeGLU) instead of SiLU, for SWIGLU and SILU_MUL alike.
override GELU : bool = false;

// A layer whose q / k / v (or gate / up) have no lossless common type runs them as separate matrices
// (backends/webgpu/fused.py): Y_STRIDE / Y_OFFSET (0 / 0: rows / 0) place a member's rows in the columns
// Y_OFFSET.. of the stacked (tokens, Y_STRIDE) q | k | v output, and SILU_MUL makes the up projection
// write silu(y) * (W @ x) over the gate projection's y, so both keep the stacked path's layout.
override Y_STRIDE : u32 = 0u;
override Y_OFFSET : u32 = 0u;
override SILU_MUL : bool = false;

// silu(g), or gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) (kernels/ref_ops.gelu_tanh). tanh's
// argument is clamped to +-10, where tanh is 1 in f32 already, so no implementation overflows an exp inside it.
fn act4(g : vec4<f32>) -> vec4<f32> {
  if (GELU) {
    let u = 0.7978845608028654 * g * (vec4<f32>(1.0) + 0.044715 * g * g);
    return 0.5 * g * (vec4<f32>(1.0) + tanh(clamp(u, vec4<f32>(-10.0), vec4<f32>(10.0))));
  }
  return g / (vec4<f32>(1.0) + exp(-g));
}

fn swiglu4(gate : vec4<f32>, up : vec4<f32>) -> vec4<f32> {
  return act4(gate) * up;
}

fn put_act(t : u32, r0 : u32, gate : vec4<f32>, up : vec4<f32>) {
  let a = swiglu4(gate, up);
  let o = t * (params.rows / 2u) + r0 / 2u;
  y[o] = a.x;
  y[o + 1u] = a.y;
  y[o + 2u] = a.z;
  y[o + 3u] = a.w;
}

fn put(i : u32, v : f32) {
  if (ACCUMULATE) {
    y[i] = y[i] + v;
  } else if (SILU_MUL) {
    y[i] = act4(vec4<f32>(y[i])).x * v;
  } else {
    y[i] = v;
  }
}

// Rows r0..r0+3 of token t; rows past the end are not written.
fn put4(t : u32, r0 : u32, acc : vec4<f32>) {
  let o = t * select(Y_STRIDE, params.rows, Y_STRIDE == 0u) + Y_OFFSET + r0;
  let n = params.rows - r0;
  put(o, acc.x);
  if (n > 1u) { put(o + 1u, acc.y); }
  if (n > 2u) { put(o + 2u, acc.z); }
  if (n > 3u) { put(o + 3u, acc.w); }
}

// A matvec's 8 rows r0..r0+7 of token t (lo, hi): silu(gate) * up of its 4 gate / 4 up rows (SWIGLU), else
// the rows that exist.
fn put8(t : u32, r0 : u32, lo : vec4<f32>, hi : vec4<f32>) {
  if (SWIGLU) {
    put_act(t, r0, lo, hi);
    return;
  }
  put4(t, r0, lo);
  if (params.rows - r0 > 4u) {
    put4(t, r0 + 4u, hi);
  }
}
