// y = W @ x (decode), W bf16: matvec_float.wgsl.

//#include bf16_words.wgsl
//#include matvec_float.wgsl
