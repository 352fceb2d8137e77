// Y = X @ W^T (prefill), W bf16: matmul_float.wgsl.

//#include bf16_words.wgsl
//#include matmul_float.wgsl
