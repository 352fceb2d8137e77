// y = W @ x (decode), W f16: the gpu family's matvec (matvec_gpu_main.wgsl), lanes reduced with a
// workgroup-memory tree (adapters without subgroups).

//#include f16_words.wgsl
//#include float_weights.wgsl
//#include gpu_float_words.wgsl
//#include reduce_tree.wgsl
//#include matvec_gpu_main.wgsl
