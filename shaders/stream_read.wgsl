// Bandwidth probe for benchmarks: stream a buffer once and reduce it. Workgroup w
// reads the contiguous chunk [w * chunk, (w + 1) * chunk) of vec4<u32>, its lanes
// on adjacent words; each thread writes its wrapping sum so nothing is optimized away.

struct Params {
  n : u32,      // vec4<u32> words in the buffer
  chunk : u32,  // words per workgroup
  _pad0 : u32,
  _pad1 : u32,
}

@group(0) @binding(0) var<storage, read> data : array<vec4<u32>>;  // (n,)
@group(0) @binding(1) var<storage, read_write> out : array<u32>;   // (num_workgroups * WORKGROUP_SIZE,)
@group(0) @binding(2) var<uniform> params : Params;

override WORKGROUP_SIZE : u32 = 64u;

@compute @workgroup_size(WORKGROUP_SIZE)
fn main(@builtin(workgroup_id) wid : vec3<u32>, @builtin(local_invocation_index) lid : u32) {
  let start = wid.x * params.chunk;
  let end = min(start + params.chunk, params.n);
  var acc = vec4<u32>(0u);
  for (var i = start + lid; i < end; i += WORKGROUP_SIZE) {
    acc += data[i];
  }
  out[wid.x * WORKGROUP_SIZE + lid] = acc.x + acc.y + acc.z + acc.w;
}
