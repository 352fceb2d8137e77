// The plain io part of the gpu-family matvec (matvec_gpu_main.wgsl; shader_variants.py composes it before
// the body): the activations are x's row of token t, the 8 rows' results go through the weight type's
// epilogue (put8, quant_epilogue.wgsl: plain, ACCUMULATE or SWIGLU), ACCUMULATE's read of y prefetched.

//#include matvec_io_accumulate.wgsl

fn x_gain(v : u32) -> vec4<f32> {  // NORM: the gain stored after the codes
  return gain(v);
}

fn load_x(t : u32, v : u32) -> vec4<f32> {
  return x[t * (params.cols / 4u) + v];
}

fn prefetch(t : u32, r0 : u32) {
  prefetch_y(t, r0);
}

fn store8(t : u32, r0 : u32, lo : vec4<f32>, hi : vec4<f32>) {
  store8_accumulated(t, r0, lo, hi);
}
