// The dependent-dispatch floor (bench/kernels.py): one lane adds params.step to the counter the dispatch
// before it wrote, so every dispatch of a chain waits for the one before (a storage read after write across
// dispatches, as a decode step's kernels each read what the one before wrote) and does nothing else. The
// counter after a chain of N is N * step more: the benchmark checks it, so the chain really ran in order.

struct Params {
  step : u32,
}

@group(0) @binding(0) var<storage, read_write> counter : array<u32>;  // (1,)
@group(0) @binding(1) var<uniform> params : Params;

override WORKGROUP_SIZE : u32 = 1u;

@compute @workgroup_size(WORKGROUP_SIZE)
fn main() {
  counter[0] = counter[0] + params.step;
}
