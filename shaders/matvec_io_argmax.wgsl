// The io part of the LM head in a greedy step (matvec_gpu_*_argmax): no logits row is written. Each
// workgroup keeps the best of its 8 rows (the larger value, the lower row on ties) and writes it as one
// (value, f32(row)) pair into y, (tokens, ceil(rows / 8)) pairs; argmax_gpu.wgsl with WINNERS_OF = 8 then
// scans those pairs, 8 times fewer values than the row, with numpy's rule (lowest index on ties). Rows are
// below 2^24, so f32(row) is exact. The activations are x's row of token t, as in matvec_io.wgsl.
// The final RMSNorm runs here (NORM) rather than in a dispatch of its own: the LM head's matrix is the tied
// embedding table (or output.weight), which the embedding kernel also reads and which holds no norm weight
// after its codes, so the gain (output_norm.weight, cols f32) is bound at 8.

@group(0) @binding(8) var<storage, read> norm_gain : array<vec4<f32>>;  // (cols / 4,)

fn x_gain(v : u32) -> vec4<f32> {
  return norm_gain[v];
}

fn prefetch(t : u32, r0 : u32) {  // the epilogue loads nothing
}

fn load_x(t : u32, v : u32) -> vec4<f32> {
  return x[t * (params.cols / 4u) + v];
}

fn store8(t : u32, r0 : u32, lo : vec4<f32>, hi : vec4<f32>) {
  var values = array<f32, 8>(lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w);
  let n = min(params.rows - r0, 8u);
  var value = values[0];
  var row = r0;
  for (var i = 1u; i < n; i++) {
    if (values[i] > value) {
      value = values[i];
      row = r0 + i;
    }
  }
  let o = 2u * (t * ((params.rows + 7u) / 8u) + r0 / 8u);
  y[o] = value;
  y[o + 1u] = f32(row);
}
