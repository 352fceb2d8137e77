// y = W @ x for a few token vectors (decode), W in the q5_1 layout of py/pagedkv/model/layout.py: the gpu
// family's matvec (matvec_gpu_main.wgsl), lanes reduced with a workgroup-memory tree (adapters without subgroups).

//#include q5_1_weights.wgsl
//#include nibble_io.wgsl
//#include gpu_nibble_words.wgsl
//#include reduce_tree.wgsl
//#include matvec_gpu_main.wgsl
