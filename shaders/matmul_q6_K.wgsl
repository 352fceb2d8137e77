// Y = X @ W^T for many tokens (prefill), W in the q6_K layout of py/pagedkv/model/layout.py: the cpu family's
// register-tiled matmul (matmul_nibble.wgsl over matmul_main.wgsl), dequantization fused, f32 accumulation.

//#include q6_K_weights.wgsl
//#include matmul_nibble.wgsl
