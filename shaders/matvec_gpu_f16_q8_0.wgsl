enable f16;

// y = W @ x for a few token vectors (decode), W in the q8_0 layout of py/pagedkv/model/layout.py: the
// gpu family's matvec (matvec_gpu_main.wgsl) in f16 arithmetic, lanes reduced with a workgroup-memory tree.

//#include q8_0_weights.wgsl
//#include gpu_q8_0_words_f16.wgsl
//#include reduce_tree.wgsl
//#include matvec_gpu_main.wgsl
