// y = W @ x (decode), W f32: matvec_float.wgsl.

//#include f32_words.wgsl
//#include matvec_float.wgsl
