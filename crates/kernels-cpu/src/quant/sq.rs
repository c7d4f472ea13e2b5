//! SQ1 .. SQ8: synaptix's portable block formats, held only by `.syn` bundles (docs/syn.md).
//!
//! A super-block covers 256 consecutive values of a row as eight sub-blocks of 32. It starts with
//! a 20-byte header: `d` and `dmin` (IEEE halves), `sub_scale[8]`, `sub_min[8]` (bytes); then each
//! sub-block's `b` little-endian u32 bit-planes, bit `i` of word `j` being bit `j` of value `i`'s
//! code `q` (0 .. 2^b - 1). Value `i` of sub-block `s` is `d * sub_scale[s] * q - dmin * sub_min[s]`
//! (computed as `(d * sub_scale) * q - (dmin * sub_min)` in f32). `b + 0.625` bits a weight.
//!
//! Encoding: each sub-block's scale and offset are searched by squared error (codes for a grid of
//! candidate scales around `range / (2^b - 1)`, each refined by least squares for its codes), the
//! eight scales and offsets are stored as bytes of the super-block's `d` and `dmin` (the largest
//! over 255), and the codes are chosen again for the stored scales.
//!
//! Dot products take f32 activations: per sub-block, the sums `Σ q·x` and `Σ x` each as eight lane
//! sums (element i to lane i mod 8, in element order) and MXFP8's lane tree; the sub-block's term
//! `(d·sub_scale)·Σqx - (dmin·sub_min)·Σx` is added to the row's sum in sub-block order.

use super::float::{f16_to_f32, f32_to_f16, read_f16};
use super::QuantizedActs;

pub(crate) const QK: usize = 256;
pub(crate) const SUB: usize = 32;
pub(crate) const HEADER: usize = 20;

/// Bytes of one super-block of `bits`-bit codes.
pub(crate) const fn block_bytes(bits: usize) -> usize {
    HEADER + 8 * 4 * bits
}

/// The codes of one sub-block from its bit-planes.
#[inline]
fn codes(planes: &[u8], bits: usize) -> [u32; SUB] {
    let mut q = [0u32; SUB];
    for j in 0..bits {
        let word = u32::from_le_bytes([
            planes[4 * j],
            planes[4 * j + 1],
            planes[4 * j + 2],
            planes[4 * j + 3],
        ]);
        for (i, qi) in q.iter_mut().enumerate() {
            *qi |= ((word >> i) & 1) << j;
        }
    }
    q
}

/// The scale and offset `(a, m)` with `x ≈ a·q - m` and the codes for them, least-squares best
/// over a grid of candidate scales; `a >= 0` and `m >= 0` (where least squares would add a positive
/// offset, the offset is 0 and the scale is fitted alone).
fn search(x: &[f32], nmax: u32) -> (f32, f32) {
    let lo = x.iter().fold(f32::INFINITY, |m, &v| m.min(v)).min(0.0);
    let hi = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    if hi <= lo {
        return (0.0, -lo);
    }
    let n = nmax as f32;
    let (mut best, mut best_err) = ((hi - lo) / n, f32::INFINITY);
    let mut best_m = -lo;
    for step in -10..=10 {
        let iscale = (n + 0.1 * step as f32) / (hi - lo);
        if iscale <= 0.0 {
            continue;
        }
        let q: Vec<f32> = x
            .iter()
            .map(|&v| ((v - lo) * iscale).round().clamp(0.0, n))
            .collect();
        // Least squares for v ≈ a·q + c over the codes, then c = -m clamped to m >= 0.
        let k = x.len() as f32;
        let (sq, sqq, sv, sqv) = q
            .iter()
            .zip(x)
            .fold((0f32, 0f32, 0f32, 0f32), |acc, (&qi, &v)| {
                (acc.0 + qi, acc.1 + qi * qi, acc.2 + v, acc.3 + qi * v)
            });
        let det = k * sqq - sq * sq;
        if det <= 0.0 {
            continue;
        }
        let mut a = (k * sqv - sq * sv) / det;
        let mut c = (sqq * sv - sq * sqv) / det;
        if c > 0.0 {
            c = 0.0;
            a = if sqq > 0.0 { sqv / sqq } else { 0.0 };
        }
        if a <= 0.0 {
            continue;
        }
        let err: f32 = q
            .iter()
            .zip(x)
            .map(|(&qi, &v)| (a * qi + c - v).powi(2))
            .sum();
        if err < best_err {
            (best, best_m, best_err) = (a, -c, err);
        }
    }
    (best, best_m)
}

