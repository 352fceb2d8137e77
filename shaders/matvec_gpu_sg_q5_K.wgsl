enable subgroups;

// y = W @ x for a few token vectors (decode), W in the q5_K layout of py/pagedkv/model/layout.py: the gpu
// family's matvec (matvec_gpu_main.wgsl), lanes reduced with subgroup operations.

//#include q5_K_weights.wgsl
//#include nibble_io.wgsl
//#include gpu_nibble_words.wgsl
//#include reduce_subgroup.wgsl
//#include matvec_gpu_main.wgsl
