// The cpu family's attention (paged_attention, paged_prefill_attention, composed by shader_variants.py before
// paged_attention_main.wgsl / paged_prefill_attention_main.wgsl) for heads up to 128 wide: the private
// accumulator of paged_attention_common.wgsl holds 4 slots of MAX_VEC vec4s.
const MAX_VEC : u32 = 32u;
