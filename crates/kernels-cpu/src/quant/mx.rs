//! MXFP8 (OCP Microscaling Formats v1.0, E4M3 elements): synaptix's own block type, held only by
//! `.syn` bundles (docs/syn.md).
//!
//! Block (33 bytes, 32 consecutive values of a row): one E8M0 scale byte `e` (the value 2^(e-127),
//! 0xFF NaN), then 32 E4M3 bytes (sign, 4 exponent bits of bias 7, 3 mantissa bits; no
//! infinities, 0x7F / 0xFF NaN, largest finite 448). Value `i` is `e4m3[i] * 2^(e-127)`.
//!
//! Encoding, as the specification's reference quantizer does it: the shared exponent is
//! `floor(log2(amax)) - 8` (8 is E4M3's largest exponent), clamped to E8M0's [-127, 127] (an
//! all-zero block takes -127); each value divided by 2^shared (exact: a power of two) is rounded
//! to the nearest E4M3 value, ties to even, and saturated at ±448. A block holding an infinity or
//! a NaN gets the NaN scale (it decodes to NaN throughout) and zero elements.
//!
//! Dot products take f32 activations (no activation quantization): per block, the 32 products
//! `e4m3[i] * x[i]` go to eight lane sums (element i to lane i mod 8, in element order), the lanes
//! are added in a fixed tree, and the block sum times the scale is added to the row's sum in
//! block order (no fused multiply-adds).

use super::QuantizedActs;

pub(crate) const QK: usize = 32;
pub(crate) const BLOCK_BYTES: usize = 1 + QK;

/// E4M3's largest finite value.
const E4M3_MAX: f32 = 448.0;
/// E4M3's largest exponent (448 = 1.75 * 2^8).
const E4M3_EMAX: i32 = 8;

/// The value of every E4M3 byte (NaN for 0x7F and 0xFF).
static E4M3_VALUES: std::sync::LazyLock<[f32; 256]> = std::sync::LazyLock::new(|| {
    let mut t = [0f32; 256];
    for (b, v) in t.iter_mut().enumerate() {
        *v = e4m3_value(b as u8);
    }
    t
});

fn e4m3_value(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = ((b >> 3) & 0x0f) as i32;
    let man = (b & 0x07) as f32;
    if exp == 15 && b & 0x07 == 7 {
        return f32::NAN;
    }
    let magnitude = if exp == 0 {
        man / 8.0 * 2f32.powi(-6)
    } else {
        (1.0 + man / 8.0) * 2f32.powi(exp - 7)
    };
    sign * magnitude
}

/// The value of an E8M0 scale byte: 2^(e-127), NaN for 0xFF.
#[inline]
pub(crate) fn e8m0_value(e: u8) -> f32 {
    match e {
        0xff => f32::NAN,
        // 2^-127 is a subnormal f32; every other exponent is a normal one.
        0 => f32::from_bits(0x0040_0000),
        _ => f32::from_bits((e as u32) << 23),
    }
}

/// floor(log2(x)) of a finite x > 0, subnormals included.
fn floor_log2(x: f32) -> i32 {
    let bits = x.to_bits();
    let exp = (bits >> 23) as i32;
    if exp == 0 {
        // Subnormal: the leading set bit of the mantissa, whose unit is 2^-149.
        31 - bits.leading_zeros() as i32 - 149
    } else {
        exp - 127
    }
}

/// 2^e as f32 for e in [-127, 127] (exact).
fn pow2(e: i32) -> f32 {
    e8m0_value((e + 127) as u8)
}

/// The E4M3 byte nearest to `v` (ties to even), saturated at ±448; `v` finite.
fn e4m3_byte(v: f32) -> u8 {
    let sign = if v.is_sign_negative() { 0x80u8 } else { 0 };
    let a = v.abs().min(E4M3_MAX);
    if a == 0.0 {
        return sign;
    }
    // The spacing of E4M3 values around a: 2^(e-3) in the normal binades (e >= -6), 2^-9 below.
    let e = floor_log2(a).max(-6);
    let quantum = 2f32.powi(e - 3);
    let r = (a / quantum).round_ties_even() * quantum;
    if r == 0.0 {
        return sign;
    }
    let re = floor_log2(r);
    let bits = if re < -6 {
        (r / 2f32.powi(-9)) as u8 // subnormal: mantissa m with r = m * 2^-9
    } else {
        let man = ((r / 2f32.powi(re) - 1.0) * 8.0) as u8;
        (((re + 7) as u8) << 3) | man
    };
    sign | bits.min(0x7e)
}

/// Quantizes one block of 32 values into `out` (33 bytes).
fn quantize_block(x: &[f32], out: &mut Vec<u8>) {
    if x.iter().any(|v| !v.is_finite()) {
        out.push(0xff);
        out.extend_from_slice(&[0u8; QK]);
        return;
    }
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let shared = if amax == 0.0 {
        -127
    } else {
        (floor_log2(amax) - E4M3_EMAX).clamp(-127, 127)
    };
    out.push((shared + 127) as u8);
    let inv = pow2(-shared);
    out.extend(x.iter().map(|&v| e4m3_byte(v * inv)));
}

