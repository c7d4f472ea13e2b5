//! Weight quantization: f32 values to a stored type, byte for byte as ggml's reference
//! quantizers (`quantize_row_*_ref`, what `llama-quantize` runs without an importance matrix)
//! and its f16 / bf16 conversions produce them.
//!
//! Per 32-element block:
//! - Q8_0: `d = amax / 127`, `q = roundf(x / d)` (as the activation quantizer);
//! - Q4_0 / Q5_0: `d = max / -8` (`/ -16`) with `max` the value of largest magnitude (the first
//!   one on ties), `q = min(15, (int8)(x / d + 8.5))` (`31`, `16.5`);
//! - Q4_1 / Q5_1: `d = (max - min) / 15` (`/ 31`), `m = min`, `q = (int8)((x - min) / d + 0.5)`,
//!   capped at 15 for Q4_1 only, as ggml does;
//!
//! where `/ d` is a multiplication by `id = 1 / d` (0 when `d` is 0), C's float-to-integer
//! conversions truncate, and `d`, `m` are stored as halves.

use synaptix_core::{DType, Error, Result};

use super::float::{f32_to_bf16, f32_to_f16};
use super::legacy::c_f32_to_i8;

/// Elements per block of the legacy types.
const QK: usize = 32;

/// The types [`quantize_weights`] produces.
pub const QUANTIZE_TARGETS: [DType; 8] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::Q8_0,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
];

/// `x` quantized to `dtype`, appended to `out` (`x.len()` must be a whole number of blocks).
pub fn quantize_weights(dtype: DType, x: &[f32], out: &mut Vec<u8>) -> Result<()> {
    const OP: &str = "quantize_weights";
    if !QUANTIZE_TARGETS.contains(&dtype) {
        return Err(Error::UnsupportedDType { op: OP, dtype });
    }
    if !x.len().is_multiple_of(dtype.block_len()) {
        return Err(Error::ShapeMismatch {
            op: OP,
            detail: format!("{} values are not whole {dtype} blocks", x.len()),
        });
    }
    out.reserve(x.len() / dtype.block_len() * dtype.block_bytes());
    match dtype {
        DType::F32 => x
            .iter()
            .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        DType::F16 => x
            .iter()
            .for_each(|&v| out.extend_from_slice(&f32_to_f16(v).to_le_bytes())),
        DType::BF16 => x
            .iter()
            .for_each(|&v| out.extend_from_slice(&f32_to_bf16(v).to_le_bytes())),
        _ => {
            let block: fn(&[f32], &mut Vec<u8>) = match dtype {
                DType::Q8_0 => block_q8_0,
                DType::Q4_0 => block_q4_0,
                DType::Q4_1 => block_q4_1,
                DType::Q5_0 => block_q5_0,
                _ => block_q5_1,
            };
            x.chunks_exact(QK).for_each(|b| block(b, out));
        }
    }
    Ok(())
}

fn push_half(out: &mut Vec<u8>, v: f32) {
    out.extend_from_slice(&f32_to_f16(v).to_le_bytes());
}

