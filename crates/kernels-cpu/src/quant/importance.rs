//! Weight quantization guided by an importance matrix (llama.cpp's `--imatrix`): per input
//! column, the mean square of the activations that multiply it. The quantizers are ggml's
//! `quantize_row_*_impl`, which llama-quantize runs when it has such weights, byte for byte:
//! each value's error counts `w_j · sqrt(σ² + x_j²)` (`σ²` a mean square of the block's or
//! row's values; for Q6_K the importance alone), the scales are searched under that weighting
//! (`make_qx_quants`; `make_qkx3_quants`, which with weights is the search of
//! `make_qkx2_quants` that the unweighted quantizers use; and `make_qp_quants` for the
//! k-quants' scales of scales), and the quants are chosen again from the stored scales.
//!
//! Types without such a quantizer (Q8_0, floats, synaptix's own) ignore the weights, as ggml
//! does.

use synaptix_core::{DType, Error, Result};

use super::float::f32_to_f16;
use super::weights::{
    best_scale_min, best_scale_symmetric, finish_q2_k, finish_q3_k, finish_q45_k, finish_q6_k,
    nearest_int, push_fifth_bits, push_half, push_nibbles, quantize_weights, GROUP_MAX_EPS, QK_K,
};

const QK: usize = 32;

/// ggml's `make_qp_quants`: non-negative `x` (scales or minimums) as `scale · L` with `L` in
/// `0..=nmax`, weighted, refined by moving single quants. `l_out` holds C's `uint8_t` quants.
fn positive_scale_weighted(x: &[f32], nmax: i32, weights: &[f32], l_out: &mut [u8]) -> f32 {
    let n = x.len();
    let max = x.iter().fold(0f32, |m, &v| if m > v { m } else { v });
    if max < GROUP_MAX_EPS {
        l_out[..n].fill(0);
        return 0.0;
    }
    let mut iscale = nmax as f32 / max;
    for i in 0..n {
        l_out[i] = nearest_int(iscale * x[i]) as u8;
    }
    let scale = 1.0 / iscale;
    let mut best = 0f32;
    for i in 0..n {
        let diff = x[i] - scale * l_out[i] as f32;
        best += weights[i] * diff * diff;
    }
    for is in -4..=4 {
        if is == 0 {
            continue;
        }
        let iscale_is = (0.1 * is as f32 + nmax as f32) / max;
        let scale_is = 1.0 / iscale_is;
        let mut mse = 0f32;
        for i in 0..n {
            let l = nearest_int(iscale_is * x[i]).min(nmax);
            let diff = x[i] - scale_is * l as f32;
            mse += weights[i] * diff * diff;
        }
        if mse < best {
            best = mse;
            iscale = iscale_is;
        }
    }
    let (mut sumlx, mut suml2) = (0f32, 0f32);
    for i in 0..n {
        let l = nearest_int(iscale * x[i]).min(nmax);
        l_out[i] = l as u8;
        let w = weights[i];
        sumlx += w * x[i] * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    for _ in 0..5 {
        let mut changed = false;
        for i in 0..n {
            let (w, li) = (weights[i], l_out[i] as f32);
            let mut slx = sumlx - w * x[i] * li;
            let mut sl2 = suml2 - w * li * li;
            if slx > 0.0 && sl2 > 0.0 {
                let new_l = nearest_int(x[i] * sl2 / slx).min(nmax);
                if new_l != l_out[i] as i32 {
                    slx += w * x[i] * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l_out[i] = new_l as u8;
                        sumlx = slx;
                        suml2 = sl2;
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// `w_j · sqrt(σ² + x_j²)` for a block of values and their importance.
fn error_weights(x: &[f32], importance: &[f32], sigma2: f32, out: &mut [f32]) {
    for ((o, &v), &q) in out.iter_mut().zip(x).zip(importance) {
        *o = q * (sigma2 + v * v).sqrt();
    }
}

fn sum_squares(x: &[f32]) -> f32 {
    let mut s = 0f32;
    for &v in x {
        s += v * v;
    }
    s
}

/// Q4_0 (`BITS` 4) / Q5_0 (5) of one row.
fn row_symmetric<const BITS: u32>(x: &[f32], importance: &[f32], out: &mut Vec<u8>) {
    let sigma2 = sum_squares(x) / x.len() as f32;
    let nmax = 1i32 << (BITS - 1);
    for (xb, qw) in x.chunks_exact(QK).zip(importance.chunks_exact(QK)) {
        let mut w = [0f32; QK];
        error_weights(xb, qw, sigma2, &mut w);
        let mut l = [0u8; QK];
        let d = best_scale_symmetric(xb, nmax, Some(&w), &mut l);
        push_half(out, d);
        if BITS == 5 {
            push_fifth_bits(out, &l);
        }
        push_nibbles(out, &l);
    }
}

/// Q4_1 (`BITS` 4) / Q5_1 (5) of one row.
fn row_affine<const BITS: u32>(x: &[f32], importance: &[f32], out: &mut Vec<u8>) {
    let sigma2 = sum_squares(x) / x.len() as f32;
    let nmax = (1i32 << BITS) - 1;
    for (xb, qw) in x.chunks_exact(QK).zip(importance.chunks_exact(QK)) {
        let mut w = [0f32; QK];
        error_weights(xb, qw, sigma2, &mut w);
        let mut l = [0u8; QK];
        let (d, min) = best_scale_min(xb, &w, nmax, -0.9, 0.05, 36, false, &mut l);
        push_half(out, d);
        push_half(out, -min);
        if BITS == 5 {
            push_fifth_bits(out, &l);
        }
        push_nibbles(out, &l);
    }
}

/// One Q2_K super-block.
fn super_block_q2_k(x: &[f32], importance: &[f32], out: &mut Vec<u8>) {
    let sigma2 = sum_squares(x) / QK_K as f32;
    let mut l = [0u8; QK_K];
    let (mut scales, mut mins, mut sw) = ([0f32; 16], [0f32; 16], [0f32; 16]);
    for j in 0..16 {
        let (xs, qw) = (&x[16 * j..16 * j + 16], &importance[16 * j..16 * j + 16]);
        let mut w = [0f32; 16];
        error_weights(xs, qw, sigma2, &mut w);
        for &v in &w {
            sw[j] += v;
        }
        // make_qkx3_quants with weights is make_qkx2_quants' search.
        let (scale, min) = best_scale_min(
            xs,
            &w,
            3,
            -0.9,
            0.05,
            36,
            false,
            &mut l[16 * j..16 * j + 16],
        );
        scales[j] = scale;
        mins[j] = min;
    }
    let (mut ls, mut lm) = ([0u8; 16], [0u8; 16]);
    let dm = positive_scale_weighted(&scales, 15, &sw, &mut ls);
    let mm = positive_scale_weighted(&mins, 15, &sw, &mut lm);
    let mut sc = [0u8; 16];
    for j in 0..16 {
        sc[j] = ls[j] | (lm[j] << 4);
    }
    finish_q2_k(x, l, &sc, f32_to_f16(dm), f32_to_f16(mm), out);
}

/// One Q3_K super-block.
fn super_block_q3_k(x: &[f32], importance: &[f32], out: &mut Vec<u8>) {
    let sigma2 = 2.0 * sum_squares(x) / QK_K as f32;
    let mut l = [0u8; QK_K];
    let (mut scales, mut sw) = ([0f32; 16], [0f32; 16]);
    for j in 0..16 {
        let (xs, qw) = (&x[16 * j..16 * j + 16], &importance[16 * j..16 * j + 16]);
        let mut w = [0f32; 16];
        error_weights(xs, qw, sigma2, &mut w);
        let mut sumw = 0f32;
        for &v in &w {
            sumw += v;
        }
        sw[j] = sumw;
        scales[j] = best_scale_symmetric(xs, 4, Some(&w), &mut l[16 * j..16 * j + 16]);
    }
    let mut ls = [0u8; 16];
    let d_block = best_scale_symmetric(&scales, 32, Some(&sw), &mut ls);
    let mut packed = [0u8; 12];
    for (j, &q) in ls.iter().enumerate() {
        let q = q as i32;
        if j < 8 {
            packed[j] = (q & 0xf) as u8;
        } else {
            packed[j - 8] |= ((q & 0xf) << 4) as u8;
        }
        packed[j % 4 + 8] |= ((q >> 4) << (2 * (j / 4))) as u8;
    }
    finish_q3_k(x, l, &packed, f32_to_f16(d_block), out);
}

/// One Q4_K (`BITS` 4) or Q5_K (5) super-block.
fn super_block_q45_k<const BITS: u32>(x: &[f32], importance: &[f32], out: &mut Vec<u8>) {
    let nmax = (1i32 << BITS) - 1;
    let sigma2 = 2.0 * sum_squares(x) / QK_K as f32;
    let mut l = [0u8; QK_K];
    let (mut scales, mut mins, mut sw) = ([0f32; 8], [0f32; 8], [0f32; 8]);
    for j in 0..8 {
        let (xs, qw) = (&x[32 * j..32 * j + 32], &importance[32 * j..32 * j + 32]);
        let mut w = [0f32; 32];
        error_weights(xs, qw, sigma2, &mut w);
        let mut sumw = 0f32;
        for &v in &w {
            sumw += v;
        }
        sw[j] = sumw;
        let (scale, min) = best_scale_min(
            xs,
            &w,
            nmax,
            -0.9,
            0.05,
            36,
            false,
            &mut l[32 * j..32 * j + 32],
        );
        scales[j] = scale;
        mins[j] = min;
    }
    let (mut ls, mut lm) = ([0u8; 8], [0u8; 8]);
    let d_block = positive_scale_weighted(&scales, 63, &sw, &mut ls);
    let m_block = positive_scale_weighted(&mins, 63, &sw, &mut lm);
    let mut packed = [0u8; 12];
    for j in 0..8 {
        // Q5_K caps at 63 where Q4_K does not; make_qp_quants keeps them there anyway.
        let (s, m) = if BITS == 5 {
            (ls[j].min(63), lm[j].min(63))
        } else {
            (ls[j], lm[j])
        };
        if j < 4 {
            packed[j] = s;
            packed[j + 4] = m;
        } else {
            packed[j + 4] = (s & 0xf) | ((m & 0xf) << 4);
            packed[j - 4] |= (s >> 4) << 6;
            packed[j] |= (m >> 4) << 6;
        }
    }
    finish_q45_k::<BITS>(x, l, &packed, f32_to_f16(d_block), f32_to_f16(m_block), out);
}

/// One Q6_K super-block: the importance alone weighs the sub-block scales' search.
fn super_block_q6_k(x: &[f32], importance: &[f32], out: &mut Vec<u8>) {
    let mut l = [0u8; QK_K];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut max_abs_scale) = (0f32, 0f32);
    for ib in 0..16 {
        let scale = best_scale_symmetric(
            &x[16 * ib..16 * ib + 16],
            32,
            Some(&importance[16 * ib..16 * ib + 16]),
            &mut l[16 * ib..16 * ib + 16],
        );
        scales[ib] = scale;
        if scale.abs() > max_abs_scale {
            max_abs_scale = scale.abs();
            max_scale = scale;
        }
    }
    if max_abs_scale < GROUP_MAX_EPS {
        out.extend_from_slice(&[0u8; 210]);
        return;
    }
    finish_q6_k(x, l, &scales, max_scale, out);
}

/// Whether `dtype` has a quantizer that uses importance weights.
pub fn uses_importance(dtype: DType) -> bool {
    use DType::*;
    matches!(
        dtype,
        Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q2K | Q3K | Q4K | Q5K | Q6K | IQ4NL | IQ4XS
    )
}

/// Rows of `row_len` values of `x` in `dtype`, appended to `out`, with `importance` (one
/// weight per column, `row_len` of them) guiding the types that use it (see
/// [`uses_importance`]); the others quantize as [`quantize_weights`].
pub fn quantize_weights_weighted(
    dtype: DType,
    x: &[f32],
    row_len: usize,
    importance: &[f32],
    out: &mut Vec<u8>,
) -> Result<()> {
    const OP: &str = "quantize_weights_weighted";
    if !uses_importance(dtype) {
        return quantize_weights(dtype, x, out);
    }
    if row_len == 0
        || importance.len() != row_len
        || !x.len().is_multiple_of(row_len)
        || !row_len.is_multiple_of(dtype.block_len())
    {
        return Err(Error::ShapeMismatch {
            op: OP,
            detail: format!(
                "{} values in rows of {row_len} with {} importance weights, for {dtype}",
                x.len(),
                importance.len()
            ),
        });
    }
    out.reserve(x.len() / dtype.block_len() * dtype.block_bytes());
    for row in x.chunks_exact(row_len) {
        match dtype {
            DType::Q4_0 => row_symmetric::<4>(row, importance, out),
            DType::Q5_0 => row_symmetric::<5>(row, importance, out),
            DType::Q4_1 => row_affine::<4>(row, importance, out),
            DType::Q5_1 => row_affine::<5>(row, importance, out),
            DType::IQ4NL => super::iquants::quantize_iq4_nl(row, Some(importance), out),
            DType::IQ4XS => super::iquants::quantize_iq4_xs(row, Some(importance), out),
            _ => {
                for (xs, qw) in row.chunks_exact(QK_K).zip(importance.chunks_exact(QK_K)) {
                    match dtype {
                        DType::Q2K => super_block_q2_k(xs, qw, out),
                        DType::Q3K => super_block_q3_k(xs, qw, out),
                        DType::Q4K => super_block_q45_k::<4>(xs, qw, out),
                        DType::Q5K => super_block_q45_k::<5>(xs, qw, out),
                        _ => super_block_q6_k(xs, qw, out),
                    }
                }
            }
        }
    }
    Ok(())
}
