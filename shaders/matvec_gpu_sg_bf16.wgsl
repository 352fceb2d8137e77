enable subgroups;

// y = W @ x (decode), W bf16: the gpu family's matvec (matvec_gpu_main.wgsl), lanes reduced with subgroup
// operations.

//#include bf16_words.wgsl
//#include float_weights.wgsl
//#include gpu_float_words.wgsl
//#include reduce_subgroup.wgsl
//#include matvec_gpu_main.wgsl