fn inverse(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

/// The value of largest magnitude (the first on ties; 0 for an all-zero block), as ggml's
/// `if (amax < fabsf(v)) { amax = fabsf(v); max = v; }`.
fn signed_max(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// ggml's `if (v < min) min = v; if (v > max) max = v;` from `FLT_MAX` / `-FLT_MAX`.
fn min_max(x: &[f32]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

fn block_q8_0(x: &[f32], out: &mut Vec<u8>) {
    // ggml: amax = MAX(amax, fabsf(v)), which keeps a NaN.
    let amax = x
        .iter()
        .fold(0f32, |m, v| if m > v.abs() { m } else { v.abs() });
    let d = amax / 127.0;
    let id = inverse(d);
    push_half(out, d);
    out.extend(x.iter().map(|&v| c_f32_to_i8((v * id).round()) as u8));
}

/// Q4_0 / Q5_0: `BITS`-bit quants offset by `2^(BITS-1)`.
fn quants_symmetric<const BITS: u32>(x: &[f32]) -> (f32, [u8; QK]) {
    let half = (1u32 << (BITS - 1)) as f32;
    let top = (1u8 << BITS) - 1;
    let d = signed_max(x) / -half;
    let id = inverse(d);
    let mut q = [0u8; QK];
    for (qj, &v) in q.iter_mut().zip(x) {
        *qj = (c_f32_to_i8(v * id + (half + 0.5)) as u8).min(top);
    }
    (d, q)
}

/// Q4_1 / Q5_1: `BITS`-bit quants above the block's minimum (capped for Q4_1 only, as ggml).
fn quants_affine<const BITS: u32>(x: &[f32]) -> (f32, f32, [u8; QK]) {
    let (min, max) = min_max(x);
    let d = (max - min) / ((1u32 << BITS) - 1) as f32;
    let id = inverse(d);
    let mut q = [0u8; QK];
    for (qj, &v) in q.iter_mut().zip(x) {
        let raw = c_f32_to_i8((v - min) * id + 0.5) as u8;
        *qj = if BITS == 4 { raw.min(15) } else { raw };
    }
    (d, min, q)
}

/// Nibbles: element j low, element j + 16 high.
fn push_nibbles(out: &mut Vec<u8>, q: &[u8; QK]) {
    out.extend((0..QK / 2).map(|j| (q[j] & 0x0f) | ((q[j + QK / 2] & 0x0f) << 4)));
}

/// The fifth bits: bit j of a little-endian u32 for element j.
fn push_fifth_bits(out: &mut Vec<u8>, q: &[u8; QK]) {
    let qh = q
        .iter()
        .enumerate()
        .fold(0u32, |h, (j, &v)| h | (((v as u32 & 0x10) >> 4) << j));
    out.extend_from_slice(&qh.to_le_bytes());
}

fn block_q4_0(x: &[f32], out: &mut Vec<u8>) {
    let (d, q) = quants_symmetric::<4>(x);
    push_half(out, d);
    push_nibbles(out, &q);
}

fn block_q5_0(x: &[f32], out: &mut Vec<u8>) {
    let (d, q) = quants_symmetric::<5>(x);
    push_half(out, d);
    push_fifth_bits(out, &q);
    push_nibbles(out, &q);
}

fn block_q4_1(x: &[f32], out: &mut Vec<u8>) {
    let (d, m, q) = quants_affine::<4>(x);
    push_half(out, d);
    push_half(out, m);
    push_nibbles(out, &q);
}

fn block_q5_1(x: &[f32], out: &mut Vec<u8>) {
    let (d, m, q) = quants_affine::<5>(x);
    push_half(out, d);
    push_half(out, m);
    push_fifth_bits(out, &q);
    push_nibbles(out, &q);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dequantize;

    /// Values with every kind of block: random, all zero, constant, a single spike, mixed
    /// signs with the extreme negative.
    fn values() -> Vec<f32> {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        };
        let mut v: Vec<f32> = (0..32 * 40).map(|_| next() * 0.1).collect();
        v[..32].fill(0.0);
        v[32..64].fill(0.25);
        v[64..96].fill(0.0);
        v[70] = -3.0;
        v[96..128].iter_mut().for_each(|x| *x = -x.abs());
        v
    }

    /// Every quantized type dequantizes back within half a step of each value.
    #[test]
    fn round_trip_is_within_half_a_step() {
        let x = values();
        for dtype in QUANTIZE_TARGETS {
            let mut bytes = Vec::new();
            quantize_weights(dtype, &x, &mut bytes).unwrap();
            assert_eq!(
                bytes.len(),
                x.len() / dtype.block_len() * dtype.block_bytes()
            );
            let mut back = vec![0f32; x.len()];
            dequantize(dtype, &bytes, &mut back).unwrap();
            for (b, (block, got)) in x.chunks(32).zip(back.chunks(32)).enumerate() {
                let (min, max) = min_max(block);
                let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
                let step = match dtype {
                    DType::Q8_0 => amax / 127.0,
                    DType::Q4_0 => amax / 8.0,
                    DType::Q5_0 => amax / 16.0,
                    DType::Q4_1 => (max - min) / 15.0,
                    DType::Q5_1 => (max - min) / 31.0,
                    _ => amax / 256.0,
                };
                // Q4_0 / Q5_0 reach -8d..7d (-16d..15d): the end opposite the extreme value is
                // clamped a whole step short.
                let steps = if matches!(dtype, DType::Q4_0 | DType::Q5_0) {
                    1.0
                } else {
                    0.5
                };
                for (i, (&a, &g)) in block.iter().zip(got).enumerate() {
                    // Halves round d and m; allow for that beyond the rounding.
                    let tol = step * steps + amax * 2e-3 + 1e-6;
                    assert!(
                        (a - g).abs() <= tol,
                        "{dtype} block {b} element {i}: {a} came back as {g} (tolerance {tol})"
                    );
                }
            }
        }
    }

    #[test]
    fn partial_blocks_and_other_types_are_errors() {
        let mut out = Vec::new();
        assert!(quantize_weights(DType::Q4_0, &[0.0; 33], &mut out).is_err());
        assert!(quantize_weights(DType::Q4K, &[0.0; 256], &mut out).is_err());
        assert!(out.is_empty());
    }
}