/// `x` (whole super-blocks) as SQ`bits` blocks appended to `out`.
pub(crate) fn quantize_sq(x: &[f32], bits: usize, out: &mut Vec<u8>) {
    let nmax = (1u32 << bits) - 1;
    for block in x.chunks_exact(QK) {
        let finite: Vec<f32> = block
            .iter()
            .map(|&v| if v.is_finite() { v } else { 0.0 })
            .collect();
        let mut scales = [0f32; 8];
        let mut mins = [0f32; 8];
        for (s, sub) in finite.chunks_exact(SUB).enumerate() {
            (scales[s], mins[s]) = search(sub, nmax);
        }
        let max_scale = scales.iter().fold(0f32, |m, &v| m.max(v));
        let max_min = mins.iter().fold(0f32, |m, &v| m.max(v));
        let d = f16_to_f32(f32_to_f16(max_scale / 255.0));
        let dmin = f16_to_f32(f32_to_f16(max_min / 255.0));
        let byte = |v: f32, unit: f32| {
            if unit > 0.0 {
                (v / unit).round().clamp(0.0, 255.0) as u8
            } else {
                0
            }
        };
        let sub_scale: [u8; 8] = core::array::from_fn(|s| byte(scales[s], d));
        let sub_min: [u8; 8] = core::array::from_fn(|s| byte(mins[s], dmin));
        out.extend_from_slice(&f32_to_f16(d).to_le_bytes());
        out.extend_from_slice(&f32_to_f16(dmin).to_le_bytes());
        out.extend_from_slice(&sub_scale);
        out.extend_from_slice(&sub_min);
        for (s, sub) in finite.chunks_exact(SUB).enumerate() {
            let a = d * sub_scale[s] as f32;
            let m = dmin * sub_min[s] as f32;
            let mut planes = vec![0u32; bits];
            for (i, &v) in sub.iter().enumerate() {
                let q = if a > 0.0 {
                    ((v + m) / a).round().clamp(0.0, nmax as f32) as u32
                } else {
                    0
                };
                for (j, p) in planes.iter_mut().enumerate() {
                    *p |= ((q >> j) & 1) << i;
                }
            }
            planes
                .iter()
                .for_each(|p| out.extend_from_slice(&p.to_le_bytes()));
        }
    }
}

pub(crate) fn dequantize_sq(src: &[u8], dst: &mut [f32], bits: usize) {
    for (block, out) in src
        .chunks_exact(block_bytes(bits))
        .zip(dst.chunks_exact_mut(QK))
    {
        let d = read_f16(block, 0);
        let dmin = read_f16(block, 2);
        for (s, o) in out.chunks_exact_mut(SUB).enumerate() {
            let a = d * block[4 + s] as f32;
            let m = dmin * block[12 + s] as f32;
            let q = codes(&block[HEADER + 4 * bits * s..], bits);
            for (oi, &qi) in o.iter_mut().zip(&q) {
                *oi = a * qi as f32 - m;
            }
        }
    }
}

/// MXFP8's lane tree over eight lane sums.
#[inline]
fn tree(l: &[f32; 8]) -> f32 {
    ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]))
}

/// One weight row (SQ`bits` super-blocks) dotted with f32 activations (module notes' order).
pub(crate) fn dot_sq(w: &[u8], a: &QuantizedActs, bits: usize) -> f32 {
    let mut sum = 0f32;
    for (block, x) in w
        .chunks_exact(block_bytes(bits))
        .zip(a.vals.chunks_exact(QK))
    {
        let d = read_f16(block, 0);
        let dmin = read_f16(block, 2);
        for (s, xs) in x.chunks_exact(SUB).enumerate() {
            let q = codes(&block[HEADER + 4 * bits * s..], bits);
            let (mut qx, mut sx) = ([0f32; 8], [0f32; 8]);
            for c in 0..SUB / 8 {
                for l in 0..8 {
                    let i = 8 * c + l;
                    qx[l] += q[i] as f32 * xs[i];
                    sx[l] += xs[i];
                }
            }
            let a = d * block[4 + s] as f32;
            let m = dmin * block[12 + s] as f32;
            sum += a * tree(&qx) - m * tree(&sx);
        }
    }
    sum
}

