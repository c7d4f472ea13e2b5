//! Microscaling formats, synaptix's own block types held only by `.syn` bundles (docs/syn.md):
//! MXFP8 (OCP Microscaling Formats v1.0, E4M3 elements) here, NVFP4 further down.
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

// ---------------------------------------------------------------------------------------------
// NVFP4: E2M1 values with an E4M3 scale per 16 and an FP32 scale per tensor, in synaptix's
// self-contained block of 64 values (40 bytes): the tensor's f32 scale (little-endian, the same
// in every block of a tensor), the four E4M3 scales of its 16-value micro-blocks, then 32 bytes of
// E2M1 nibbles, element 2i in the low nibble of byte i and 2i + 1 in the high one. Value `e` of
// micro-block `m` is `(e2m1[e] * e4m3[m]) * tensor_scale`.
//
// Encoding (NVIDIA's two-level recipe): the tensor scale is amax / (6 * 448) over the tensor's
// finite values (1 when that is 0); a micro-block's scale is the E4M3 nearest (ties to even,
// saturated) to `amax / 6 / tensor_scale`; each value divided by `e4m3 * tensor_scale` (the
// product rounded to f32) is rounded to the nearest E2M1 value, ties to even, saturated at ±6.
// A micro-block holding an infinity or a NaN gets the NaN scale (0x7F) and zero values; one whose
// scale rounds to zero gets zero values.
//
// Dot products take f32 activations: per micro-block, eight lane sums (element i to lane i mod 8,
// in element order) in MXFP8's tree, times the micro-block's scale, added in order to the block's
// sum; the block's sum times the tensor scale added to the row's sum in block order.

pub(crate) const NVFP4_QK: usize = 64;
pub(crate) const NVFP4_BLOCK_BYTES: usize = 40;
const NVFP4_MICRO: usize = 16;
const E2M1_VALUES: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// The E2M1 code (4 bits) nearest to `v` (ties to the even code), saturated at ±6; `v` finite.
fn e2m1_code(v: f32) -> u8 {
    let sign = if v.is_sign_negative() { 8u8 } else { 0 };
    let a = v.abs();
    let mut best = 0u8;
    for code in 1..8u8 {
        let (d_new, d_best) = (
            (E2M1_VALUES[code as usize] - a).abs(),
            (E2M1_VALUES[best as usize] - a).abs(),
        );
        if d_new < d_best || (d_new == d_best && code % 2 == 0) {
            best = code;
        }
    }
    sign | best
}

/// The tensor scale NVFP4 takes for values whose largest finite magnitude is `amax`.
pub fn nvfp4_tensor_scale(amax: f32) -> f32 {
    if amax > 0.0 && amax.is_finite() {
        amax / (6.0 * E4M3_MAX)
    } else {
        1.0
    }
}

/// The largest finite magnitude of `x` (0 for none).
pub fn finite_amax(x: &[f32]) -> f32 {
    x.iter()
        .filter(|v| v.is_finite())
        .fold(0f32, |m, v| m.max(v.abs()))
}

/// `x` (a whole number of 64-value blocks) as NVFP4 blocks with tensor scale `tensor_scale`.
pub(crate) fn quantize_nvfp4(x: &[f32], tensor_scale: f32, out: &mut Vec<u8>) {
    for block in x.chunks_exact(NVFP4_QK) {
        out.extend_from_slice(&tensor_scale.to_le_bytes());
        let mut codes = [0u8; NVFP4_QK];
        let mut scales = [0u8; 4];
        for (m, micro) in block.chunks_exact(NVFP4_MICRO).enumerate() {
            if micro.iter().any(|v| !v.is_finite()) {
                scales[m] = 0x7f;
                continue;
            }
            let amax = micro.iter().fold(0f32, |a, v| a.max(v.abs()));
            scales[m] = e4m3_byte(amax / 6.0 / tensor_scale);
            let eff = e4m3_value(scales[m]) * tensor_scale;
            if eff == 0.0 {
                continue;
            }
            for (c, &v) in codes[m * NVFP4_MICRO..].iter_mut().zip(micro) {
                *c = e2m1_code(v / eff);
            }
        }
        out.extend_from_slice(&scales);
        out.extend(codes.chunks_exact(2).map(|p| p[0] | (p[1] << 4)));
    }
}

