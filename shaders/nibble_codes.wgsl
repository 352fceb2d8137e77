// The decoding of every nibble-coded weight type but Q4_1's own kernels (expanded at `//#include
// nibble_codes.wgsl` lines): their extra high bits (one per weight for Q5_0 / Q5_1 / Q5_K, two for Q6_K),
// taken by mask like the nibbles, the activations of a block, the K-quants' 6-bit scales and the
// BlockScale a type's scales(i) (<type>_weights.wgsl) returns.

//#include nibbles.wgsl

// Bits 4m..4m+3 of h (one high bit per weight) as bit * 2^p, and the activations' matching pre-scale.
fn bits4(h : u32, m : u32) -> vec4<f32> {
  return vec4<f32>(vec4<u32>(h >> (4u * m)) & vec4<u32>(1u, 2u, 4u, 8u));
}

const BIT_SCALE = vec4<f32>(1.0, 0.5, 0.25, 0.125);

// Bits 8m..8m+7 of h (two high bits per weight, Q6_K) as pair * 4^p, and the matching pre-scale.
fn pairs4(h : u32, m : u32) -> vec4<f32> {
  return vec4<f32>(vec4<u32>(h >> (8u * m)) & vec4<u32>(3u, 12u, 48u, 192u));
}

const PAIR_SCALE = vec4<f32>(1.0, 0.25, 0.0625, 0.015625);

// One 32-weight block's activations, 4 per vec4 (weights 4k..4k+3 in xk).
struct X8 {
  x0 : vec4<f32>, x1 : vec4<f32>, x2 : vec4<f32>, x3 : vec4<f32>,
  x4 : vec4<f32>, x5 : vec4<f32>, x6 : vec4<f32>, x7 : vec4<f32>,
}

// The block's activations pre-scaled for nibbles_lo / nibbles_hi: even vec4s by SCALE_LO, odd ones by SCALE_HI.
fn nibble_scaled(u : X8) -> X8 {
  return X8(u.x0 * SCALE_LO, u.x1 * SCALE_HI, u.x2 * SCALE_LO, u.x3 * SCALE_HI,
            u.x4 * SCALE_LO, u.x5 * SCALE_HI, u.x6 * SCALE_LO, u.x7 * SCALE_HI);
}

fn times(u : X8, s : vec4<f32>) -> X8 {
  return X8(u.x0 * s, u.x1 * s, u.x2 * s, u.x3 * s, u.x4 * s, u.x5 * s, u.x6 * s, u.x7 * s);
}

// Sums of the block's first and second 16 activations.
fn half_sums(u : X8) -> vec2<f32> {
  let one = vec4<f32>(1.0);
  return vec2<f32>(dot((u.x0 + u.x1) + (u.x2 + u.x3), one), dot((u.x4 + u.x5) + (u.x6 + u.x7), one));
}

// Codes of one block's 4 nibble words against its nibble-scaled activations: the first and second 16 weights.
fn nibble_dots(q : vec4<u32>, x : X8) -> vec2<f32> {
  return vec2<f32>(dot(nibbles_lo(q.x), x.x0) + dot(nibbles_hi(q.x), x.x1) + dot(nibbles_lo(q.y), x.x2)
                   + dot(nibbles_hi(q.y), x.x3),
                   dot(nibbles_lo(q.z), x.x4) + dot(nibbles_hi(q.z), x.x5) + dot(nibbles_lo(q.w), x.x6)
                   + dot(nibbles_hi(q.w), x.x7));
}

// One high bit per weight (h: bit j = weight j) against the BIT_SCALE-scaled activations, per half block.
fn bit_dots(h : u32, x : X8) -> vec2<f32> {
  return vec2<f32>(dot(bits4(h, 0u), x.x0) + dot(bits4(h, 1u), x.x1) + dot(bits4(h, 2u), x.x2) + dot(bits4(h, 3u), x.x3),
                   dot(bits4(h, 4u), x.x4) + dot(bits4(h, 5u), x.x5) + dot(bits4(h, 6u), x.x6) + dot(bits4(h, 7u), x.x7));
}

// Two high bits per weight (h0: weights 0..15, h1: 16..31) against the PAIR_SCALE-scaled activations.
fn pair_dots(h0 : u32, h1 : u32, x : X8) -> vec2<f32> {
  return vec2<f32>(dot(pairs4(h0, 0u), x.x0) + dot(pairs4(h0, 1u), x.x1) + dot(pairs4(h0, 2u), x.x2)
                   + dot(pairs4(h0, 3u), x.x3),
                   dot(pairs4(h1, 0u), x.x4) + dot(pairs4(h1, 1u), x.x5) + dot(pairs4(h1, 2u), x.x6)
                   + dot(pairs4(h1, 3u), x.x7));
}

// The 6-bit scale and min of sub-block j (0..7) from a K-quant super-block's header words (d | dmin << 16,
// then the 12 packed bytes), multiplied out: (d * sc_j, dmin * m_j), as gguf computes them.
fn k_scale_min(h : vec4<u32>, j : u32) -> vec2<f32> {
  let sh = 8u * (j & 3u);
  let a = (h.y >> sh) & 0xFFu;  // byte j of the scales (j < 4) or byte j - 4
  let b = (h.z >> sh) & 0xFFu;  // byte j + 4
  let c = (h.w >> sh) & 0xFFu;  // byte j + 8 (j < 4) or j + 4
  let low = j < 4u;
  let sc = select((c & 0xFu) | ((a >> 6u) << 4u), a & 0x3Fu, low);
  let mn = select((c >> 4u) | ((b >> 6u) << 4u), b & 0x3Fu, low);
  let dm = unpack2x16float(h.x);
  return vec2<f32>(dm.x * f32(sc), dm.y * f32(mn));
}

// Signed byte k (0..3) of w.
fn sbyte(w : u32, k : u32) -> f32 {
  return f32(bitcast<i32>(w << (24u - 8u * k)) >> 24u);
}

// What a weight type's scales(i) returns for 32-weight block i (row * cols/32 + b): weight j of the block is
// a[j / 16] * q_j + m[j / 16], q_j = its nibble + 16 * its high bits (h0: weights 0..15 or all 32 one bit
// each, h1: 16..31; HIGH_BITS of the type: 0 none, 1 one bit per weight, 2 two bits per weight).
struct BlockScale {
  a : vec2<f32>,
  m : vec2<f32>,
  h0 : u32,
  h1 : u32,
}

// Weights 8c + 4 part .. + 3 (part 0: lo, 1: hi) of nibble word k of a row (c = k % 4, its place in the
// block) dequantized, a * q + m, from their nibbles as q * 16^p (nib), nib's pre-scale (scale_p) and the
// block's scales s.
fn dequant(nib : vec4<f32>, scale_p : vec4<f32>, s : BlockScale, k : u32, part : u32) -> vec4<f32> {
  let c = k & 3u;
  let upper = c >> 1u;
  let a = select(s.a.x, s.a.y, upper == 1u);
  var w = (a * scale_p) * nib + select(s.m.x, s.m.y, upper == 1u);
  if (HIGH_BITS == 1u) {
    w += (16.0 * a * BIT_SCALE) * bits4(s.h0, 2u * c + part);
  } else if (HIGH_BITS == 2u) {
    w += (16.0 * a * PAIR_SCALE) * pairs4(select(s.h0, s.h1, upper == 1u), 2u * (c & 1u) + part);
  }
  return w;
}
