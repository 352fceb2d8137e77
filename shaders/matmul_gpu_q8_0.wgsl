// Y = X @ W^T for many tokens (prefill), W in the q8_0 layout of py/pagedkv/model/layout.py: the gpu
// family's matmul (matmul_gpu_main.wgsl), tiled through workgroup memory.

//#include q8_0_weights.wgsl
//#include gpu_q8_0_words.wgsl
//#include matmul_gpu_main.wgsl
