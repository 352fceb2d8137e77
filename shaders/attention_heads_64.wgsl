// The cpu family's attention for heads up to 64 wide (paged_attention_narrow, paged_prefill_attention_narrow:
// SmolLM2, Llama 3.2 1B, Qwen2.5 0.5B): half the private accumulator of attention_heads_128.wgsl. An unused
// half is not free: lavapipe's JIT took 10.2 s against 5.1 s for SmolLM2's decode variant.
const MAX_VEC : u32 = 16u;