/// The tensor scale a block starts with; any NaN read as the canonical one, so that the kernels'
/// results do not depend on which NaN operand an instruction keeps.
#[inline]
pub(crate) fn nvfp4_block_scale(block: &[u8]) -> f32 {
    let ts = f32::from_le_bytes([block[0], block[1], block[2], block[3]]);
    if ts.is_nan() {
        f32::NAN
    } else {
        ts
    }
}

/// The value of an E4M3 scale byte (the table's: NaN for 0x7F and 0xFF).
#[inline]
pub(crate) fn e4m3_scale(b: u8) -> f32 {
    E4M3_VALUES[b as usize]
}

pub(crate) fn dequantize_nvfp4(src: &[u8], dst: &mut [f32]) {
    for (block, out) in src
        .chunks_exact(NVFP4_BLOCK_BYTES)
        .zip(dst.chunks_exact_mut(NVFP4_QK))
    {
        let ts = nvfp4_block_scale(block);
        for (i, o) in out.iter_mut().enumerate() {
            let scale = e4m3_scale(block[4 + i / NVFP4_MICRO]);
            let code = (block[8 + i / 2] >> (4 * (i % 2))) & 15;
            *o = (E2M1_VALUES[code as usize] * scale) * ts;
        }
    }
}

/// One weight row (NVFP4 blocks) dotted with f32 activations, in the order of the notes above.
pub(crate) fn dot_nvfp4(w: &[u8], a: &QuantizedActs) -> f32 {
    let mut sum = 0f32;
    for (block, x) in w
        .chunks_exact(NVFP4_BLOCK_BYTES)
        .zip(a.vals.chunks_exact(NVFP4_QK))
    {
        let ts = nvfp4_block_scale(block);
        let mut block_sum = 0f32;
        for m in 0..4 {
            let mut lanes = [0f32; 8];
            for c in 0..2 {
                for (l, lane) in lanes.iter_mut().enumerate() {
                    let i = m * NVFP4_MICRO + 8 * c + l;
                    let code = (block[8 + i / 2] >> (4 * (i % 2))) & 15;
                    *lane += E2M1_VALUES[code as usize] * x[i];
                }
            }
            let tree = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6]))
                + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
            block_sum += tree * e4m3_scale(block[4 + m]);
        }
        sum += block_sum * ts;
    }
    sum
}

#[cfg(test)]
mod nvfp4_tests {
    use super::*;

    #[test]
    fn e2m1_rounds_to_nearest_even_and_saturates() {
        let cases = [
            (0.25f32, 0u8),
            (0.75, 2),
            (1.25, 2),
            (1.75, 4),
            (2.5, 4),
            (3.5, 6),
            (5.0, 6),
            (7.0, 7),
            (-0.25, 8),
            (-5.0, 14),
            (0.3, 1),
        ];
        for (v, want) in cases {
            assert_eq!(e2m1_code(v), want, "{v}");
        }
        for code in 0..16u8 {
            assert_eq!(e2m1_code(E2M1_VALUES[code as usize]), code);
        }
    }

    #[test]
    fn blocks_decode_near_their_values() {
        let x: Vec<f32> = (0..128)
            .map(|i| ((i * 37 % 61) as f32 - 30.0) * 0.01)
            .collect();
        let ts = nvfp4_tensor_scale(finite_amax(&x));
        let mut out = Vec::new();
        quantize_nvfp4(&x, ts, &mut out);
        assert_eq!(out.len(), 2 * NVFP4_BLOCK_BYTES);
        let mut back = vec![0f32; 128];
        dequantize_nvfp4(&out, &mut back);
        for (m, (xs, bs)) in x.chunks(16).zip(back.chunks(16)).enumerate() {
            let amax = xs.iter().fold(0f32, |a, v| a.max(v.abs()));
            for (a, b) in xs.iter().zip(bs) {
                // Half of E2M1's widest step (2, between 4 and 6) of the block's scale, plus the
                // E4M3 scale's own rounding.
                assert!(
                    (a - b).abs() <= amax / 6.0 * 1.07 + 1e-6,
                    "micro-block {m}: {a} -> {b}"
                );
            }
        }
    }
}
