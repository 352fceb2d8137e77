// y = W @ x (decode), W f32: the gpu family's matvec (matvec_gpu_main.wgsl), lanes reduced with a
// workgroup-memory tree (adapters without subgroups).

//#include f32_words.wgsl
//#include float_weights.wgsl
//#include gpu_float_words.wgsl
//#include reduce_tree.wgsl
//#include matvec_gpu_main.wgsl
