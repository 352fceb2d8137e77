// Bandwidth probe for benchmarks: stream a buffer once and reduce it. Workgroup w reads the contiguous
// chunk [w * chunk, (w + 1) * chunk) of vec4<u32>; each thread a contiguous run of chunk / WORKGROUP_SIZE
// words, four per loop trip (the fastest of the patterns tried on SwiftShader: lanes on adjacent words, one
// word per trip, reads ~10 % slower). Each thread writes its wrapping sum so nothing is optimized away.

struct Params {
  n : u32,      // vec4<u32> words in the buffer, a multiple of num_workgroups * WORKGROUP_SIZE * 4
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
  let run = params.chunk / WORKGROUP_SIZE;
  let start = wid.x * params.chunk + lid * run;
  var a0 = vec4<u32>(0u);
  var a1 = vec4<u32>(0u);
  var a2 = vec4<u32>(0u);
  var a3 = vec4<u32>(0u);
  for (var i = start; i < start + run; i += 4u) {
    a0 += data[i];
    a1 += data[i + 1u];
    a2 += data[i + 2u];
    a3 += data[i + 3u];
  }
  let acc = a0 + a1 + a2 + a3;
  out[wid.x * WORKGROUP_SIZE + lid] = acc.x + acc.y + acc.z + acc.w;
}