/// `x` (a whole number of blocks) as MXFP8 blocks appended to `out`.
pub(crate) fn quantize_mxfp8(x: &[f32], out: &mut Vec<u8>) {
    x.chunks_exact(QK).for_each(|b| quantize_block(b, out));
}

pub(crate) fn dequantize_mxfp8(src: &[u8], dst: &mut [f32]) {
    let table = &*E4M3_VALUES;
    for (block, out) in src.chunks_exact(BLOCK_BYTES).zip(dst.chunks_exact_mut(QK)) {
        let scale = e8m0_value(block[0]);
        for (o, &b) in out.iter_mut().zip(&block[1..]) {
            *o = table[b as usize] * scale;
        }
    }
}

/// One weight row (MXFP8 blocks) dotted with f32 activations, in the order of the module notes:
/// eight lane sums a block (lane l: elements l, l + 8, l + 16, l + 24 in turn), so that the
/// compiler may keep them in vector registers, added as ((l0 + l4) + (l2 + l6)) + ((l1 + l5) +
/// (l3 + l7)).
pub(crate) fn dot_mxfp8(w: &[u8], a: &QuantizedActs) -> f32 {
    let table = &*E4M3_VALUES;
    let mut sum = 0f32;
    for (block, x) in w.chunks_exact(BLOCK_BYTES).zip(a.vals.chunks_exact(QK)) {
        let q = &block[1..];
        let mut lanes = [0f32; 8];
        for c in 0..QK / 8 {
            for (l, lane) in lanes.iter_mut().enumerate() {
                *lane += table[q[8 * c + l] as usize] * x[8 * c + l];
            }
        }
        let block_sum = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6]))
            + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
        sum += block_sum * e8m0_value(block[0]);
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_finite_e4m3_value_encodes_to_its_byte() {
        for b in 0u8..=255 {
            let v = e4m3_value(b);
            if v.is_nan() {
                continue;
            }
            assert_eq!(e4m3_byte(v), b, "{b:#04x} = {v}");
        }
        assert_eq!(e4m3_value(0x7e), 448.0);
        assert_eq!(e4m3_value(0x01), 2f32.powi(-9));
        assert!(e4m3_value(0x7f).is_nan() && e4m3_value(0xff).is_nan());
    }

    #[test]
    fn rounding_ties_to_even_and_saturates() {
        // Between 1.0 (0x38) and 1.125 (0x39) the midpoint goes to the even mantissa.
        assert_eq!(e4m3_byte(1.0625), 0x38);
        assert_eq!(e4m3_byte(1.1875), 0x3a);
        assert_eq!(e4m3_byte(500.0), 0x7e);
        assert_eq!(e4m3_byte(-1e9), 0xfe);
        assert_eq!(
            e4m3_byte(2f32.powi(-11)),
            0x00,
            "a quarter of the smallest rounds to 0"
        );
        assert_eq!(e4m3_byte(-0.0), 0x80);
    }

    #[test]
    fn scales_follow_the_largest_magnitude() {
        let mut x = [0f32; 32];
        x[3] = -3.0; // floor(log2 3) = 1, shared exponent 1 - 8 = -7
        x[4] = 0.001;
        let mut out = Vec::new();
        quantize_mxfp8(&x, &mut out);
        assert_eq!(out.len(), BLOCK_BYTES);
        assert_eq!(out[0], 120);
        let mut back = [0f32; 32];
        dequantize_mxfp8(&out, &mut back);
        assert_eq!(back[3], -3.0);
        assert!((back[4] - 0.001).abs() <= 0.001 / 16.0);
        let mut zero = Vec::new();
        quantize_mxfp8(&[0.0; 32], &mut zero);
        assert_eq!(zero[0], 0);
        assert!(zero[1..].iter().all(|&b| b == 0));
        let mut bad = Vec::new();
        let mut y = [1f32; 32];
        y[7] = f32::INFINITY;
        quantize_mxfp8(&y, &mut bad);
        assert_eq!(bad[0], 0xff);
        let mut nan = [0f32; 32];
        dequantize_mxfp8(&bad, &mut nan);
        assert!(nan.iter().all(|v| v.is_nan()));
    }

    #[test]
    fn tiny_and_huge_blocks_keep_their_exponent_range() {
        for &m in &[1e-40f32, 1e-30, 3e38] {
            let x: Vec<f32> = (0..32).map(|i| m * ((i as f32 - 15.5) / 16.0)).collect();
            let mut out = Vec::new();
            quantize_mxfp8(&x, &mut out);
            let mut back = vec![0f32; 32];
            dequantize_mxfp8(&out, &mut back);
            let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
            for (a, b) in x.iter().zip(&back) {
                assert!((a - b).abs() <= amax / 8.0, "{m}: {a} -> {b}");
            }
        }
    }
}
