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
//!
//! The k-quants (Q2_K .. Q6_K; 256-element super-blocks) search for scales the way ggml's
//! `quantize_row_q{2,3,4,5,6}_K_ref` do: per sub-block, a least-squares scale (and minimum) tried
//! over a range of candidate steps (`best_scale_min`, `best_scale_symmetric`), then the
//! sub-block scales quantized to 6 (Q4_K, Q5_K) or 8 bits (Q6_K) and the quants recomputed from
//! the stored scales. Every float operation is ggml's, in its order, without fused multiply-adds
//! (as its portable build computes them).

use synaptix_core::{DType, Error, Result};

use super::float::{f16_to_f32, f32_to_bf16, f32_to_f16};
use super::legacy::c_f32_to_i8;

/// Elements per block of the legacy types.
const QK: usize = 32;

/// The types [`quantize_weights`] produces.
pub const QUANTIZE_TARGETS: [DType; 26] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::Q8_0,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q2K,
    DType::Q3K,
    DType::Q4K,
    DType::Q5K,
    DType::Q6K,
    DType::MXFP8,
    DType::NVFP4,
    DType::SQ1,
    DType::SQ2,
    DType::SQ3,
    DType::SQ4,
    DType::SQ5,
    DType::SQ6,
    DType::SQ7,
    DType::SQ8,
    DType::SYMB4,
    DType::IQ4NL,
    DType::IQ4XS,
];

/// Part of a tensor (`x`, whole 64-value blocks) in NVFP4 with the tensor's scale (from
/// [`nvfp4_tensor_scale`] of the whole tensor's [`finite_amax`]), appended to `out`.
pub fn quantize_nvfp4_with_scale(x: &[f32], tensor_scale: f32, out: &mut Vec<u8>) -> Result<()> {
    if !x.len().is_multiple_of(DType::NVFP4.block_len()) {
        return Err(Error::ShapeMismatch {
            op: "quantize_nvfp4_with_scale",
            detail: format!("{} values are not whole nvfp4 blocks", x.len()),
        });
    }
    super::mx::quantize_nvfp4(x, tensor_scale, out);
    Ok(())
}

pub use super::mx::{finite_amax, nvfp4_tensor_scale};

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
        DType::Q2K => x.chunks_exact(QK_K).for_each(|b| super_block_q2_k(b, out)),
        DType::Q3K => x.chunks_exact(QK_K).for_each(|b| super_block_q3_k(b, out)),
        DType::Q4K => x
            .chunks_exact(QK_K)
            .for_each(|b| super_block_q45_k::<4>(b, out)),
        DType::Q5K => x
            .chunks_exact(QK_K)
            .for_each(|b| super_block_q45_k::<5>(b, out)),
        DType::Q6K => x.chunks_exact(QK_K).for_each(|b| super_block_q6_k(b, out)),
        DType::MXFP8 => super::mx::quantize_mxfp8(x, out),
        DType::SYMB4 => super::symb::quantize_symb4(x, out),
        DType::IQ4NL => super::iquants::quantize_iq4_nl(x, None, out),
        DType::IQ4XS => super::iquants::quantize_iq4_xs(x, None, out),
        d if d.sq_bits().is_some() => super::sq::quantize_sq(x, d.sq_bits().unwrap_or(8), out),
        // The tensor scale from `x` itself: pass the whole tensor, or use
        // [`quantize_nvfp4_with_scale`] for parts of one.
        DType::NVFP4 => super::mx::quantize_nvfp4(
            x,
            super::mx::nvfp4_tensor_scale(super::mx::finite_amax(x)),
            out,
        ),
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

