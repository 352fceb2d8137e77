// Y = X @ W^T (prefill), W f16: matmul_float.wgsl.

//#include f16_words.wgsl
//#include matmul_float.wgsl
