// y = W @ x (decode), W f16: matvec_float.wgsl.

//#include f16_words.wgsl
//#include matvec_float.wgsl
