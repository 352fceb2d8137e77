// Paged decode attention of the gpu family, flash-decoding pass 1 (paged_attention_gpu_main.wgsl), the
// weight sums reduced with a workgroup-memory tree (adapters without subgroups).

//#include paged_kv_read.wgsl
//#include reduce_tree.wgsl
//#include paged_attention_gpu_main.wgsl
