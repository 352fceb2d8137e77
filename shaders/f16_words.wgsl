// F16 weights (model/layout.py: little-endian f16, row-major) for the float kernels, the first part of
// matvec[_gpu[_sg]]_f16, matmul_f16 and embedding_f16 (shader_variants.py). Read as u32
// words with unpack2x16float (exact), so the device needs no shader-f16.

//#include half_words.wgsl

fn weights4(w : Word4) -> vec4<f32> {
  return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
}
