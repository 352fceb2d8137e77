// The matvec kernels' Params and NORM prologue (both families; expanded at the `//#include matvec_gain.wgsl`
// line of matvec_norm.wgsl, or of matvec_float.wgsl, whose kernels have no scales part and bind params at 3).
// The including kernel defines CODE_WORDS_PER_BLOCK (vec4 words of codes per 32-weight block) and binds `qs`
// and `params`.

struct Params {
  rows : u32,
  cols : u32,     // multiple of 32
  tokens : u32,
  eps : f32,     // NORM only
}

// NORM: y = W @ (rms_norm(x) * g), the RMSNorm fused into the projection it feeds. x is then the raw
// residual stream; each thread sums the squares of the activations it loads anyway and scales its sums
// by 1 / sqrt(mean + eps) at the end (W @ (x * g) * s = W @ (x * s * g)), except in the gpu family's f16
// matvecs, which scale x before the f16 cast (matvec_gpu_main.wgsl). The norm weight g (cols f32)
// is stored in qs right after the codes (backends/webgpu/fused.py), so it needs no binding of its own.
override NORM : bool = false;

fn gain(i : u32) -> vec4<f32> {
  return bitcast<vec4<f32>>(qs[params.rows * (params.cols / 32u) * CODE_WORDS_PER_BLOCK + i]);
}
