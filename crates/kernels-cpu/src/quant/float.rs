//! Plain float element types (F32, F16, BF16): conversions, dequantization and the scalar
//! reference dot products.
//!
//! Weight × activation dots follow ggml's portable `ggml_vec_dot_f32` / `_f16` / `_bf16`: each
//! product is formed in f32 (both operands widened to f32 first), widened to f64 and added to a
//! single f64 sum in element order; the sum is rounded to f32 at the end. SIMD kernels keep that
//! order by running several weight rows at once, one row per f64 lane.
//!
//! [`dot_f32_slices`] (behind `ops::dot`) is a separate, faster order: element `i` is accumulated
//! with a fused multiply-add into lane `i % 32`, and the 32 lanes are combined by [`reduce32`].

/// IEEE half (binary16) bits to f32. Exact; NaN payloads keep their bits (quiet bit set).
#[inline(always)]
pub(crate) fn f16_to_f32(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32_const()
}

/// f32 to IEEE half bits like ggml's FP32_TO_FP16: round to nearest even (overflow to
/// infinity, gradual underflow); NaN becomes the quiet NaN 0x7e00 with the input's sign.
#[inline(always)]
pub(crate) fn f32_to_f16(x: f32) -> u16 {
    if x.is_nan() {
        return ((x.to_bits() >> 16) as u16 & 0x8000) | 0x7e00;
    }
    half::f16::from_f32_const(x).to_bits()
}

/// bfloat16 bits to f32 (exact: bf16 is the upper half of an f32).
#[inline(always)]
pub(crate) fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// f32 to bfloat16 bits like ggml: NaN becomes a quiet NaN, otherwise round to nearest even.
#[inline(always)]
pub(crate) fn f32_to_bf16(x: f32) -> u16 {
    let u = x.to_bits();
    if u & 0x7fff_ffff > 0x7f80_0000 {
        return ((u >> 16) | 0x40) as u16;
    }
    ((u as u64 + 0x7fff + ((u as u64 >> 16) & 1)) >> 16) as u16
}

#[inline(always)]
pub(crate) fn read_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

#[inline(always)]
pub(crate) fn read_f16(b: &[u8], at: usize) -> f32 {
    f16_to_f32(read_u16(b, at))
}