macro_rules! sq_entry_points {
    ($($bits:literal: $deq:ident, $dot:ident;)*) => {
        $(
            pub(crate) fn $deq(src: &[u8], dst: &mut [f32]) {
                dequantize_sq(src, dst, $bits)
            }
            pub(crate) fn $dot(w: &[u8], a: &QuantizedActs) -> f32 {
                dot_sq(w, a, $bits)
            }
        )*
    };
}

sq_entry_points! {
    1: dequantize_sq1, dot_sq1;
    2: dequantize_sq2, dot_sq2;
    3: dequantize_sq3, dot_sq3;
    4: dequantize_sq4, dot_sq4;
    5: dequantize_sq5, dot_sq5;
    6: dequantize_sq6, dot_sq6;
    7: dequantize_sq7, dot_sq7;
    8: dequantize_sq8, dot_sq8;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bit_planes_hold_each_code_bit() {
        // Codes i % 8 in three planes: plane j's bit i is bit j of i % 8.
        let mut block = vec![0u8; block_bytes(3)];
        let mut planes = [0u32; 3];
        for i in 0..32u32 {
            for (j, p) in planes.iter_mut().enumerate() {
                *p |= (((i % 8) >> j) & 1) << i;
            }
        }
        for (j, p) in planes.iter().enumerate() {
            block[HEADER + 4 * j..HEADER + 4 * j + 4].copy_from_slice(&p.to_le_bytes());
        }
        assert_eq!(planes[0], 0xaaaa_aaaa);
        let q = codes(&block[HEADER..], 3);
        assert!(q.iter().enumerate().all(|(i, &c)| c == i as u32 % 8));
        // d = 1, sub_scale 2, dmin = 0.5, sub_min 4: values 2q - 2.
        block[..2].copy_from_slice(&f32_to_f16(1.0).to_le_bytes());
        block[2..4].copy_from_slice(&f32_to_f16(0.5).to_le_bytes());
        block[4] = 2;
        block[12] = 4;
        let mut out = vec![0f32; QK];
        dequantize_sq(&block, &mut out, 3);
        assert!(out[..32]
            .iter()
            .enumerate()
            .all(|(i, &v)| v == 2.0 * (i % 8) as f32 - 2.0));
        assert!(out[32..].iter().all(|&v| v == 0.0));
    }

    #[test]
    fn error_shrinks_with_every_bit() {
        let x: Vec<f32> = (0..1024)
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * if i % 97 == 0 { 4.0 } else { 1.0 })
            .collect();
        let mut last = f64::INFINITY;
        for bits in 1..=8 {
            let mut out = Vec::new();
            quantize_sq(&x, bits, &mut out);
            assert_eq!(out.len(), 4 * block_bytes(bits));
            let mut back = vec![0f32; x.len()];
            dequantize_sq(&out, &mut back, bits);
            let err: f64 = x
                .iter()
                .zip(&back)
                .map(|(a, b)| ((a - b) as f64).powi(2))
                .sum::<f64>()
                / x.len() as f64;
            assert!(
                err < last,
                "SQ{bits}: mse {err} not below SQ{}'s {last}",
                bits - 1
            );
            last = err;
        }
        assert!(last < 1e-4, "SQ8 mse {last}");
    }

    #[test]
    fn dots_match_the_decoded_values() {
        let x: Vec<f32> = (0..512)
            .map(|i| ((i * 613 % 1009) as f32 / 504.5 - 1.0) * 0.3)
            .collect();
        let acts: Vec<f32> = (0..512)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
            .collect();
        let a = super::super::quantize_acts(synaptix_core::DType::SQ4, &acts).unwrap();
        for bits in 1..=8 {
            let mut w = Vec::new();
            quantize_sq(&x, bits, &mut w);
            let mut vals = vec![0f32; x.len()];
            dequantize_sq(&w, &mut vals, bits);
            let dot = dot_sq(&w, &a, bits);
            let (exact, size) = vals
                .iter()
                .zip(&acts)
                .fold((0f64, 0f64), |(e, s), (&v, &y)| {
                    (e + v as f64 * y as f64, s + (v as f64 * y as f64).abs())
                });
            // The offset term is a difference of two sums: allow their size too.
            let offsets: f64 = acts.iter().map(|&y| y.abs() as f64).sum::<f64>() * 0.3;
            assert!(
                (dot as f64 - exact).abs() <= (size + offsets) * 1e-5,
                "SQ{bits}: {dot} vs {exact}"
            );
        }
    }
}
