// The cpu family's attention for heads up to 256 wide (paged_attention_wide, paged_prefill_attention_wide:
// Gemma 3 270M): twice the private accumulator, which costs the narrower heads 2-3x on lavapipe, so they keep
// attention_heads_128.wgsl.
const MAX_VEC : u32 = 64u;