/// `src` holds `dst.len()` little-endian f32 values.
pub(crate) fn dequantize_f32(src: &[u8], dst: &mut [f32]) {
    for (c, y) in src.chunks_exact(4).zip(dst.iter_mut()) {
        *y = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
}

/// `src` holds `dst.len()` little-endian f16 values.
pub(crate) fn dequantize_f16(src: &[u8], dst: &mut [f32]) {
    for (c, y) in src.chunks_exact(2).zip(dst.iter_mut()) {
        *y = f16_to_f32(u16::from_le_bytes([c[0], c[1]]));
    }
}

/// `src` holds `dst.len()` little-endian bf16 values.
pub(crate) fn dequantize_bf16(src: &[u8], dst: &mut [f32]) {
    for (c, y) in src.chunks_exact(2).zip(dst.iter_mut()) {
        *y = bf16_to_f32(u16::from_le_bytes([c[0], c[1]]));
    }
}

/// Number of accumulator lanes of the canonical float dot order.
pub(crate) const FLOAT_LANES: usize = 32;

/// Combines the 32 lanes of a float dot: first `v[j] = (l[j] + l[j+16]) + (l[j+8] + l[j+24])`
/// for `j < 8` (a natural reduction of four 8-lane or two 16-lane accumulators), then
/// [`reduce8`].
#[inline(always)]
pub(crate) fn reduce32(l: &[f32; FLOAT_LANES]) -> f32 {
    let mut v = [0f32; 8];
    for (j, vj) in v.iter_mut().enumerate() {
        *vj = (l[j] + l[j + 16]) + (l[j + 8] + l[j + 24]);
    }
    reduce8(&v)
}

/// `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))`: the order of a 256-bit horizontal sum
/// (halves added, then pairs, then the last two).
#[inline(always)]
pub(crate) fn reduce8(l: &[f32; 8]) -> f32 {
    let a = [l[0] + l[4], l[1] + l[5], l[2] + l[6], l[3] + l[7]];
    (a[0] + a[2]) + (a[1] + a[3])
}

/// Accumulates elements `from..n` into `lanes` in the canonical order (`get_w(i) * a[i]` fused
/// into lane `i % 32`). SIMD paths use it for their tails.
#[inline(always)]
pub(crate) fn accumulate_tail(
    lanes: &mut [f32; FLOAT_LANES],
    from: usize,
    a: &[f32],
    get_w: impl Fn(usize) -> f32,
) {
    for (i, &ai) in a.iter().enumerate().skip(from) {
        let l = &mut lanes[i % FLOAT_LANES];
        *l = get_w(i).mul_add(ai, *l);
    }
}

/// The canonical float dot with weights read by `get_w`: whole 32-element chunks lane by lane
/// (a form compilers vectorize), then the tail.
#[inline(always)]
fn dot_lanes(a: &[f32], get_w: impl Fn(usize) -> f32) -> f32 {
    let mut lanes = [0f32; FLOAT_LANES];
    let full = a.len() / FLOAT_LANES * FLOAT_LANES;
    for (c, chunk) in a[..full].chunks_exact(FLOAT_LANES).enumerate() {
        for (l, (lane, &x)) in lanes.iter_mut().zip(chunk).enumerate() {
            *lane = get_w(c * FLOAT_LANES + l).mul_add(x, *lane);
        }
    }
    accumulate_tail(&mut lanes, full, a, get_w);
    reduce32(&lanes)
}

/// Scalar reference: f32 × f32 dot of equal-length slices in the 32-lane order (`ops::dot`).
pub(crate) fn dot_f32_slices(w: &[f32], a: &[f32]) -> f32 {
    dot_lanes(a, |i| w[i])
}

#[inline(always)]
pub(crate) fn read_f32(b: &[u8], i: usize) -> f32 {
    f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
}

/// ggml's float dot: `Σ f64(w_i * a_i)` in element order, products in f32, rounded to f32 once.
#[inline(always)]
fn dot_f64_serial(a: &[f32], get_w: impl Fn(usize) -> f32) -> f32 {
    let mut sum = 0f64;
    for (i, &ai) in a.iter().enumerate() {
        sum += (get_w(i) * ai) as f64;
    }
    sum as f32
}

/// Continues [`dot_f64_serial`] from `sum` over elements `from..` (SIMD kernels' tails).
#[inline(always)]
pub(crate) fn dot_f64_serial_from(
    sum: f64,
    from: usize,
    a: &[f32],
    get_w: impl Fn(usize) -> f32,
) -> f64 {
    let mut sum = sum;
    for (i, &ai) in a.iter().enumerate().skip(from) {
        sum += (get_w(i) * ai) as f64;
    }
    sum
}

/// Reference: dot of little-endian f32 weights with `a` (`w.len() == 4 * a.len()`).
pub(crate) fn dot_f32(w: &[u8], a: &[f32]) -> f32 {
    dot_f64_serial(a, |i| read_f32(w, i))
}

/// Reference: dot of f16 weights with `a` (`a` already rounded to f16 by the caller).
pub(crate) fn dot_f16(w: &[u8], a: &[f32]) -> f32 {
    dot_f64_serial(a, |i| read_f16(w, 2 * i))
}

/// Reference: dot of bf16 weights with `a` (`a` already rounded to bf16 by the caller).
pub(crate) fn dot_bf16(w: &[u8], a: &[f32]) -> f32 {
    dot_f64_serial(a, |i| bf16_to_f32(read_u16(w, 2 * i)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_round_trip_all_finite() {
        for bits in 0..=u16::MAX {
            let x = f16_to_f32(bits);
            if x.is_nan() {
                continue;
            }
            assert_eq!(f32_to_f16(x), bits, "{bits:#06x}");
        }
        assert_eq!(f32_to_f16(1.0 + 1.0 / 2048.0), 0x3c00, "ties round to even");
        assert_eq!(f32_to_f16(1.0 + 3.0 / 2048.0), 0x3c02, "ties round to even");
        assert_eq!(f32_to_f16(f32::NAN), 0x7e00);
        assert_eq!(f32_to_f16(-f32::from_bits(0x7f80_0001)), 0xfe00);
        assert_eq!(f32_to_f16(65520.0), 0x7c00, "overflow rounds to infinity");
        assert_eq!(
            f32_to_f16(2f32.powi(-25)),
            0,
            "tie below the smallest subnormal"
        );
        assert_eq!(
            f32_to_f16(1.5 * 2f32.powi(-24)),
            2,
            "subnormal tie rounds to even"
        );
    }

    #[test]
    fn bf16_rounding_matches_ggml() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        // 1 + 2^-8 is a tie between 0x3f80 and 0x3f81: even wins.
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8001)), 0x3f81);
        assert_eq!(f32_to_bf16(f32::from_bits(0x7f80_0001)), 0x7fc0);
        assert_eq!(bf16_to_f32(0xbf80), -1.0);
    }
}
