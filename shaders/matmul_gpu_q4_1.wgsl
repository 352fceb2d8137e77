// Y = X @ W^T for many tokens (prefill), W in the q4_1 layout of py/pagedkv/model/layout.py: the gpu
// family's matmul (matmul_gpu_main.wgsl), tiled through workgroup memory.

//#include q4_1_weights.wgsl
//#include gpu_q4_1_words.wgsl
//#include matmul_gpu_main.wgsl
