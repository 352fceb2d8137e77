// BF16 weights (model/layout.py: the high halves of little-endian f32, row-major) for the float kernels,
// the first part of matvec[_gpu[_sg]]_bf16, matmul_bf16 and embedding_bf16 (shader_variants.py): a bf16 is
// the f32 whose high 16 bits it is (exact).

//#include half_words.wgsl

fn weights4(w : Word4) -> vec4<f32> {
  return bitcast<vec4<f32>>(vec4<u32>(w.x << 16u, w.x & 0xffff0000u, w.y << 16u, w.y & 0xffff0000u));
}
