// Y = X @ W^T (prefill), W f32: matmul_float.wgsl.

//#include f32_words.wgsl
//#include matmul_float.wgsl