pub(super) fn push_half(out: &mut Vec<u8>, v: f32) {
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
pub(super) fn push_nibbles(out: &mut Vec<u8>, q: &[u8; QK]) {
    out.extend((0..QK / 2).map(|j| (q[j] & 0x0f) | ((q[j + QK / 2] & 0x0f) << 4)));
}

/// The fifth bits: bit j of a little-endian u32 for element j.
pub(super) fn push_fifth_bits(out: &mut Vec<u8>, q: &[u8; QK]) {
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

/// Elements per k-quant super-block.
pub(super) const QK_K: usize = 256;
/// ggml's GROUP_MAX_EPS: a sub-block whose values are all below it is all zero.
pub(super) const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `nearest_int`: round half to even through the float adder (|v| < 2^22).
pub(super) fn nearest_int(v: f32) -> i32 {
    let bits = (v + 12_582_912.0).to_bits() as i32;
    (bits & 0x007f_ffff) - 0x0040_0000
}

/// ggml's `make_qkx2_quants`: quants in `0..=nmax` of `x` as `scale · L - min_out` minimising the
/// `weights`-weighted squared error (absolute error with `mad`), trying `nstep + 1` candidate
/// steps around `nmax / range`. Returns (scale, the minimum as a positive offset `-min`).
#[allow(clippy::too_many_arguments)]
pub(super) fn best_scale_min(
    x: &[f32],
    weights: &[f32],
    nmax: i32,
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    mad: bool,
    l_out: &mut [u8],
) -> (f32, f32) {
    let err = |diff: f32| if mad { diff.abs() } else { diff * diff };
    let n = x.len();
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l_out.fill(0);
        return (0.0, -min);
    }
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l_out[i] = l as u8;
        let diff = scale * l as f32 + min - x[i];
        best_error += weights[i] * err(diff);
    }
    let mut aux = [0u8; 32];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            aux[i] = l as u8;
            let (w, lf) = (weights[i], l as f32);
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0f32;
            for i in 0..n {
                let diff = this_scale * aux[i] as f32 + this_min - x[i];
                cur_error += weights[i] * err(diff);
            }
            if cur_error < best_error {
                l_out[..n].copy_from_slice(&aux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// ggml's `make_qx_quants` with `rmse_type` 1 (weights `x²`, or the given importance weights):
/// signed quants `-nmax..nmax-1`, stored offset by `nmax`, for the best of 19 candidate steps.
pub(super) fn best_scale_symmetric(
    x: &[f32],
    nmax: i32,
    weights: Option<&[f32]>,
    l_out: &mut [u8],
) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l_out.fill(0);
        return 0.0;
    }
    let quant = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let sums = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0f32, 0f32);
        for (i, &v) in x.iter().enumerate() {
            let l = quant(iscale, v) as f32;
            let w = match weights {
                Some(w) => w[i],
                None => v * v,
            };
            sumlx += w * v * l;
            suml2 += w * l * l;
        }
        (sumlx, suml2)
    };
    let mut iscale = -(nmax as f32) / max;
    for (o, &v) in l_out.iter_mut().zip(x) {
        *o = (quant(iscale, v) + nmax) as u8;
    }
    let (sumlx, suml2) = sums(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (o, &v) in l_out.iter_mut().zip(x) {
                *o = (quant(iscale, v) + nmax) as u8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// ggml's `make_q3_quants` with `do_rmse`: signed quants `-nmax..nmax-1` (stored offset by
/// `nmax`) from the `x²`-weighted least-squares step, then up to five rounds of moving single
/// quants while that improves the fit.
fn best_scale_q3(x: &[f32], nmax: i32, l_out: &mut [u8]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l_out.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let mut l = [0i32; 16];
    let (mut sumlx, mut suml2) = (0f32, 0f32);
    for (li, &v) in l.iter_mut().zip(x) {
        *li = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        let w = v * v;
        sumlx += w * v * *li as f32;
        suml2 += w * *li as f32 * *li as f32;
    }
    for _ in 0..5 {
        let mut changed = 0;
        for (i, &v) in x.iter().enumerate() {
            let w = v * v;
            let mut slx = sumlx - w * v * l[i] as f32;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * l[i] as f32 * l[i] as f32;
                let new_l = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != l[i] {
                    slx += w * v * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l[i] = new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        changed += 1;
                    }
                }
            }
        }
        if changed == 0 {
            break;
        }
    }
    for (o, &li) in l_out.iter_mut().zip(&l) {
        *o = (li + nmax) as u8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// Four 2-bit quants per byte: elements j, j + 32, j + 64, j + 96 of each 128.
pub(super) fn push_crumbs(out: &mut Vec<u8>, l: &[u8; QK_K]) {
    for h in 0..2 {
        for i in 0..32 {
            let b = &l[128 * h + i..];
            out.push(b[0] | (b[32] << 2) | (b[64] << 4) | (b[96] << 6));
        }
    }
}

/// Q2_K: 16 bytes of 4-bit scale | 4-bit min per 16 elements | qs[64] | d | dmin.
fn super_block_q2_k(x: &[f32], out: &mut Vec<u8>) {
    const Q4SCALE: f32 = 15.0;
    let mut l = [0u8; QK_K];
    let (mut scales, mut mins) = ([0f32; 16], [0f32; 16]);
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for j in 0..16 {
        let xs = &x[16 * j..16 * j + 16];
        let mut weights = [0f32; 16];
        for (w, &v) in weights.iter_mut().zip(xs) {
            *w = v.abs();
        }
        let (scale, min) = best_scale_min(
            xs,
            &weights,
            3,
            -0.5,
            0.1,
            15,
            true,
            &mut l[16 * j..16 * j + 16],
        );
        scales[j] = scale;
        mins[j] = min;
        if scale > max_scale {
            max_scale = scale;
        }
        if min > max_min {
            max_min = min;
        }
    }
    let mut sc = [0u8; 16];
    let d_bits = if max_scale > 0.0 {
        let iscale = Q4SCALE / max_scale;
        for j in 0..16 {
            sc[j] = nearest_int(iscale * scales[j]) as u8;
        }
        f32_to_f16(max_scale / Q4SCALE)
    } else {
        f32_to_f16(0.0)
    };
    let dmin_bits = if max_min > 0.0 {
        let iscale = Q4SCALE / max_min;
        for j in 0..16 {
            sc[j] |= (nearest_int(iscale * mins[j]) << 4) as u8;
        }
        f32_to_f16(max_min / Q4SCALE)
    } else {
        f32_to_f16(0.0)
    };
    finish_q2_k(x, l, &sc, d_bits, dmin_bits, out);
}

/// The rest of a Q2_K super-block from its 4-bit scales and minimums `sc`, `d` and `dmin`:
/// the quants again from the stored values (the search's `l` kept where a scale is 0), then
/// the bytes.
pub(super) fn finish_q2_k(
    x: &[f32],
    mut l: [u8; QK_K],
    sc: &[u8; 16],
    d_bits: u16,
    dmin_bits: u16,
    out: &mut Vec<u8>,
) {
    let (d_all, dmin_all) = (f16_to_f32(d_bits), f16_to_f32(dmin_bits));
    for j in 0..16 {
        let d = d_all * (sc[j] & 0xf) as f32;
        if d == 0.0 {
            continue;
        }
        let dm = dmin_all * (sc[j] >> 4) as f32;
        for i in 0..16 {
            l[16 * j + i] = nearest_int((x[16 * j + i] + dm) / d).clamp(0, 3) as u8;
        }
    }
    out.extend_from_slice(sc);
    push_crumbs(out, &l);
    out.extend_from_slice(&d_bits.to_le_bytes());
    out.extend_from_slice(&dmin_bits.to_le_bytes());
}

/// Q3_K: hmask[32] | qs[64] | 12 bytes of 6-bit scales | d.
fn super_block_q3_k(x: &[f32], out: &mut Vec<u8>) {
    let mut l = [0u8; QK_K];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut amax) = (0f32, 0f32);
    for j in 0..16 {
        scales[j] = best_scale_q3(&x[16 * j..16 * j + 16], 4, &mut l[16 * j..16 * j + 16]);
        if scales[j].abs() > amax {
            amax = scales[j].abs();
            max_scale = scales[j];
        }
    }
    let mut packed = [0u8; 12];
    let d_bits = if max_scale != 0.0 {
        let iscale = -32.0 / max_scale;
        for j in 0..16 {
            // C keeps the int in an int8_t (mod 256) before clamping it.
            let q = (nearest_int(iscale * scales[j]) as i8).clamp(-32, 31) as i32 + 32;
            if j < 8 {
                packed[j] = (q & 0xf) as u8;
            } else {
                packed[j - 8] |= ((q & 0xf) << 4) as u8;
            }
            packed[j % 4 + 8] |= ((q >> 4) << (2 * (j / 4))) as u8;
        }
        f32_to_f16(1.0 / iscale)
    } else {
        f32_to_f16(0.0)
    };
    finish_q3_k(x, l, &packed, d_bits, out);
}

/// The rest of a Q3_K super-block from its packed 6-bit scales, `d` and the search's quants
/// `l` (kept where a scale is 0).
pub(super) fn finish_q3_k(
    x: &[f32],
    mut l: [u8; QK_K],
    packed: &[u8; 12],
    d_bits: u16,
    out: &mut Vec<u8>,
) {
    let d_all = f16_to_f32(d_bits);
    for j in 0..16 {
        let low = if j < 8 {
            packed[j] & 0xf
        } else {
            packed[j - 8] >> 4
        };
        let sc = (low | (((packed[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) as i32 - 32;
        let d = d_all * sc as f32;
        if d == 0.0 {
            continue;
        }
        for i in 0..16 {
            l[16 * j + i] = (nearest_int(x[16 * j + i] / d).clamp(-4, 3) + 4) as u8;
        }
    }
    // The high bit of element j goes to bit j / 32 of hmask[j % 32].
    let mut hmask = [0u8; 32];
    for (j, lj) in l.iter_mut().enumerate() {
        if *lj > 3 {
            hmask[j % 32] |= 1 << (j / 32);
            *lj -= 4;
        }
    }
    out.extend_from_slice(&hmask);
    push_crumbs(out, &l);
    out.extend_from_slice(packed);
    out.extend_from_slice(&d_bits.to_le_bytes());
}

/// Q4_K (`BITS` 4) or Q5_K (5): d | dmin | 12 bytes of 6-bit scales and mins | (Q5_K: qh[32]) |
/// qs[128].
fn super_block_q45_k<const BITS: u32>(x: &[f32], out: &mut Vec<u8>) {
    let nmax = (1i32 << BITS) - 1;
    let (rmin, nstep) = if BITS == 4 { (-1.0, 20) } else { (-0.5, 15) };
    let mut l = [0u8; QK_K];
    let (mut scales, mut mins) = ([0f32; 8], [0f32; 8]);
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        let mut weights = [0f32; 32];
        for (w, &v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        let (scale, min) = best_scale_min(
            xs,
            &weights,
            nmax,
            rmin,
            0.1,
            nstep,
            false,
            &mut l[32 * j..32 * j + 32],
        );
        scales[j] = scale;
        mins[j] = min;
        if scale > max_scale {
            max_scale = scale;
        }
        if min > max_min {
            max_min = min;
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut packed = [0u8; 12];
    for j in 0..8 {
        // C stores the int in a uint8_t (mod 256), then caps it at 63.
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0xf) | ((lm & 0xf) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    let d_bits = f32_to_f16(max_scale / 63.0);
    let dmin_bits = f32_to_f16(max_min / 63.0);
    finish_q45_k::<BITS>(x, l, &packed, d_bits, dmin_bits, out);
}

/// The rest of a Q4_K / Q5_K super-block from its packed scales and mins and `d`, `dmin`: the
/// quants again from the stored values (sub-blocks whose scale is 0 keep the search's `l`),
/// then the bytes.
pub(super) fn finish_q45_k<const BITS: u32>(
    x: &[f32],
    mut l: [u8; QK_K],
    packed: &[u8; 12],
    d_bits: u16,
    dmin_bits: u16,
    out: &mut Vec<u8>,
) {
    let nmax = (1i32 << BITS) - 1;
    let (d_all, dmin_all) = (f16_to_f32(d_bits), f16_to_f32(dmin_bits));
    for j in 0..8 {
        let (sc, m) = if j < 4 {
            (packed[j] & 63, packed[j + 4] & 63)
        } else {
            (
                (packed[j + 4] & 0xf) | ((packed[j - 4] >> 6) << 4),
                (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4),
            )
        };
        let d = d_all * sc as f32;
        if d == 0.0 {
            continue;
        }
        let dm = dmin_all * m as f32;
        for i in 0..32 {
            l[32 * j + i] = nearest_int((x[32 * j + i] + dm) / d).clamp(0, nmax) as u8;
        }
    }
    out.extend_from_slice(&d_bits.to_le_bytes());
    out.extend_from_slice(&dmin_bits.to_le_bytes());
    out.extend_from_slice(packed);
    if BITS == 5 {
        // Bit 4 of element 64c + j goes to bit 2c of qh[j], of element 64c + 32 + j to 2c + 1.
        let mut qh = [0u8; 32];
        for c in 0..4 {
            for j in 0..32 {
                qh[j] |= ((l[64 * c + j] >> 4) & 1) << (2 * c);
                qh[j] |= ((l[64 * c + 32 + j] >> 4) & 1) << (2 * c + 1);
            }
        }
        out.extend_from_slice(&qh);
    }
    for c in 0..4 {
        for j in 0..32 {
            out.push((l[64 * c + j] & 0xf) | ((l[64 * c + 32 + j] & 0xf) << 4));
        }
    }
}

/// Q6_K: ql[128] | qh[64] | 16 int8 scales | d.
fn super_block_q6_k(x: &[f32], out: &mut Vec<u8>) {
    let mut l = [0u8; QK_K];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut max_abs_scale) = (0f32, 0f32);
    for ib in 0..16 {
        let scale = best_scale_symmetric(
            &x[16 * ib..16 * ib + 16],
            32,
            None,
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

/// The rest of a Q6_K super-block from its 16 sub-block scales (the one of largest magnitude
/// `max_scale`, not 0) and the search's quants `l` (kept where a scale rounds to 0).
pub(super) fn finish_q6_k(
    x: &[f32],
    mut l: [u8; QK_K],
    scales: &[f32; 16],
    max_scale: f32,
    out: &mut Vec<u8>,
) {
    let iscale = -128.0 / max_scale;
    let d_bits = f32_to_f16(1.0 / iscale);
    let d_all = f16_to_f32(d_bits);
    let mut sc = [0i8; 16];
    for ib in 0..16 {
        sc[ib] = nearest_int(iscale * scales[ib]).min(127) as i8;
    }
    for j in 0..16 {
        let d = d_all * sc[j] as f32;
        if d == 0.0 {
            continue;
        }
        for i in 0..16 {
            l[16 * j + i] = (nearest_int(x[16 * j + i] / d).clamp(-32, 31) + 32) as u8;
        }
    }
    let (mut ql, mut qh) = ([0u8; 128], [0u8; 64]);
    for h in 0..2 {
        let (lq, hq, lb) = (&mut ql[64 * h..], &mut qh[32 * h..], &l[128 * h..]);
        for i in 0..32 {
            lq[i] = (lb[i] & 0xf) | ((lb[i + 64] & 0xf) << 4);
            lq[i + 32] = (lb[i + 32] & 0xf) | ((lb[i + 96] & 0xf) << 4);
            hq[i] = (lb[i] >> 4)
                | ((lb[i + 32] >> 4) << 2)
                | ((lb[i + 64] >> 4) << 4)
                | ((lb[i + 96] >> 4) << 6);
        }
    }
    out.extend_from_slice(&ql);
    out.extend_from_slice(&qh);
    out.extend(sc.iter().map(|&v| v as u8));
    out.extend_from_slice(&d_bits.to_le_bytes());
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
        let tensor_amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
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
                // The k-quants' sub-block scales are 6- or 8-bit fractions of their super-block's.
                let sb = &x[b / 8 * 256..(b / 8 * 256 + 256).min(x.len())];
                let (sb_min, sb_max) = min_max(sb);
                let sb_range = sb_max - sb_min.min(0.0);
                let step = match dtype {
                    DType::Q8_0 => amax / 127.0,
                    DType::Q4_0 => amax / 8.0,
                    DType::Q5_0 => amax / 16.0,
                    DType::Q4_1 => (max - min) / 15.0,
                    DType::Q5_1 => (max - min) / 31.0,
                    DType::Q2K => sb_range / 3.0,
                    DType::Q3K => sb_range / 7.0,
                    DType::Q4K => sb_range / 15.0,
                    DType::Q5K => sb_range / 31.0,
                    DType::Q6K => sb_range / 32.0,
                    _ => amax / 256.0,
                };
                // Q4_0 / Q5_0 reach -8d..7d (-16d..15d): the end opposite the extreme value is
                // clamped a whole step short; the k-quants' search trades steps for fit.
                let steps = match dtype {
                    DType::Q4_0 | DType::Q5_0 | DType::Q4K | DType::Q5K | DType::Q6K => 1.0,
                    // 2 and 3 bits, and the scales' own 4- and 6-bit steps.
                    DType::Q2K | DType::Q3K => 1.5,
                    _ => 0.5,
                };
                for (i, (&a, &g)) in block.iter().zip(got).enumerate() {
                    // Halves round d and m; allow for that beyond the rounding. MXFP8's step is
                    // relative (three mantissa bits), absolute only in E4M3's subnormals.
                    let tol = if dtype == DType::MXFP8 {
                        a.abs() / 16.0 + amax / 65536.0
                    } else if let Some(bits) = dtype.sq_bits() {
                        // A whole code step of the sub-block's range, and the byte scales' and
                        // offsets' rounding (half of the super-block's largest over 255).
                        (max - min.min(0.0)) / ((1u32 << bits) - 1) as f32 + sb_range / 255.0 + 1e-6
                    } else if matches!(dtype, DType::IQ4NL | DType::IQ4XS) {
                        // Half the table's widest gap (24 of 127) at a scale of about amax/127,
                        // and IQ4_XS's 6-bit sub-block scales.
                        sb_range / 6.0 + 1e-6
                    } else if dtype == DType::SYMB4 {
                        // Half a step of the 128-value group's scale (its amax / 7).
                        let group = &x[b / 4 * 128..(b / 4 * 128 + 128).min(x.len())];
                        group.iter().fold(0f32, |m, v| m.max(v.abs())) / 14.0 + 1e-6
                    } else if dtype == DType::NVFP4 {
                        // Half of E2M1's widest step (2 between 4 and 6) at a scale of about
                        // amax / 6, the E4M3 scale's own rounding, its subnormals' granularity.
                        amax / 6.0 * 1.07 + tensor_amax * 1e-5
                    } else {
                        step * steps + amax * 2e-3 + 1e-6
                    };
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
        assert!(quantize_weights(DType::Q8K, &[0.0; 256], &mut out).is_err());
        assert!(quantize_weights(DType::Q4K, &[0.0; 255], &mut out).is_err());
        assert!(out.is_empty());
    }
}
