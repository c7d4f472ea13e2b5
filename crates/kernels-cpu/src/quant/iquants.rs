//! ggml's 4-bit non-linear types: codes index a 16-value table instead of standing for
//! themselves.
//!
//! - IQ4_NL: blocks of 32, 18 bytes: f16 `d`, then 16 bytes of codes (element `j` in the low
//!   nibble of byte `j`, element `j + 16` in its high nibble); value = `d · T[code]`.
//! - IQ4_XS: super-blocks of 256, 136 bytes: f16 `d`, u16 `scales_h` (2 bits a sub-block),
//!   `scales_l[4]` (4 bits a sub-block), then 8 sub-blocks of 32 laid out as IQ4_NL's codes;
//!   sub-block `i`'s scale is `d · (l_i - 32)` with `l_i` the 6-bit concatenation.
//!
//! Dot products are ggml's `_generic` ones, in their order: IQ4_NL against Q8_0 activations
//! (per block `(d_a · d_w) · Σ a·T[q]`), IQ4_XS against Q8_K (per sub-block
//! `(d_w · d_a · (l - 32)) · Σ a·T[q]`), the integer sums exact.

use super::float::read_f16;
use super::QuantizedActs;

/// ggml's `kvalues_iq4nl`.
pub(crate) const IQ4NL_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

const QK: usize = 32;
const QK_K: usize = 256;
pub(crate) const IQ4NL_BYTES: usize = 18;
pub(crate) const IQ4XS_BYTES: usize = 136;

/// The 6-bit scale of sub-block `ib` of an IQ4_XS super-block, minus 32.
#[inline(always)]
pub(crate) fn iq4_xs_scale(blk: &[u8], ib: usize) -> i32 {
    let h = u16::from_le_bytes([blk[2], blk[3]]);
    let low = (blk[4 + ib / 2] >> (4 * (ib % 2))) & 0xf;
    let high = ((h >> (2 * ib)) & 3) as u8;
    (low | (high << 4)) as i32 - 32
}

/// Σ a_j · T[code_j] over one 32-value block of codes (16 bytes) and activations.
#[inline(always)]
fn table_sum(codes: &[u8], a: &[i8]) -> i32 {
    let (mut s1, mut s2) = (0i32, 0i32);
    for j in 0..16 {
        s1 += a[j] as i32 * IQ4NL_VALUES[(codes[j] & 0xf) as usize] as i32;
        s2 += a[j + 16] as i32 * IQ4NL_VALUES[(codes[j] >> 4) as usize] as i32;
    }
    s1 + s2
}

fn expand(codes: &[u8], scale: f32, out: &mut [f32]) {
    for j in 0..16 {
        out[j] = scale * IQ4NL_VALUES[(codes[j] & 0xf) as usize] as f32;
        out[j + 16] = scale * IQ4NL_VALUES[(codes[j] >> 4) as usize] as f32;
    }
}

pub(crate) fn dequantize_iq4_nl(src: &[u8], dst: &mut [f32]) {
    for (blk, y) in src.chunks_exact(IQ4NL_BYTES).zip(dst.chunks_exact_mut(QK)) {
        expand(&blk[2..], read_f16(blk, 0), y);
    }
}

pub(crate) fn dequantize_iq4_xs(src: &[u8], dst: &mut [f32]) {
    for (blk, y) in src
        .chunks_exact(IQ4XS_BYTES)
        .zip(dst.chunks_exact_mut(QK_K))
    {
        let d = read_f16(blk, 0);
        for ib in 0..QK_K / QK {
            let dl = d * iq4_xs_scale(blk, ib) as f32;
            expand(
                &blk[8 + 16 * ib..8 + 16 * ib + 16],
                dl,
                &mut y[QK * ib..QK * ib + QK],
            );
        }
    }
}

pub(crate) fn dot_iq4_nl(w: &[u8], acts: &QuantizedActs) -> f32 {
    let mut sum = 0f32;
    for (b, blk) in w.chunks_exact(IQ4NL_BYTES).enumerate() {
        let d = acts.d[b] * read_f16(blk, 0);
        sum += d * table_sum(&blk[2..], &acts.qs[QK * b..QK * b + QK]) as f32;
    }
    sum
}

