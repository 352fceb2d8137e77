// y = W @ x for a few token vectors (decode), W in the q5_K layout of py/pagedkv/model/layout.py: the cpu
// family's matvec (matvec_nibble.wgsl over matvec_main.wgsl), dequantization fused, f32 accumulation.

//#include q5_K_weights.wgsl
//#include nibble_io.wgsl
//#include matvec_nibble.wgsl
