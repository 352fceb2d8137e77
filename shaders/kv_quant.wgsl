// The KV quantizers' arithmetic, bit-exact with numpy's (py/pagedkv/kv/dtypes.py): the scale, the rounding of
// a value to its code for each quantized KV_FORMAT (2 int8, 3 fp8-e4m3, 4 int4, 5 int4-asym). Included by
// kv_write_quant.wgsl (`//#include`), which declares KV_FORMAT and KV_BITS.

const FLT_MIN : f32 = 1.17549435e-38;  // smallest normal f32: smaller scales are stored as 0
const F16_MAX : f32 = 65504.0;
const F16_MIN_NORMAL : f32 = 6.103515625e-05;  // 2^-14

// The scale is amax times f32(1 / qmax) (bit patterns below = numpy's np.float32(1 / qmax)): a product
// is correctly rounded on every WebGPU implementation, a division is not (WGSL allows 2.5 ULP; SwiftShader's
// amax / 127.0 differed from numpy's in the last bit).
fn rcp_top() -> f32 {
  return bitcast<f32>(select(select(select(0x3c010204u, 0x3e124925u, KV_FORMAT == 4u), 0x3d888889u, KV_FORMAT == 5u),
                            0x3b124925u, KV_FORMAT == 3u));
}

// int4-asym's step and minimum live on the normal f16 numbers; rounding to them is done on the f32 bits
// (drop or round up the 13 mantissa bits an f16 lacks) because WGSL leaves the rounding of an f32 -> f16
// conversion to the implementation. pack2x16float then only ever sees exact f16 values.
fn round_away_to_f16(v : f32) -> f32 {
  let b = bitcast<u32>(v);
  return bitcast<f32>(select((b & 0xFFFFE000u) + 0x2000u, b, (b & 0x1FFFu) == 0u));
}

// The largest of {0, normal f16} at or below lo (|lo| <= F16_MAX); 0 when |lo| < 2^-14, a cut that a
// denormal flushed to zero cannot move.
fn f16_floor(lo : f32) -> f32 {
  if (lo >= F16_MIN_NORMAL) {
    return bitcast<f32>(bitcast<u32>(lo) & 0xFFFFE000u);
  }
  return select(round_away_to_f16(lo), 0.0, lo > -F16_MIN_NORMAL);
}

// The smallest normal f16 at or above d >= 0.
fn f16_ceil(d : f32) -> f32 {
  return select(round_away_to_f16(d), F16_MIN_NORMAL, d < F16_MIN_NORMAL);
}

// Dekker's split: v = hi + lo with hi holding the upper 12 of the 24 mantissa bits; products of halves
// are exact in f32.
fn split(v : f32) -> vec2<f32> {
  let c = 4097.0 * v;
  let hi = c - (c - v);
  return vec2<f32>(hi, v - hi);
}

// Which side of the rounding midpoint m (a short-mantissa value) the EXACT quotient a / d lies on, d > 0,
// a near m * d: +1 above, -1 below, 0 exactly on it. m * d = p + e exactly (Dekker's two-product, only
// correctly rounded * and -), and a - p is exact (Sterbenz: a and p are within a factor of 2).
fn side_of_midpoint(a : f32, m : f32, d : f32) -> i32 {
  let p = m * d;
  let ms = split(m);
  let ds = split(d);
  let e = ((ms.x * ds.x - p) + ms.x * ds.y + ms.y * ds.x) + ms.y * ds.y;
  let diff = a - p;
  return select(select(0, -1, diff < e), 1, diff > e);
}

// The integer nearest to the exact x / d, ties to even. The f32 quotient is within 2.5 ULP of it, so it
// rounds right unless it lies within 1e-4 of a midpoint k + 0.5; those (rare) cases are decided exactly.
fn nearest_int(x : f32, d : f32) -> f32 {
  let y = x / d;
  let lo = floor(y);
  if (abs(y - lo - 0.5) > 1.0e-4) {
    return round(y);
  }
  let side = side_of_midpoint(x, lo + 0.5, d);
  if (side == 0) {
    return select(lo + 1.0, lo, lo % 2.0 == 0.0);  // tie: the even neighbour
  }
  return select(lo, lo + 1.0, side > 0);
}

fn e4m3_value(c : u32) -> f32 {  // magnitude codes 0..0x7F
  let e = c >> 3u;
  let m = c & 7u;
  return select(bitcast<f32>(((e + 120u) << 23u) | (m << 20u)), f32(m) * 0.001953125, e == 0u);
}

// The e4m3 magnitude code (0..0x7E) nearest to the exact |x| / d, ties to the even code (kv_dtype.py).
fn e4m3_magnitude(ax : f32, d : f32) -> u32 {
  let a = ax / d;
  var lo : u32;  // the code truncating a: the largest e4m3 value <= a (to within the quotient's error)
  if (a < 0.015625) {  // below 2^-6: subnormal, multiples of 2^-9
    lo = u32(floor(a * 512.0));
  } else {
    let bits = bitcast<u32>(a);
    lo = (((bits >> 23u) - 120u) << 3u) | ((bits >> 20u) & 7u);
  }
  if (lo >= 0x7Eu) {
    return 0x7Eu;
  }
  let v0 = e4m3_value(lo);
  let v1 = e4m3_value(lo + 1u);
  let mid = 0.5 * (v0 + v1);  // exact: v0 and v1 have 4 significant bits
  var side = select(-1, 1, a > mid);
  if (abs(a - mid) <= 1.0e-4 * mid) {
    side = side_of_midpoint(ax, mid, d);
  }
  if (side == 0) {
    return select(lo + 1u, lo, lo % 2u == 0u);
  }
  return select(lo, lo + 1u, side > 0);
}

// The code of value x in a group of scale (step) d > 0 and minimum m (int4-asym), as a KV_BITS-bit field.
fn encode(x : f32, d : f32, m : f32) -> u32 {
  if (KV_FORMAT == 5u) {
    return u32(clamp(nearest_int(clamp(x, -F16_MAX, F16_MAX) - m, d), 0.0, 15.0));
  }
  if (KV_FORMAT == 3u) {
    return e4m3_magnitude(abs(x), d) | select(0u, 0x80u, x < 0.0);
  }
  let qmax = select(127.0, 7.0, KV_FORMAT == 4u);
  let q = i32(clamp(nearest_int(x, d), -qmax, qmax));
  return bitcast<u32>(q) & (0xFFFFFFFFu >> (32u - KV_BITS));  // a KV_BITS-bit two's complement field
}