pub(crate) fn dot_iq4_xs(w: &[u8], acts: &QuantizedActs) -> f32 {
    let mut sum = 0f32;
    for (b, blk) in w.chunks_exact(IQ4XS_BYTES).enumerate() {
        let d4d8 = read_f16(blk, 0) * acts.d[b];
        let a = &acts.qs[QK_K * b..QK_K * b + QK_K];
        for ib in 0..QK_K / QK {
            let dl = d4d8 * iq4_xs_scale(blk, ib) as f32;
            let codes = &blk[8 + 16 * ib..8 + 16 * ib + 16];
            sum += dl * table_sum(codes, &a[QK * ib..QK * ib + QK]) as f32;
        }
    }
    sum
}

/// ggml's `best_index_int8` over the IQ4 table: the index of the table value nearest to `x`
/// (the upper one on ties).
fn nearest_index(x: f32) -> usize {
    let v = &IQ4NL_VALUES;
    if x <= v[0] as f32 {
        return 0;
    }
    if x >= v[15] as f32 {
        return 15;
    }
    let (mut lo, mut hi) = (0usize, 15usize);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if x < v[mid] as f32 {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    if x - (v[hi - 1] as f32) < v[hi] as f32 - x {
        hi - 1
    } else {
        hi
    }
}

/// ggml's `quantize_row_iq4_nl_impl` with `ntry` 7 (what `quantize_iq4_nl` / `_xs` run), for a
/// super-block of `x.len()` values in sub-blocks of 32: per sub-block the scale searched over
/// 15 candidate steps under weights `x²` (or the importance `qw · sqrt(σ² + x²)`); with
/// several sub-blocks, their scales as 6-bit multiples of one f16 `d` and the codes chosen
/// again. Returns (`d` as f16 bits, `scales_h`, `scales_l`, code bytes).
fn encode_iq4(x: &[f32], importance: Option<&[f32]>) -> (u16, u16, [u8; 4], Vec<u8>) {
    const NTRY: i32 = 7;
    let n = x.len();
    let nsub = n / QK;
    let v = |l: usize| IQ4NL_VALUES[l] as f32;
    let mut sigma2 = 0f32;
    for &xi in x {
        sigma2 += xi * xi;
    }
    sigma2 *= 2.0 / n as f32;
    let mut l = vec![0u8; n];
    let mut scales = vec![0f32; nsub];
    let (mut max_scale, mut amax_scale) = (0f32, 0f32);
    let mut weight = [0f32; QK];
    for ib in 0..nsub {
        let xb = &x[QK * ib..QK * ib + QK];
        match importance {
            Some(qw) => {
                for j in 0..QK {
                    weight[j] = qw[QK * ib + j] * (sigma2 + xb[j] * xb[j]).sqrt();
                }
            }
            None => {
                for j in 0..QK {
                    weight[j] = xb[j] * xb[j];
                }
            }
        }
        let (mut amax, mut max) = (0f32, 0f32);
        for &xj in xb {
            if xj.abs() > amax {
                amax = xj.abs();
                max = xj;
            }
        }
        if amax < super::weights::GROUP_MAX_EPS {
            scales[ib] = 0.0;
            continue;
        }
        let mut d = -max / v(0);
        let id = 1.0 / d;
        let (mut sumqx, mut sumq2) = (0f32, 0f32);
        for j in 0..QK {
            let li = nearest_index(id * xb[j]);
            l[QK * ib + j] = li as u8;
            let (q, w) = (v(li), weight[j]);
            sumqx += w * q * xb[j];
            sumq2 += w * q * q;
        }
        d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
        let mut best = d * sumqx;
        for itry in -NTRY..=NTRY {
            let id = (itry + IQ4NL_VALUES[0] as i32) as f32 / max;
            let (mut sumqx, mut sumq2) = (0f32, 0f32);
            for j in 0..QK {
                let q = v(nearest_index(id * xb[j]));
                let w = weight[j];
                sumqx += w * q * xb[j];
                sumq2 += w * q * q;
            }
            if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        scales[ib] = d;
        if d.abs() > amax_scale {
            amax_scale = d.abs();
            max_scale = d;
        }
    }
    let (mut scales_h, mut scales_l) = (0u16, [0u8; 4]);
    let dh;
    if nsub > 1 {
        let d = -max_scale / 32.0;
        dh = super::float::f32_to_f16(d);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for ib in 0..nsub {
            let li = super::weights::nearest_int(id * scales[ib]).clamp(-32, 31);
            let dl = d * li as f32;
            let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
            for j in 0..QK {
                l[QK * ib + j] = nearest_index(idl * x[QK * ib + j]) as u8;
            }
            let li = (li + 32) as u8;
            if ib % 2 == 0 {
                scales_l[ib / 2] = li & 0xf;
            } else {
                scales_l[ib / 2] |= (li & 0xf) << 4;
            }
            scales_h |= ((li >> 4) as u16) << (2 * (ib % 8));
        }
    } else {
        dh = super::float::f32_to_f16(scales[0]);
        let id = if scales[0] != 0.0 {
            1.0 / scales[0]
        } else {
            0.0
        };
        for j in 0..n {
            l[j] = nearest_index(id * x[j]) as u8;
        }
    }
    let mut codes = Vec::with_capacity(n / 2);
    for i in 0..n / QK {
        for j in 0..16 {
            codes.push(l[QK * i + j] | (l[QK * i + 16 + j] << 4));
        }
    }
    (dh, scales_h, scales_l, codes)
}

/// `x` (whole blocks) in IQ4_NL, optionally weighted by `importance` (one weight per value).
pub(crate) fn quantize_iq4_nl(x: &[f32], importance: Option<&[f32]>, out: &mut Vec<u8>) {
    for (b, xb) in x.chunks_exact(QK).enumerate() {
        let (dh, _, _, codes) = encode_iq4(xb, importance.map(|w| &w[QK * b..QK * b + QK]));
        out.extend_from_slice(&dh.to_le_bytes());
        out.extend_from_slice(&codes);
    }
}

/// `x` (whole super-blocks) in IQ4_XS, optionally weighted by `importance`.
pub(crate) fn quantize_iq4_xs(x: &[f32], importance: Option<&[f32]>, out: &mut Vec<u8>) {
    for (b, xb) in x.chunks_exact(QK_K).enumerate() {
        let (dh, scales_h, scales_l, codes) =
            encode_iq4(xb, importance.map(|w| &w[QK_K * b..QK_K * b + QK_K]));
        out.extend_from_slice(&dh.to_le_bytes());
        out.extend_from_slice(&scales_h.to_le_bytes());
        out.extend_from_slice(&scales_l);
        out.extend_from_slice(&codes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{dequantize, quantize_acts, vec_dot};
    use crate::testutil::Rng;
    use synaptix_core::DType;

    /// Random blocks: each dot equals the f64 dot of the dequantized weights with the
    /// dequantized activations, to float rounding.
    #[test]
    fn dots_agree_with_dequantized_values() {
        let mut rng = Rng::new(3);
        for (dtype, k) in [(DType::IQ4NL, 256), (DType::IQ4XS, 512)] {
            let mut w = rng.bytes(k / dtype.block_len() * dtype.block_bytes());
            let step = dtype.block_bytes();
            for blk in w.chunks_exact_mut(step) {
                let d = half::f16::from_f32(0.001 + 0.01 * rng.uniform());
                blk[..2].copy_from_slice(&d.to_le_bytes());
            }
            let x = rng.normal_vec(k, 1.0);
            let acts = quantize_acts(dtype, &x).unwrap();
            let got = vec_dot(dtype, &w, &acts).unwrap();
            let mut wv = vec![0f32; k];
            dequantize(dtype, &w, &mut wv).unwrap();
            let adt = crate::quant::activation_dtype(dtype).unwrap();
            let mut av = vec![0f32; k];
            dequantize(adt, &acts.to_ggml_bytes(), &mut av).unwrap();
            let want: f64 = wv.iter().zip(&av).map(|(a, b)| *a as f64 * *b as f64).sum();
            let scale: f64 = wv
                .iter()
                .zip(&av)
                .map(|(a, b)| (*a as f64 * *b as f64).abs())
                .sum();
            assert!(
                (got as f64 - want).abs() <= 1e-5 * scale,
                "{dtype}: {got} vs {want}"
            );
        }
    }

    #[test]
    fn scales_unpack_as_ggml_does() {
        let mut blk = vec![0u8; IQ4XS_BYTES];
        // scales_h: sub-block 0 high bits 0b10, sub-block 7 high bits 0b01.
        blk[2..4].copy_from_slice(&(0b10u16 | (0b01 << 14)).to_le_bytes());
        blk[4] = 0x5a; // sub-block 0 low 0xa, sub-block 1 low 0x5
        blk[7] = 0xf0; // sub-block 6 low 0, sub-block 7 low 0xf
        assert_eq!(iq4_xs_scale(&blk, 0), (0xa | (2 << 4)) - 32);
        assert_eq!(iq4_xs_scale(&blk, 1), 5 - 32);
        assert_eq!(iq4_xs_scale(&blk, 6), -32);
        assert_eq!(iq4_xs_scale(&blk, 7), (0xf | (1 << 4)) - 32);
    }
}
