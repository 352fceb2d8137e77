// The io part of the q | k | v rows a decode attention workgroup computes itself (paged_attention_gpu_fold.wgsl,
// which composes this file, the weight type's parts and matvec_gpu_rows.wgsl as its `qkv_` instance,
// wgsl_instance.py): the activations are the workgroup's staged residual row `xs` (declared by the fold's body,
// outside the instance, so not renamed), NORM's gain the one stored after the codes.

fn x_gain(v : u32) -> vec4<f32> {
  return gain(v);
}

fn load_x(t : u32, v : u32) -> vec4<f32> {
  return xs[v];
}

//#include matvec_gpu_rows.wgsl
