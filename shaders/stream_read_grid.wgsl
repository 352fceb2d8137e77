// Bandwidth yardstick for real GPUs: a grid-stride, coalesced read of a buffer, reduced so nothing is optimized
// away. T = num_workgroups * WORKGROUP_SIZE threads; thread t reads vec4<u32> words t, t + T, t + 2T, ...,
// four per loop trip, so the lanes of a warp (wave, SIMD group) load adjacent 16-byte words at every step and
// enough workgroups are in flight to fill any GPU (bench/kernels.py launches 1,024 of 256). The runs pattern of
// stream_read.wgsl (each thread its own contiguous run) is the faster one on the CPU emulators only.

struct Params {
  n : u32,        // vec4<u32> words in the buffer, a multiple of 4 * threads
  threads : u32,  // num_workgroups * WORKGROUP_SIZE
  _pad0 : u32,
  _pad1 : u32,
}

@group(0) @binding(0) var<storage, read> data : array<vec4<u32>>;  // (n,)
@group(0) @binding(1) var<storage, read_write> out : array<u32>;   // (threads,)
@group(0) @binding(2) var<uniform> params : Params;

override WORKGROUP_SIZE : u32 = 256u;

@compute @workgroup_size(WORKGROUP_SIZE)
fn main(@builtin(global_invocation_id) gid : vec3<u32>) {
  let t = params.threads;
  var a0 = vec4<u32>(0u);
  var a1 = vec4<u32>(0u);
  var a2 = vec4<u32>(0u);
  var a3 = vec4<u32>(0u);
  for (var i = gid.x; i < params.n; i += 4u * t) {
    a0 += data[i];
    a1 += data[i + t];
    a2 += data[i + 2u * t];
    a3 += data[i + 3u * t];
  }
  let acc = a0 + a1 + a2 + a3;
  out[gid.x] = acc.x + acc.y + acc.z + acc.w;
}
