// y = W @ x for a few token vectors (decode, the LM head), W f32 / f16 / bf16 (the cpu family's
// matvec_f32 / matvec_f16 / matvec_bf16, composed after <type>_words.wgsl by shader_variants.py):
// matvec_main.wgsl's 8-row threads, weights converted to f32, f32 accumulation.

//#include float_weights.wgsl

override WORKGROUP_SIZE : u32 = 32u;

// One row's contribution from block i: its 32 activations are x0..x7.
fn block(i : u32, x0 : vec4<f32>, x1 : vec4<f32>, x2 : vec4<f32>, x3 : vec4<f32>,
         x4 : vec4<f32>, x5 : vec4<f32>, x6 : vec4<f32>, x7 : vec4<f32>) -> f32 {
  return dot(block_weights(i, 0u), x0) + dot(block_weights(i, 1u), x1) + dot(block_weights(i, 2u), x2)
       + dot(block_weights(i, 3u), x3) + dot(block_weights(i, 4u), x4) + dot(block_weights(i, 5u), x5)
       + dot(block_weights(i, 6u), x6) + dot(block_weights(i, 7u), x7);
}

//#include matvec_block_rows.wgsl

//#include matvec_main.wgsl
