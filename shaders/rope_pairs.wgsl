// Rotary embedding of adjacent pairs (`//#include rope_pairs.wgsl`: the q | k | v projection's rope_kv epilogue,
// matvec_io_rope_kv.wgsl, and the attention that computes its own q | k | v, paged_attention_gpu_fold.wgsl).

// Rows r..r+3 (two adjacent pairs of one head) rotated by their pairs' cos / sin c0, c1.
fn rope4(c0 : vec2<f32>, c1 : vec2<f32>, a : vec4<f32>) -> vec4<f32> {
  return vec4<f32>(a.x * c0.x - a.y * c0.y, a.x * c0.y + a.y * c0.x,
                   a.z * c1.x - a.w * c1.y, a.z * c1.y + a.w * c1.x);
}
