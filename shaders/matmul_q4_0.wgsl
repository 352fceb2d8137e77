// Y = X @ W^T for many tokens (prefill), W in the q4_0 layout of py/pagedkv/model/layout.py: the cpu family's
// register-tiled matmul (matmul_nibble.wgsl over matmul_main.wgsl), dequantization fused, f32 accumulation.

//#include q4_0_weights.wgsl
//#include matmul_nibble.wgsl
