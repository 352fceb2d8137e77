enable subgroups;

// Paged decode attention of the gpu family, flash-decoding pass 1 (paged_attention_gpu_main.wgsl), the
// weight sums reduced with subgroup operations.

//#include paged_kv_read.wgsl
//#include reduce_subgroup.wgsl
//#include paged_attention_gpu_main.wgsl
