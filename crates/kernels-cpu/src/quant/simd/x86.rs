//! x86_64 kernels: AVX2 (+FMA, F16C) for every supported weight type and the activation
//! quantizers, plus AVX-512 (VNNI `vpdpbusd` on 256-bit vectors, BW + VL masked byte
//! broadcasts) for Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0.
//!
//! Shared bodies are `#[inline(always)]` helpers instantiated inside `#[target_feature]` entry
//! points, so each entry is compiled for exactly the features its path guarantees (no closures
//! in the bodies: they would not inherit the features). A `const VNNI: bool` parameter selects
//! the AVX-512 forms (`vpdpbusd` for `maddubs + madd` in the 8-bit products).
//!
//! Each quantized weight type has a single-dot kernel and a block kernel (several weight rows ×
//! up to 16 activation rows, each weight block unpacked once for all activation rows); the
//! single dot is the block kernel's one-row, one-activation instance.
//!
//! Every kernel performs the float operations of ggml's portable code (see the scalar kernels)
//! in the same order, with separate multiplies and adds (never FMA); only exact integer work is
//! reorganised:
//! - F32 / F16 / BF16: the f64 running sum of one row is serial, so the block kernel runs eight
//!   weight rows at once, one row per f64 lane (single dots use the scalar kernel);
//! - 32-element block types: integer sums of eight blocks at a time, the per-block float terms
//!   computed lane-wise, then added to the running f32 sum one by one in block order;
//!   with AVX-512 VNNI and several activation rows, the sums of one block with up to 16 rows
//!   at once (one row per 32-bit lane of a 512-bit vector, activation quants regrouped per
//!   tile), so each row's running sum is one lane and the block terms are added in order;
//! - k-quants: the eight lane sums of ggml's `aux32` (lane = element index mod 8) from `maddubs`
//!   on weights and activations both in pair order (elements `i`, `i + 8` of each 16 adjacent),
//!   then `sums[l] += d * lane[l]` as one 8-lane vector operation.

use core::arch::x86_64::*;

use synaptix_core::DType;

use super::FloatDotFn;
use crate::cpu::Path;
use crate::quant::float::{self, accumulate_tail, read_f16, reduce32, FLOAT_LANES};
use crate::quant::kquants::{self, QK_K};
use crate::quant::legacy::{self, Kind, QK};
use crate::quant::{BlockFn, DotFn, QuantizedActs};

/// Activation rows one pass of a block kernel keeps running state for.
const MAX_ACTS: usize = 16;

/// The SIMD single-dot and block kernels for `dtype` on `path` (either may be absent: the
/// scalar dot and the generic block loop serve then).
pub(crate) fn kernels(dtype: DType, path: Path) -> (Option<DotFn>, Option<BlockFn>) {
    let (dot, block): (DotFn, BlockFn) = match (path, dtype) {
        (Path::Scalar, _) => return (None, None),
        // Float single dots are a serial f64 chain: the scalar kernel. Their block kernel runs
        // eight rows side by side.
        (_, DType::F32) => return (None, Some(f32_block_avx2)),
        (_, DType::F16) => return (None, Some(f16_block_avx2)),
        (_, DType::BF16) => return (None, Some(bf16_block_avx2)),
        (Path::Avx512, DType::Q4_0) => (q4_0_avx512, q4_0_block_avx512),
        (Path::Avx512, DType::Q5_0) => (q5_0_avx512, q5_0_block_avx512),
        (Path::Avx512, DType::Q8_0) => (q8_0_avx512, q8_0_block_avx512),
        (Path::Avx512, DType::Q4_1) => (q4_1_avx512, q4_1_block_avx512),
        (Path::Avx512, DType::Q5_1) => (q5_1_avx512, q5_1_block_avx512),
        // k-quants: the AVX2 code, compiled with AVX-512's extra registers (`vpdpbusd` would
        // sum four adjacent products, mixing the lanes ggml keeps apart).
        (Path::Avx512, DType::Q2K) => (q2_k_avx512, q2_k_block_avx512),
        (Path::Avx512, DType::Q3K) => (q3_k_avx512, q3_k_block_avx512),
        (Path::Avx512, DType::Q4K) => (q4_k_avx512, q4_k_block_avx512),
        (Path::Avx512, DType::Q5K) => (q5_k_avx512, q5_k_block_avx512),
        (Path::Avx512, DType::Q6K) => (q6_k_avx512, q6_k_block_avx512),
        (_, DType::Q4_0) => (q4_0_avx2, q4_0_block_avx2),
        (_, DType::Q5_0) => (q5_0_avx2, q5_0_block_avx2),
        (_, DType::Q8_0) => (q8_0_avx2, q8_0_block_avx2),
        (_, DType::Q4_1) => (q4_1_avx2, q4_1_block_avx2),
        (_, DType::Q5_1) => (q5_1_avx2, q5_1_block_avx2),
        (_, DType::Q2K) => (q2_k_avx2, q2_k_block_avx2),
        (_, DType::Q3K) => (q3_k_avx2, q3_k_block_avx2),
        (_, DType::Q4K) => (q4_k_avx2, q4_k_block_avx2),
        (_, DType::Q5K) => (q5_k_avx2, q5_k_block_avx2),
        (_, DType::Q6K) => (q6_k_avx2, q6_k_block_avx2),
        (_, DType::MXFP8) => (mxfp8_avx2, mxfp8_block_avx2),
        (_, DType::NVFP4) => (nvfp4_avx2, nvfp4_block_avx2),
        (_, DType::SYMB4) => (symb4_avx2, symb4_block_avx2),
        (_, DType::IQ4NL) => (iq4_nl_avx2, iq4_nl_block_avx2),
        (_, DType::IQ4XS) => (iq4_xs_avx2, iq4_xs_block_avx2),
        (_, DType::SQ1) => (sq1_avx2, sq1_block_avx2),
        (_, DType::SQ2) => (sq2_avx2, sq2_block_avx2),
        (_, DType::SQ3) => (sq3_avx2, sq3_block_avx2),
        (_, DType::SQ4) => (sq4_avx2, sq4_block_avx2),
        (_, DType::SQ5) => (sq5_avx2, sq5_block_avx2),
        (_, DType::SQ6) => (sq6_avx2, sq6_block_avx2),
        (_, DType::SQ7) => (sq7_avx2, sq7_block_avx2),
        (_, DType::SQ8) => (sq8_avx2, sq8_block_avx2),
        _ => return (None, None),
    };
    (Some(dot), Some(block))
}

pub(crate) fn f32_dot(path: Path) -> Option<FloatDotFn> {
    match path {
        Path::Scalar => None,
        Path::Avx2 | Path::Avx512 => Some(f32_avx2),
    }
}

// ---------------------------------------------------------------------------------------------
// Activation quantization.

/// AVX2 activation quantizers. Same IEEE operations as the portable ones (`x * id` in f32,
/// rounding half away from zero for Q8_0 / Q8_1 and half to even for Q8_K, half rounding to
/// nearest even), so identical results.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn fill_acts_avx2(x: &[f32], a: &mut QuantizedActs) {
    match a.dtype {
        DType::F16 => round_f16_avx2(x, a),
        DType::Q8_0 => quantize_q8_avx2::<false>(x, a),
        DType::Q8_1 => quantize_q8_avx2::<true>(x, a),
        DType::Q8K => quantize_q8_k_avx2(x, a),
        _ => crate::quant::fill_acts_portable(x, a),
    }
}

#[inline(always)]
unsafe fn round_f16_avx2(x: &[f32], a: &mut QuantizedActs) {
    let n = x.len().min(a.vals.len());
    let (xp, vp) = (x.as_ptr(), a.vals.as_mut_ptr());
    let mut i = 0;
    while i + 8 <= n {
        let v = _mm256_loadu_ps(xp.add(i));
        // ggml turns NaN into 0x7e00 (with the sign); the instruction keeps payload bits.
        if _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_UNORD_Q>(v, v)) != 0 {
            break;
        }
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
        _mm256_storeu_ps(vp.add(i), _mm256_cvtph_ps(h));
        i += 8;
    }
    for (v, &xv) in a.vals[i..n].iter_mut().zip(&x[i..n]) {
        *v = float::f16_to_f32(float::f32_to_f16(xv));
    }
}

/// Largest lane of `v`.
#[inline(always)]
unsafe fn hmax_ps(v: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_movehdup_ps(m));
    _mm_cvtss_f32(m)
}

#[inline(always)]
unsafe fn abs_ps(v: __m256) -> __m256 {
    _mm256_andnot_ps(_mm256_set1_ps(-0.0), v)
}

/// f32 through half and back (round to nearest even; the values here are never NaN).
#[inline(always)]
unsafe fn via_f16(v: f32) -> f32 {
    let h = _mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(v));
    _mm_cvtss_f32(_mm_cvtph_ps(h))
}

/// `x[0..8] * scale` rounded to integers as i32: half to even (`EVEN`) or half away from zero
/// (C's `roundf`: truncate, then step away from zero when the exact remainder is at least 1/2).
#[inline(always)]
unsafe fn round8<const EVEN: bool>(x: *const f32, scale: __m256) -> __m256i {
    const NO_EXC: i32 = _MM_FROUND_NO_EXC;
    let v = _mm256_mul_ps(_mm256_loadu_ps(x), scale);
    let r = if EVEN {
        _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | NO_EXC }>(v)
    } else {
        let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | NO_EXC }>(v);
        let frac = abs_ps(_mm256_sub_ps(v, t));
        let away = _mm256_cmp_ps::<_CMP_GE_OQ>(frac, _mm256_set1_ps(0.5));
        let sign = _mm256_and_ps(v, _mm256_set1_ps(-0.0));
        let step = _mm256_and_ps(away, _mm256_or_ps(_mm256_set1_ps(1.0), sign));
        _mm256_add_ps(t, step)
    };
    _mm256_cvtps_epi32(r)
}

/// `x[0..32] * scale` rounded (see [`round8`]) as 32 saturated i8 stored at `q`; returns 8 i32
/// lanes summing to the quants' sum.
#[inline(always)]
unsafe fn round_store_32<const EVEN: bool>(x: *const f32, scale: __m256, q: *mut i8) -> __m256i {
    let (i0, i1) = (round8::<EVEN>(x, scale), round8::<EVEN>(x.add(8), scale));
    let (i2, i3) = (
        round8::<EVEN>(x.add(16), scale),
        round8::<EVEN>(x.add(24), scale),
    );
    // packs work per 128-bit lane: the result holds 4-element groups in order 0,2,4,6,1,3,5,7.
    let p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(q as *mut __m256i, p);
    _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3))
}

/// Whether any of the `n` (a multiple of 8) values at `x` is infinite or NaN.
#[inline(always)]
unsafe fn any_non_finite(x: *const f32, n: usize) -> bool {
    let max = _mm256_set1_ps(f32::MAX);
    let mut bad = _mm256_setzero_ps();
    for j in 0..n / 8 {
        let v = abs_ps(_mm256_loadu_ps(x.add(8 * j)));
        // Not (|v| <= MAX): true for infinities and NaN.
        bad = _mm256_or_ps(bad, _mm256_cmp_ps::<_CMP_NLE_UQ>(v, max));
    }
    _mm256_movemask_ps(bad) != 0
}

/// Q8_0 (and Q8_1 when `S`) blocks of 32; see `legacy::quantize_q8_block`. Blocks with
/// non-finite values or an infinite `1 / d` (tiny values), where C's conversions decide the
/// quants, take the scalar code.
#[inline(always)]
unsafe fn quantize_q8_avx2<const S: bool>(x: &[f32], a: &mut QuantizedActs) {
    let nb = (x.len() / QK).min(a.d.len());
    for b in 0..nb {
        let xp = x.as_ptr().add(b * QK);
        let mut m = abs_ps(_mm256_loadu_ps(xp));
        for j in 1..4 {
            m = _mm256_max_ps(m, abs_ps(_mm256_loadu_ps(xp.add(8 * j))));
        }
        let amax = hmax_ps(m);
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        if !id.is_finite() || any_non_finite(xp, QK) {
            legacy::quantize_q8_block(&x[b * QK..(b + 1) * QK], a, b);
            continue;
        }
        let q = a.qs.as_mut_ptr().add(b * QK);
        // Quants are within ±127, so the i32 lane sums equal the i8 sum.
        let sum = hsum_i32(round_store_32::<false>(xp, _mm256_set1_ps(id), q));
        a.d[b] = via_f16(d);
        a.isum[b] = sum;
        if S {
            a.s[b] = via_f16(sum as f32 * d);
        }
    }
}

/// In-lane byte shuffle taking 16 bytes to pair order: `i` to `2i`, `i + 8` to `2i + 1`.
const PAIR_ORDER: [u8; 32] = {
    let mut m = [0u8; 32];
    let mut i = 0;
    while i < 16 {
        let src = (i / 2 + 8 * (i % 2)) as u8;
        m[i] = src;
        m[16 + i] = src;
        i += 1;
    }
    m
};

#[inline(always)]
unsafe fn pair_order(v: __m256i) -> __m256i {
    _mm256_shuffle_epi8(v, _mm256_loadu_si256(PAIR_ORDER.as_ptr() as *const __m256i))
}

/// Q8_K blocks of 256; see `kquants::quantize_q8_k`.
#[inline(always)]
unsafe fn quantize_q8_k_avx2(x: &[f32], a: &mut QuantizedActs) {
    let nb = (x.len() / QK_K).min(a.d.len());
    for b in 0..nb {
        let xp = x.as_ptr().add(b * QK_K);
        let mut m = _mm256_setzero_ps();
        for j in 0..QK_K / 8 {
            m = _mm256_max_ps(m, abs_ps(_mm256_loadu_ps(xp.add(8 * j))));
        }
        let amax = hmax_ps(m);
        let q = a.qs.as_mut_ptr().add(b * QK_K);
        if amax == 0.0 {
            core::ptr::write_bytes(q, 0, QK_K);
            a.d[b] = 0.0;
            a.bsums[b * 16..(b + 1) * 16].fill(0);
        } else {
            let xb = &x[b * QK_K..(b + 1) * QK_K];
            let max = xb.iter().copied().find(|v| v.abs() == amax).unwrap_or(amax);
            let iscale = -127.0 / max;
            if !iscale.is_finite() || any_non_finite(xp, QK_K) {
                // C's conversions decide the quants: the scalar code.
                kquants::quantize_q8_k_block(xb, a, b);
                fill_pair_order_block(a, b);
                continue;
            }
            let sv = _mm256_set1_ps(iscale);
            for c in 0..QK_K / 32 {
                round_store_32::<true>(xp.add(32 * c), sv, q.add(32 * c));
            }
            // Sums of 16: widen to i16 and add adjacent lanes pairwise until 16 remain.
            let ones = _mm256_set1_epi8(1);
            for c in 0..QK_K / 64 {
                let v0 = _mm256_loadu_si256(q.add(64 * c) as *const __m256i);
                let v1 = _mm256_loadu_si256(q.add(64 * c + 32) as *const __m256i);
                // i16 sums of byte pairs (|q| <= 127), then of 8 pairs per 16 bytes.
                let s0 = _mm256_maddubs_epi16(ones, v0);
                let s1 = _mm256_maddubs_epi16(ones, v1);
                let t = _mm256_hadd_epi16(s0, s1);
                let t = _mm256_hadd_epi16(t, t);
                let t = _mm256_hadd_epi16(t, t);
                // Lanes 0, 1 of each 128-bit half: sums of 16 for (v0 lo, v1 lo), (v0 hi, v1 hi).
                let lo = _mm256_extract_epi32::<0>(t) as u32;
                let hi = _mm256_extract_epi32::<4>(t) as u32;
                let bs = &mut a.bsums[b * 16 + 4 * c..b * 16 + 4 * c + 4];
                bs[0] = lo as u16 as i16;
                bs[1] = hi as u16 as i16;
                bs[2] = (lo >> 16) as u16 as i16;
                bs[3] = (hi >> 16) as u16 as i16;
            }
            a.d[b] = 1.0 / iscale;
        }
        fill_pair_order_block(a, b);
    }
}

/// `a.pq` / `a.pq_abs` of super-block `b` from `a.qs`.
#[inline(always)]
unsafe fn fill_pair_order_block(a: &mut QuantizedActs, b: usize) {
    for c in 0..QK_K / 32 {
        let at = b * QK_K + 32 * c;
        let p = pair_order(_mm256_loadu_si256(a.qs.as_ptr().add(at) as *const __m256i));
        _mm256_storeu_si256(a.pq.as_mut_ptr().add(at) as *mut __m256i, p);
        _mm256_storeu_si256(
            a.pq_abs.as_mut_ptr().add(at) as *mut __m256i,
            _mm256_abs_epi8(p),
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Float weights.

/// Weight element encodings of the float dots.
const W_F32: u8 = 0;
const W_F16: u8 = 1;
const W_BF16: u8 = 2;

/// Scalar read of weight element `i` (tails), matching the vector widening exactly.
#[inline(always)]
fn weight_at<const W: u8>(w: &[u8], i: usize) -> f32 {
    match W {
        W_F32 => float::read_f32(w, i),
        W_F16 => read_f16(w, 2 * i),
        _ => float::bf16_to_f32(float::read_u16(w, 2 * i)),
    }
}

/// 8 weights starting at element `i`, widened to f32.
#[inline(always)]
unsafe fn load8<const W: u8>(w: *const u8, i: usize) -> __m256 {
    match W {
        W_F32 => _mm256_loadu_ps(w.add(4 * i) as *const f32),
        W_F16 => _mm256_cvtph_ps(_mm_loadu_si128(w.add(2 * i) as *const __m128i)),
        _ => _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(
            _mm_loadu_si128(w.add(2 * i) as *const __m128i),
        ))),
    }
}

/// ggml's float dot (f32 products, serial f64 sum) of eight weight rows `rows[r]` with `a` at
/// once, row `r` in f64 lane `r % 4` of accumulator `r / 4`: each accumulator lane sees exactly
/// the additions of the scalar kernel, in order. (Sixteen rows in four accumulators measured
/// slower on Zen 4.)
#[inline(always)]
unsafe fn float_rows8<const W: u8>(rows: &[&[u8]; 8], a: &[f32]) -> [f32; 8] {
    let n = a.len();
    let ap = a.as_ptr();
    let mut lo = _mm256_setzero_pd();
    let mut hi = _mm256_setzero_pd();
    let mut i = 0;
    while i + 8 <= n {
        let x = _mm256_loadu_ps(ap.add(i));
        let mut p = [_mm256_setzero_ps(); 8];
        for (pr, row) in p.iter_mut().zip(rows) {
            *pr = _mm256_mul_ps(load8::<W>(row.as_ptr(), i), x);
        }
        // Transpose within 128-bit halves: s[j] holds column j of rows 0..4 in its low half and
        // column j + 4 in its high half; s[4 + j] the same for rows 4..8.
        let mut s = [_mm256_setzero_ps(); 8];
        for h in 0..2 {
            let t0 = _mm256_unpacklo_ps(p[4 * h], p[4 * h + 1]);
            let t1 = _mm256_unpackhi_ps(p[4 * h], p[4 * h + 1]);
            let t2 = _mm256_unpacklo_ps(p[4 * h + 2], p[4 * h + 3]);
            let t3 = _mm256_unpackhi_ps(p[4 * h + 2], p[4 * h + 3]);
            s[4 * h] = _mm256_shuffle_ps::<0x44>(t0, t2);
            s[4 * h + 1] = _mm256_shuffle_ps::<0xee>(t0, t2);
            s[4 * h + 2] = _mm256_shuffle_ps::<0x44>(t1, t3);
            s[4 * h + 3] = _mm256_shuffle_ps::<0xee>(t1, t3);
        }
        // Columns in order: 0..4 from the low halves, 4..8 from the high halves.
        for j in 0..4 {
            lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(s[j])));
            hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_castps256_ps128(s[4 + j])));
        }
        for j in 0..4 {
            lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(s[j])));
            hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(s[4 + j])));
        }
        i += 8;
    }
    let mut sums = [0f64; 8];
    _mm256_storeu_pd(sums.as_mut_ptr(), lo);
    _mm256_storeu_pd(sums.as_mut_ptr().add(4), hi);
    let mut out = [0f32; 8];
    for (r, (o, &sum)) in out.iter_mut().zip(&sums).enumerate() {
        let row = rows[r];
        *o = float::dot_f64_serial_from(sum, i, a, |j| weight_at::<W>(row, j)) as f32;
    }
    out
}

/// Block kernel for float weights: groups of eight rows through [`float_rows8`] (a last partial
/// group repeats its first row in the unused lanes), every activation row per group.
#[inline(always)]
unsafe fn float_block<const W: u8>(
    w: &[u8],
    row_bytes: usize,
    nrows: usize,
    acts: &[QuantizedActs],
    out: &mut [f32],
    stride: usize,
) {
    for r0 in (0..nrows).step_by(8) {
        let g = (nrows - r0).min(8);
        let mut rows = [&w[..0]; 8];
        for (r, row) in rows.iter_mut().enumerate() {
            let r = r0 + if r < g { r } else { 0 };
            *row = &w[r * row_bytes..(r + 1) * row_bytes];
        }
        for (i, a) in acts.iter().enumerate() {
            let res = float_rows8::<W>(&rows, &a.vals);
            for (r, &v) in res.iter().enumerate().take(g) {
                out[(r0 + r) * stride + i] = v;
            }
        }
    }
}

macro_rules! float_block_entry {
    ($name:ident, $w:expr) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $name(
            w: &[u8],
            row_bytes: usize,
            nrows: usize,
            acts: &[QuantizedActs],
            out: &mut [f32],
            stride: usize,
        ) {
            float_block::<{ $w }>(w, row_bytes, nrows, acts, out, stride)
        }
    };
}

float_block_entry!(f32_block_avx2, W_F32);
float_block_entry!(f16_block_avx2, W_F16);
float_block_entry!(bf16_block_avx2, W_BF16);

/// `ops::dot`'s f32 × f32 dot: 32 lanes (4 × 8-lane FMA accumulators), then `reduce32`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f32_avx2(w: &[u8], a: &[f32]) -> f32 {
    let n = a.len();
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + FLOAT_LANES <= n {
        for (r, accr) in acc.iter_mut().enumerate() {
            let x = _mm256_loadu_ps(ap.add(i + 8 * r));
            *accr = _mm256_fmadd_ps(load8::<W_F32>(wp, i + 8 * r), x, *accr);
        }
        i += FLOAT_LANES;
    }
    let mut lanes = [0f32; FLOAT_LANES];
    for (r, accr) in acc.iter().enumerate() {
        _mm256_storeu_ps(lanes.as_mut_ptr().add(8 * r), *accr);
    }
    accumulate_tail(&mut lanes, i, a, |j| weight_at::<W_F32>(w, j));
    reduce32(&lanes)
}

// ---------------------------------------------------------------------------------------------
// Integer helpers.

/// `Σ u[i] * s[i]` over groups of four bytes (`u` unsigned, `s` signed) into 8 i32 lanes. Callers
/// keep |u * s| pair sums below 2^15 so the AVX2 form cannot saturate.
#[inline(always)]
unsafe fn dot_u8i8<const VNNI: bool>(u: __m256i, s: __m256i) -> __m256i {
    if VNNI {
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s)
    } else {
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
    }
}

/// Sum of the 8 i32 lanes.
#[inline(always)]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// Low half: `x`'s 8 lanes folded to 4; high half: `y`'s.
#[inline(always)]
unsafe fn fold_halves(x: __m256i, y: __m256i) -> __m256i {
    _mm256_add_epi32(
        _mm256_permute2x128_si256::<0x20>(x, y),
        _mm256_permute2x128_si256::<0x31>(x, y),
    )
}

/// Lane `j` of the result is the sum of all lanes of `v[j]`.
#[inline(always)]
unsafe fn transpose_sum8(v: &[__m256i; 8]) -> __m256i {
    let t0 = fold_halves(v[0], v[4]);
    let t1 = fold_halves(v[1], v[5]);
    let t2 = fold_halves(v[2], v[6]);
    let t3 = fold_halves(v[3], v[7]);
    let u0 = _mm256_hadd_epi32(t0, t1);
    let u1 = _mm256_hadd_epi32(t2, t3);
    _mm256_hadd_epi32(u0, u1)
}

/// The 32 nibbles of 16 bytes in element order: low nibbles, then high nibbles.
#[inline(always)]
unsafe fn nibbles32(p: *const u8) -> __m256i {
    let q = _mm_loadu_si128(p as *const __m128i);
    let m4 = _mm_set1_epi8(0x0f);
    let lo = _mm_and_si128(q, m4);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(q), m4);
    _mm256_set_m128i(hi, lo)
}

/// Byte `i` = 0x10 where bit `i` of `bits` is set, else 0; one masked broadcast with
/// AVX-512 (`AVX512`: BW + VL available).
#[inline(always)]
unsafe fn bits_to_0x10<const AVX512: bool>(bits: u32) -> __m256i {
    if AVX512 {
        return _mm256_maskz_set1_epi8(bits, 0x10);
    }
    let v = _mm256_set1_epi32(bits as i32);
    // Byte i takes source byte i / 8 (each 128-bit lane holds all four bytes of `bits`).
    let spread = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3,
        3, 3,
    );
    let b = _mm256_shuffle_epi8(v, spread);
    let sel = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(b, sel), sel);
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// The eight half values at `p`, `p + step`, ..., `p + 7 * step`, widened.
#[inline(always)]
unsafe fn halves8(p: *const u8, step: usize) -> __m256 {
    let h = |j: usize| (p.add(j * step) as *const i16).read_unaligned();
    _mm256_cvtph_ps(_mm_setr_epi16(
        h(0),
        h(1),
        h(2),
        h(3),
        h(4),
        h(5),
        h(6),
        h(7),
    ))
}

// ---------------------------------------------------------------------------------------------
// Q4_0 / Q5_0 / Q8_0 × Q8_0 and Q4_1 / Q5_1 × Q8_1.
//
// In ggml's order: the integer sums of eight blocks at a time (4/5-bit blocks two to a vector,
// one per 128-bit half), their float terms (`legacy::block_term`) formed lane-wise, then added
// to the running sum one block after the other. The block kernels unpack each group of eight
// weight blocks once for all activation rows.

const KIND_Q4_0: u8 = 0;
const KIND_Q5_0: u8 = 1;
const KIND_Q8_0: u8 = 2;
const KIND_Q4_1: u8 = 3;
const KIND_Q5_1: u8 = 4;

const fn kind_of(kind: u8) -> Kind {
    match kind {
        KIND_Q4_0 => Kind::Q4_0,
        KIND_Q5_0 => Kind::Q5_0,
        KIND_Q8_0 => Kind::Q8_0,
        KIND_Q4_1 => Kind::Q4_1,
        _ => Kind::Q5_1,
    }
}

/// Log2 of the weight quant offset (0: none).
const fn off_shift(kind: u8) -> i32 {
    match kind {
        KIND_Q4_0 => 3,
        KIND_Q5_0 => 4,
        _ => 0,
    }
}

/// The 32 unsigned weight quants of one block (element order): `u` with the weight quant
/// `u - offset` (offset 8 for Q4_0, 16 for Q5_0, 0 for Q4_1 / Q5_1), or `|w|` for Q8_0.
/// `AVX512` selects the AVX-512 (VNNI path) forms.
#[inline(always)]
unsafe fn unpack_block<const KIND: u8, const AVX512: bool>(blk: *const u8) -> __m256i {
    match KIND {
        KIND_Q4_0 => nibbles32(blk.add(2)),
        KIND_Q5_0 => {
            let qh = (blk.add(2) as *const u32).read_unaligned();
            _mm256_or_si256(nibbles32(blk.add(6)), bits_to_0x10::<AVX512>(qh))
        }
        KIND_Q4_1 => nibbles32(blk.add(4)),
        KIND_Q5_1 => {
            let qh = (blk.add(4) as *const u32).read_unaligned();
            _mm256_or_si256(nibbles32(blk.add(8)), bits_to_0x10::<AVX512>(qh))
        }
        _ => _mm256_abs_epi8(_mm256_loadu_si256(blk.add(2) as *const __m256i)),
    }
}

/// 8 i32 lanes summing to Σ u * a for one block (`u` from [`unpack_block`] of the block at
/// `blk`, `q` the activation quants); for Q8_0 the product of `|w|` with `a` carrying `w`'s
/// sign is `w * a` (|w| <= 128 and |a| <= 127 keep pairs in i16).
#[inline(always)]
unsafe fn block_products<const KIND: u8, const VNNI: bool>(
    u: __m256i,
    blk: *const u8,
    q: *const i8,
) -> __m256i {
    let av = _mm256_loadu_si256(q as *const __m256i);
    if KIND == KIND_Q8_0 {
        let wv = _mm256_loadu_si256(blk.add(2) as *const __m256i);
        dot_u8i8::<VNNI>(u, _mm256_sign_epi8(av, wv))
    } else {
        dot_u8i8::<VNNI>(u, av)
    }
}

/// Dots of `nrows` rows of `KIND` blocks with each row of `acts` (see `BlockFn`).
#[inline(always)]
unsafe fn legacy_block<const KIND: u8, const VNNI: bool>(
    w: &[u8],
    row_bytes: usize,
    nrows: usize,
    acts: &[QuantizedActs],
    out: &mut [f32],
    stride: usize,
) {
    if VNNI && acts.len() > 1 {
        // Prefill: the activation rows in the lanes of one or two vectors.
        for (t, tile) in acts.chunks(2 * LANES).enumerate() {
            let out = &mut out[t * 2 * LANES..];
            if tile.len() > LANES {
                legacy_lanes::<KIND, 2>(w, row_bytes, nrows, tile, out, stride);
            } else {
                legacy_lanes::<KIND, 1>(w, row_bytes, nrows, tile, out, stride);
            }
        }
        return;
    }
    for (t, tile) in acts.chunks(MAX_ACTS).enumerate() {
        let out = &mut out[t * MAX_ACTS..];
        // One activation row (decode) gets its own instance so that the running sum, a serial
        // chain of additions, stays in a register. (Interleaving the chains of two weight rows
        // measured faster only for Q4_0 and twice slower for Q8_0 on Zen 4.)
        if tile.len() == 1 {
            legacy_tile::<KIND, VNNI, 1>(w, row_bytes, nrows, tile, out, stride);
        } else {
            legacy_tile::<KIND, VNNI, MAX_ACTS>(w, row_bytes, nrows, tile, out, stride);
        }
    }
}

/// Offsets of a 4/5-bit block's `qs` and `qh` fields.
const fn nibble_fields(kind: u8) -> (usize, usize) {
    match kind {
        KIND_Q4_0 => (2, 0),
        KIND_Q5_0 => (6, 2),
        KIND_Q4_1 => (4, 0),
        _ => (8, 4),
    }
}

/// The unsigned quants of two consecutive 4/5-bit blocks A (at `blk`) and B (`bb` bytes on):
/// `lo` holds elements 0..16 of A in its low 128-bit half and of B in its high half, `hi`
/// elements 16..32 likewise.
#[inline(always)]
unsafe fn unpack_pair<const KIND: u8, const AVX512: bool>(
    blk: *const u8,
    bb: usize,
) -> (__m256i, __m256i) {
    let (qs, qh) = nibble_fields(KIND);
    let v = _mm256_loadu2_m128i(
        blk.add(bb + qs) as *const __m128i,
        blk.add(qs) as *const __m128i,
    );
    let m4 = _mm256_set1_epi8(0x0f);
    let mut lo = _mm256_and_si256(v, m4);
    let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
    if KIND == KIND_Q5_0 || KIND == KIND_Q5_1 {
        let ha = (blk.add(qh) as *const u32).read_unaligned();
        let hb = (blk.add(bb + qh) as *const u32).read_unaligned();
        lo = _mm256_or_si256(lo, bits_to_0x10::<AVX512>((ha & 0xffff) | (hb << 16)));
        hi = _mm256_or_si256(hi, bits_to_0x10::<AVX512>((ha >> 16) | (hb & 0xffff_0000)));
    }
    (lo, hi)
}

/// 8 i32 lanes: the low four sum to Σ u * a of block A, the high four of block B, for the
/// [`unpack_pair`] halves `lo`, `hi` and the two blocks' activation quants at `q`.
#[inline(always)]
unsafe fn pair_products<const VNNI: bool>(lo: __m256i, hi: __m256i, q: *const i8) -> __m256i {
    let a_lo = _mm256_loadu2_m128i(q.add(32) as *const __m128i, q as *const __m128i);
    let a_hi = _mm256_loadu2_m128i(q.add(48) as *const __m128i, q.add(16) as *const __m128i);
    if VNNI {
        _mm256_dpbusd_epi32(
            _mm256_dpbusd_epi32(_mm256_setzero_si256(), lo, a_lo),
            hi,
            a_hi,
        )
    } else {
        _mm256_add_epi32(dot_u8i8::<false>(lo, a_lo), dot_u8i8::<false>(hi, a_hi))
    }
}

/// The eight block sums, in block order, from four [`pair_products`] results.
#[inline(always)]
unsafe fn pair_sums8(v: &[__m256i; 4]) -> __m256i {
    // 128-bit halves: [0, 0, 2, 2] / [1, 1, 3, 3], then [0, 2, 4, 6] / [1, 3, 5, 7].
    let t0 = _mm256_hadd_epi32(v[0], v[1]);
    let t1 = _mm256_hadd_epi32(v[2], v[3]);
    let t = _mm256_hadd_epi32(t0, t1);
    _mm256_permutevar8x32_epi32(t, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

/// Eight consecutive weight blocks at `gp` unpacked for [`group_terms`]: per block
/// ([`unpack_block`]) for Q8_0, per pair (`lo`, `hi` of [`unpack_pair`]) for the 4/5-bit types.
#[inline(always)]
unsafe fn unpack_group<const KIND: u8, const VNNI: bool>(gp: *const u8) -> [__m256i; 8] {
    let bb = kind_of(KIND).block_bytes();
    let mut u = [_mm256_setzero_si256(); 8];
    if KIND == KIND_Q8_0 {
        for (jj, uj) in u.iter_mut().enumerate() {
            *uj = unpack_block::<KIND, VNNI>(gp.add(jj * bb));
        }
    } else {
        for p in 0..4 {
            let (lo, hi) = unpack_pair::<KIND, VNNI>(gp.add(2 * p * bb), bb);
            u[2 * p] = lo;
            u[2 * p + 1] = hi;
        }
    }
    u
}

/// The float terms of blocks `b0..b0 + 8` with activation row `a`: `u` the weight blocks at
/// `wp` unpacked by [`unpack_group`], `dw` / `mw` their half scales and minimums.
#[inline(always)]
unsafe fn group_terms<const KIND: u8, const VNNI: bool>(
    u: &[__m256i; 8],
    wp: *const u8,
    (dw, mw): (__m256, __m256),
    a: &QuantizedActs,
    b0: usize,
) -> [f32; 8] {
    let kind = kind_of(KIND);
    let bb = kind.block_bytes();
    let shift = off_shift(KIND);
    let qp = a.qs.as_ptr().add(b0 * QK);
    let mut isum = if KIND == KIND_Q8_0 {
        let mut v = [_mm256_setzero_si256(); 8];
        for (jj, vj) in v.iter_mut().enumerate() {
            *vj = block_products::<KIND, VNNI>(u[jj], wp.add(jj * bb), qp.add(jj * QK));
        }
        transpose_sum8(&v)
    } else {
        let mut v = [_mm256_setzero_si256(); 4];
        for (p, vp) in v.iter_mut().enumerate() {
            *vp = pair_products::<VNNI>(u[2 * p], u[2 * p + 1], qp.add(2 * p * QK));
        }
        pair_sums8(&v)
    };
    if shift > 0 {
        let s = _mm256_loadu_si256(a.isum.as_ptr().add(b0) as *const __m256i);
        isum = _mm256_sub_epi32(isum, _mm256_sll_epi32(s, _mm_cvtsi32_si128(shift)));
    }
    let s = _mm256_cvtepi32_ps(isum);
    let da = _mm256_loadu_ps(a.d.as_ptr().add(b0));
    // legacy::block_term, lane-wise.
    let t = match kind {
        Kind::Q4_0 => _mm256_mul_ps(_mm256_mul_ps(s, dw), da),
        Kind::Q5_0 => _mm256_mul_ps(_mm256_mul_ps(dw, da), s),
        Kind::Q8_0 => _mm256_mul_ps(s, _mm256_mul_ps(dw, da)),
        Kind::Q4_1 | Kind::Q5_1 => {
            let sa = _mm256_loadu_ps(a.s.as_ptr().add(b0));
            _mm256_add_ps(
                _mm256_mul_ps(_mm256_mul_ps(dw, da), s),
                _mm256_mul_ps(mw, sa),
            )
        }
    };
    let mut terms = [0f32; 8];
    _mm256_storeu_ps(terms.as_mut_ptr(), t);
    terms
}

/// [`legacy_block`] for at most `M` activation rows.
#[inline(always)]
unsafe fn legacy_tile<const KIND: u8, const VNNI: bool, const M: usize>(
    w: &[u8],
    row_bytes: usize,
    nrows: usize,
    tile: &[QuantizedActs],
    out: &mut [f32],
    stride: usize,
) {
    let kind = kind_of(KIND);
    let bb = kind.block_bytes();
    let shift = off_shift(KIND);
    let nb = row_bytes / bb;
    for j in 0..nrows {
        let row = &w[j * row_bytes..(j + 1) * row_bytes];
        let wp = row.as_ptr();
        let mut sum = [0f32; M];
        let mut b0 = 0;
        while b0 + 8 <= nb {
            // Unpacked once, used for every activation row.
            let gp = wp.add(b0 * bb);
            let u = unpack_group::<KIND, VNNI>(gp);
            let mw = if kind.has_min() {
                halves8(gp.add(2), bb)
            } else {
                _mm256_setzero_ps()
            };
            let scales = (halves8(gp, bb), mw);
            for (a, si) in tile.iter().zip(sum.iter_mut()) {
                // The running sum takes the terms one block after the other.
                for t in group_terms::<KIND, VNNI>(&u, gp, scales, a, b0) {
                    *si += t;
                }
            }
            b0 += 8;
        }
        for b in b0..nb {
            let blk = &row[b * bb..(b + 1) * bb];
            let u = unpack_block::<KIND, VNNI>(blk.as_ptr());
            let ws = legacy::block_scales(kind, blk);
            for (a, si) in tile.iter().zip(sum.iter_mut()) {
                let off = if shift > 0 { a.isum[b] << shift } else { 0 };
                let q = a.qs.as_ptr().add(b * QK);
                let isum = hsum_i32(block_products::<KIND, VNNI>(u, blk.as_ptr(), q)) - off;
                *si += legacy::block_term(kind, isum, ws, legacy::act_scales(kind, a, b));
            }
        }
        for (i, &si) in sum.iter().enumerate().take(tile.len()) {
            out[j * stride + i] = si;
        }
    }
}

/// Activation rows of a [`legacy_lanes`] pass: one per 32-bit lane of a 512-bit vector.
const LANES: usize = 16;

/// 8×8 transpose of 32-bit elements: output `c` holds element `c` of each input, in input
/// order.
#[inline(always)]
unsafe fn transpose8x8_epi32(r: &[__m256i; 8]) -> [__m256i; 8] {
    let t0 = _mm256_unpacklo_epi32(r[0], r[1]);
    let t1 = _mm256_unpackhi_epi32(r[0], r[1]);
    let t2 = _mm256_unpacklo_epi32(r[2], r[3]);
    let t3 = _mm256_unpackhi_epi32(r[2], r[3]);
    let t4 = _mm256_unpacklo_epi32(r[4], r[5]);
    let t5 = _mm256_unpackhi_epi32(r[4], r[5]);
    let t6 = _mm256_unpacklo_epi32(r[6], r[7]);
    let t7 = _mm256_unpackhi_epi32(r[6], r[7]);
    // u0: elements 0 | 4 of rows 0..4, u1: 1 | 5, u2: 2 | 6, u3: 3 | 7; u4..u8 rows 4..8.
    let u0 = _mm256_unpacklo_epi64(t0, t2);
    let u1 = _mm256_unpackhi_epi64(t0, t2);
    let u2 = _mm256_unpacklo_epi64(t1, t3);
    let u3 = _mm256_unpackhi_epi64(t1, t3);
    let u4 = _mm256_unpacklo_epi64(t4, t6);
    let u5 = _mm256_unpackhi_epi64(t4, t6);
    let u6 = _mm256_unpacklo_epi64(t5, t7);
    let u7 = _mm256_unpackhi_epi64(t5, t7);
    [
        _mm256_permute2x128_si256::<0x20>(u0, u4),
        _mm256_permute2x128_si256::<0x20>(u1, u5),
        _mm256_permute2x128_si256::<0x20>(u2, u6),
        _mm256_permute2x128_si256::<0x20>(u3, u7),
        _mm256_permute2x128_si256::<0x31>(u0, u4),
        _mm256_permute2x128_si256::<0x31>(u1, u5),
        _mm256_permute2x128_si256::<0x31>(u2, u6),
        _mm256_permute2x128_si256::<0x31>(u3, u7),
    ]
}

/// A tile of at most [`LANES`] activation rows rearranged for [`legacy_lanes`]: lane `i` of
/// each 512-bit vector belongs to activation row `i` (unused lanes zero).
struct LaneActs {
    /// Block `b`, 4-byte group `c`: vector `b * 8 + c`, lane `i` the quants `4c..4c + 4` of
    /// row `i`'s block `b` (biased by +128 to unsigned for Q8_0).
    qs: Vec<__m512i>,
    /// Per block: `-(Σq << off_shift)` (Q4_0 / Q5_0).
    off: Vec<__m512i>,
    /// Per block: the activation scales `d`.
    d: Vec<__m512>,
    /// Per block: `s` (Q4_1 / Q5_1).
    s: Vec<__m512>,
}

#[inline(always)]
unsafe fn lane_acts<const KIND: u8, const G: usize>(tile: &[QuantizedActs], nb: usize) -> LaneActs {
    let kind = kind_of(KIND);
    let shift = off_shift(KIND);
    let n = tile.len();
    // Every vector is written below (both 256-bit halves of each), so the buffer is not zeroed
    // first.
    let len = nb * 8 * G;
    let mut qs: Vec<__m512i> = Vec::with_capacity(len);
    let bias = _mm256_set1_epi8(if KIND == KIND_Q8_0 { -128 } else { 0 });
    for b in 0..nb {
        for half in 0..2 * G {
            let mut r = [bias; 8];
            for (ii, rr) in r.iter_mut().enumerate() {
                let i = half * 8 + ii;
                if i < n {
                    let v = _mm256_loadu_si256(tile[i].qs.as_ptr().add(b * QK) as *const __m256i);
                    *rr = _mm256_xor_si256(v, bias);
                }
            }
            let t = transpose8x8_epi32(&r);
            for (c, tc) in t.iter().enumerate() {
                // Inside the capacity: (b * 8 + c) * G + half / 2 < len.
                let dst = (qs.as_mut_ptr().add((b * 8 + c) * G) as *mut __m256i).add(half);
                _mm256_storeu_si256(dst, *tc);
            }
        }
    }
    // SAFETY: the loops above wrote both halves of all `len` vectors (b < nb, c < 8, half <
    // 2G), within the capacity reserved for them.
    qs.set_len(len);
    let mut off = Vec::new();
    if shift > 0 {
        off.reserve_exact(nb * G);
        for bg in 0..nb * G {
            let (b, g) = (bg / G, bg % G);
            let mut v = [0i32; LANES];
            for (vi, a) in v.iter_mut().zip(tile.iter().skip(g * LANES)) {
                *vi = -(a.isum[b] << shift);
            }
            off.push(_mm512_loadu_si512(v.as_ptr() as *const __m512i));
        }
    }
    let mut d = Vec::with_capacity(nb * G);
    for bg in 0..nb * G {
        let (b, g) = (bg / G, bg % G);
        let mut v = [0f32; LANES];
        for (vi, a) in v.iter_mut().zip(tile.iter().skip(g * LANES)) {
            *vi = a.d[b];
        }
        d.push(_mm512_loadu_ps(v.as_ptr()));
    }
    let mut s = Vec::new();
    if kind.has_min() {
        s.reserve_exact(nb * G);
        for bg in 0..nb * G {
            let (b, g) = (bg / G, bg % G);
            let mut v = [0f32; LANES];
            for (vi, a) in v.iter_mut().zip(tile.iter().skip(g * LANES)) {
                *vi = a.s[b];
            }
            s.push(_mm512_loadu_ps(v.as_ptr()));
        }
    }
    LaneActs { qs, off, d, s }
}

/// Weight rows one [`lanes_pass`] handles together (sharing the activation vectors).
const LANE_ROWS: usize = 4;

/// One weight row prepared for [`lanes_pass`]: per block the unsigned quants (4/5-bit types),
/// `-(Σw << 7)` (Q8_0), and the half scale and minimum widened.
struct LaneRow {
    uq: Vec<__m256i>,
    wcorr: Vec<i32>,
    dw: Vec<f32>,
    mw: Vec<f32>,
}

impl LaneRow {
    fn new(kind: u8, nb: usize) -> Self {
        let nibbles = kind != KIND_Q8_0;
        let min = kind_of(kind).has_min();
        // SAFETY: an all-zero bit pattern is a valid `__m256i`.
        let zero = unsafe { core::mem::zeroed::<__m256i>() };
        LaneRow {
            uq: vec![zero; if nibbles { nb } else { 0 }],
            wcorr: vec![0; if nibbles { 0 } else { nb }],
            dw: vec![0.0; nb],
            mw: vec![0.0; if min { nb } else { 0 }],
        }
    }
}

/// Fills `lr` from the weight row at `wp` (`nb` blocks of `bb` bytes).
#[inline(always)]
unsafe fn prepare_row<const KIND: u8>(wp: *const u8, nb: usize, bb: usize, lr: &mut LaneRow) {
    let mut b = 0;
    while b + 8 <= nb {
        let gp = wp.add(b * bb);
        _mm256_storeu_ps(lr.dw.as_mut_ptr().add(b), halves8(gp, bb));
        if kind_of(KIND).has_min() {
            _mm256_storeu_ps(lr.mw.as_mut_ptr().add(b), halves8(gp.add(2), bb));
        }
        b += 8;
    }
    for bt in b..nb {
        let blk = core::slice::from_raw_parts(wp.add(bt * bb), bb);
        let (d, m) = legacy::block_scales(kind_of(KIND), blk);
        lr.dw[bt] = d;
        if kind_of(KIND).has_min() {
            lr.mw[bt] = m;
        }
    }
    if KIND == KIND_Q8_0 {
        let ones = _mm256_set1_epi8(1);
        let mut b = 0;
        while b + 8 <= nb {
            let mut v = [_mm256_setzero_si256(); 8];
            for (jj, vj) in v.iter_mut().enumerate() {
                let q = _mm256_loadu_si256(wp.add((b + jj) * bb + 2) as *const __m256i);
                *vj = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, q);
            }
            let s = _mm256_slli_epi32::<7>(transpose_sum8(&v));
            let neg = _mm256_sub_epi32(_mm256_setzero_si256(), s);
            _mm256_storeu_si256(lr.wcorr.as_mut_ptr().add(b) as *mut __m256i, neg);
            b += 8;
        }
        for (bt, wc) in lr.wcorr.iter_mut().enumerate().skip(b) {
            let q = _mm256_loadu_si256(wp.add(bt * bb + 2) as *const __m256i);
            *wc = -(hsum_i32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, q)) << 7);
        }
    } else {
        for (bt, u) in lr.uq.iter_mut().enumerate() {
            *u = unpack_block::<KIND, true>(wp.add(bt * bb));
        }
    }
}

/// The running sums (vector `g`, lane `i`: activation row `g * LANES + i`) of `R` prepared
/// weight rows, weight row `r`'s quants at `wps[r]` (Q8_0).
#[inline(always)]
unsafe fn lanes_pass<const KIND: u8, const R: usize, const G: usize>(
    wps: [*const u8; R],
    rows: &[LaneRow],
    la: &LaneActs,
    nb: usize,
) -> [[__m512; G]; R] {
    let kind = kind_of(KIND);
    let bb = kind.block_bytes();
    let mut sum = [[_mm512_setzero_ps(); G]; R];
    for b in 0..nb {
        let aq = la.qs.as_ptr().add(b * 8 * G);
        let mut acc0 = [[_mm512_setzero_si512(); G]; R];
        let mut acc1 = [[_mm512_setzero_si512(); G]; R];
        let mut wq = [core::ptr::null::<u8>(); R];
        for r in 0..R {
            for (g, a0) in acc0[r].iter_mut().enumerate() {
                *a0 = match KIND {
                    KIND_Q8_0 => _mm512_set1_epi32(*rows[r].wcorr.get_unchecked(b)),
                    KIND_Q4_0 | KIND_Q5_0 => *la.off.get_unchecked(b * G + g),
                    _ => _mm512_setzero_si512(),
                };
            }
            wq[r] = if KIND == KIND_Q8_0 {
                wps[r].add(b * bb + 2)
            } else {
                rows[r].uq.as_ptr().add(b) as *const u8
            };
        }
        for c in 0..4 {
            let mut a0 = [_mm512_setzero_si512(); G];
            let mut a1 = [_mm512_setzero_si512(); G];
            for g in 0..G {
                a0[g] = *aq.add(c * G + g);
                a1[g] = *aq.add((c + 4) * G + g);
            }
            for r in 0..R {
                let w0 = _mm512_set1_epi32((wq[r].add(4 * c) as *const i32).read_unaligned());
                let w1 = _mm512_set1_epi32((wq[r].add(4 * c + 16) as *const i32).read_unaligned());
                for g in 0..G {
                    if KIND == KIND_Q8_0 {
                        // Σ (a + 128) * w; the start value removes 128 * Σw.
                        acc0[r][g] = _mm512_dpbusd_epi32(acc0[r][g], a0[g], w0);
                        acc1[r][g] = _mm512_dpbusd_epi32(acc1[r][g], a1[g], w1);
                    } else {
                        acc0[r][g] = _mm512_dpbusd_epi32(acc0[r][g], w0, a0[g]);
                        acc1[r][g] = _mm512_dpbusd_epi32(acc1[r][g], w1, a1[g]);
                    }
                }
            }
        }
        for r in 0..R {
            let dw = _mm512_set1_ps(*rows[r].dw.get_unchecked(b));
            for g in 0..G {
                let s = _mm512_cvtepi32_ps(_mm512_add_epi32(acc0[r][g], acc1[r][g]));
                let da = *la.d.get_unchecked(b * G + g);
                // legacy::block_term, lane-wise.
                let t = match kind {
                    Kind::Q4_0 => _mm512_mul_ps(_mm512_mul_ps(s, dw), da),
                    Kind::Q5_0 => _mm512_mul_ps(_mm512_mul_ps(dw, da), s),
                    Kind::Q8_0 => _mm512_mul_ps(s, _mm512_mul_ps(dw, da)),
                    Kind::Q4_1 | Kind::Q5_1 => _mm512_add_ps(
                        _mm512_mul_ps(_mm512_mul_ps(dw, da), s),
                        _mm512_mul_ps(
                            _mm512_set1_ps(*rows[r].mw.get_unchecked(b)),
                            *la.s.get_unchecked(b * G + g),
                        ),
                    ),
                };
                sum[r][g] = _mm512_add_ps(sum[r][g], t);
            }
        }
    }
    sum
}

/// Stores the lanes of `sums` set in `masks` to `o[g * LANES + i]` (lane `i` of vector `g`).
#[inline(always)]
unsafe fn store_lanes<const G: usize>(o: *mut f32, masks: &[__mmask16; G], sums: &[__m512; G]) {
    for (g, sg) in sums.iter().enumerate() {
        _mm512_mask_storeu_ps(o.add(g * LANES), masks[g], *sg);
    }
}

/// [`legacy_block`] for up to `G` × [`LANES`] activation rows with AVX-512 VNNI: the integer sum of
/// weight block `b` with every activation row at once (lane `i`: row `i`), from `vpdpbusd` of
/// each 4-byte group of the weight block broadcast against that group of all rows; then the
/// float terms lane-wise and the running sums, one per lane, in block order.
#[inline(always)]
unsafe fn legacy_lanes<const KIND: u8, const G: usize>(
    w: &[u8],
    row_bytes: usize,
    nrows: usize,
    tile: &[QuantizedActs],
    out: &mut [f32],
    stride: usize,
) {
    let bb = kind_of(KIND).block_bytes();
    let nb = row_bytes / bb;
    let n = tile.len();
    assert!(n <= G * LANES && w.len() >= nrows * row_bytes);
    assert!(nrows == 0 || out.len() >= (nrows - 1) * stride + n);
    let la = lane_acts::<KIND, G>(tile, nb);
    let mut rows: [LaneRow; LANE_ROWS] = core::array::from_fn(|_| LaneRow::new(KIND, nb));
    // Lanes of vector `g` holding activation rows: the masked stores write only outputs
    // `j * stride + i` with `i < n`, inside `out` (asserted above).
    let masks: [__mmask16; G] = core::array::from_fn(|g| {
        let k = n.saturating_sub(g * LANES).min(LANES);
        ((1u32 << k) - 1) as __mmask16
    });
    let wp = |j: usize| w.as_ptr().add(j * row_bytes);
    let mut j = 0;
    while j + LANE_ROWS <= nrows {
        for (r, lr) in rows.iter_mut().enumerate() {
            prepare_row::<KIND>(wp(j + r), nb, bb, lr);
        }
        let wps: [*const u8; LANE_ROWS] = core::array::from_fn(|r| wp(j + r));
        let sums = lanes_pass::<KIND, LANE_ROWS, G>(wps, &rows, &la, nb);
        for (r, sr) in sums.iter().enumerate() {
            store_lanes(out.as_mut_ptr().add((j + r) * stride), &masks, sr);
        }
        j += LANE_ROWS;
    }
    for j in j..nrows {
        prepare_row::<KIND>(wp(j), nb, bb, &mut rows[0]);
        let sums = lanes_pass::<KIND, 1, G>([wp(j)], &rows[..1], &la, nb);
        store_lanes(out.as_mut_ptr().add(j * stride), &masks, &sums[0]);
    }
}

/// Defines a legacy type's single-dot and block entry points for one feature set.
macro_rules! legacy_entries {
    ($dot:ident, $block:ident, $kind:expr, $vnni:expr, $features:literal) => {
        #[target_feature(enable = $features)]
        unsafe fn $block(
            w: &[u8],
            row_bytes: usize,
            nrows: usize,
            acts: &[QuantizedActs],
            out: &mut [f32],
            stride: usize,
        ) {
            legacy_block::<{ $kind }, { $vnni }>(w, row_bytes, nrows, acts, out, stride)
        }

        #[target_feature(enable = $features)]
        unsafe fn $dot(w: &[u8], a: &QuantizedActs) -> f32 {
            let mut out = [0f32];
            legacy_block::<{ $kind }, { $vnni }>(
                w,
                w.len(),
                1,
                core::slice::from_ref(a),
                &mut out,
                1,
            );
            out[0]
        }
    };
}

legacy_entries!(
    q4_0_avx2,
    q4_0_block_avx2,
    KIND_Q4_0,
    false,
    "avx2,fma,f16c"
);
legacy_entries!(
    q5_0_avx2,
    q5_0_block_avx2,
    KIND_Q5_0,
    false,
    "avx2,fma,f16c"
);
legacy_entries!(
    q8_0_avx2,
    q8_0_block_avx2,
    KIND_Q8_0,
    false,
    "avx2,fma,f16c"
);
legacy_entries!(
    q4_1_avx2,
    q4_1_block_avx2,
    KIND_Q4_1,
    false,
    "avx2,fma,f16c"
);
legacy_entries!(
    q5_1_avx2,
    q5_1_block_avx2,
    KIND_Q5_1,
    false,
    "avx2,fma,f16c"
);
legacy_entries!(
    q4_0_avx512,
    q4_0_block_avx512,
    KIND_Q4_0,
    true,
    "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"
);
legacy_entries!(
    q5_0_avx512,
    q5_0_block_avx512,
    KIND_Q5_0,
    true,
    "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"
);
legacy_entries!(
    q8_0_avx512,
    q8_0_block_avx512,
    KIND_Q8_0,
    true,
    "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"
);
legacy_entries!(
    q4_1_avx512,
    q4_1_block_avx512,
    KIND_Q4_1,
    true,
    "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"
);
legacy_entries!(
    q5_1_avx512,
    q5_1_block_avx512,
    KIND_Q5_1,
    true,
    "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"
);

// ---------------------------------------------------------------------------------------------
// k-quants × Q8_K (AVX2).
//
// Each super-block is unpacked once (quants in pair order, scale vectors, half scales) and then
// dotted with every activation row of the block kernel's tile.

/// Two consecutive little-endian halves at `p`, widened (F16C; same values as the software
/// conversion).
#[inline(always)]
unsafe fn f16x2(p: *const u8) -> (f32, f32) {
    let v = _mm_cvtph_ps(_mm_cvtsi32_si128((p as *const i32).read_unaligned()));
    (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_shuffle_ps::<1>(v, v)))
}

/// One half at `p`, widened.
#[inline(always)]
unsafe fn f16x1(p: *const u8) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(
        (p as *const u16).read_unaligned() as i32,
    )))
}

/// Lane accumulation of two pair-order product vectors. `p0` and `p1` are `maddubs` results
/// over 32 elements in pair order each: i16 lane `k` holds the two products of ggml lane
/// `k % 8`. `scales` holds, per 128-bit half, the i16 pair (scale for `p0`'s elements, scale
/// for `p1`'s). Adds to `acc.0` (ggml lanes 0..4 in each half) and `acc.1` (lanes 4..8).
#[inline(always)]
unsafe fn accumulate_pair(acc: &mut (__m256i, __m256i), p0: __m256i, p1: __m256i, scales: __m256i) {
    let lo = _mm256_madd_epi16(_mm256_unpacklo_epi16(p0, p1), scales);
    let hi = _mm256_madd_epi16(_mm256_unpackhi_epi16(p0, p1), scales);
    acc.0 = _mm256_add_epi32(acc.0, lo);
    acc.1 = _mm256_add_epi32(acc.1, hi);
}

/// The eight ggml lane sums from the two accumulators of [`accumulate_pair`], as f32 (exact:
/// the lane sums stay below 2^24).
#[inline(always)]
unsafe fn lanes_f32(acc: (__m256i, __m256i)) -> __m256 {
    _mm256_cvtepi32_ps(fold_halves(acc.0, acc.1))
}

/// `sums += d * lanes`, lane-wise.
#[inline(always)]
unsafe fn fold_lanes(sums: __m256, d: f32, lanes: __m256) -> __m256 {
    _mm256_add_ps(sums, _mm256_mul_ps(_mm256_set1_ps(d), lanes))
}

#[inline(always)]
unsafe fn finish_lanes(sum: f32, sums: __m256) -> f32 {
    let mut s = [0f32; 8];
    _mm256_storeu_ps(s.as_mut_ptr(), sums);
    kquants::finish_lanes(sum, &s)
}

/// `maddubs` of signed weight quants `w` with the 32 activation quants at `aq` (magnitudes at
/// `aabs`): |a| * (w with a's sign) = w * a; pairs stay below 2^15 for |w| <= 32.
#[inline(always)]
unsafe fn signed_products(w: __m256i, aq: *const i8, aabs: *const u8) -> __m256i {
    let av = _mm256_loadu_si256(aq as *const __m256i);
    let aa = _mm256_loadu_si256(aabs as *const __m256i);
    _mm256_maddubs_epi16(aa, _mm256_sign_epi8(w, av))
}

/// Running state of one k-quant dot: ggml's eight f32 lane sums and its scalar sum.
#[derive(Clone, Copy)]
struct KState {
    sums: __m256,
    sum: f32,
}

/// A k-quant weight format for [`kquant_block`].
trait KQuant {
    /// Super-block bytes.
    const BB: usize;
    /// The super-block at `p`, unpacked.
    type Unpacked;
    unsafe fn unpack(p: *const u8) -> Self::Unpacked;
    /// Folds super-block `b` (unpacked as `u`) of a row into the dot state with `a`.
    unsafe fn update(u: &Self::Unpacked, a: &QuantizedActs, b: usize, st: &mut KState);
}

/// Dots of `nrows` k-quant rows with each row of `acts` (see `BlockFn`).
#[inline(always)]
unsafe fn kquant_block<K: KQuant>(
    w: &[u8],
    row_bytes: usize,
    nrows: usize,
    acts: &[QuantizedActs],
    out: &mut [f32],
    stride: usize,
) {
    for (t, tile) in acts.chunks(MAX_ACTS).enumerate() {
        let out = &mut out[t * MAX_ACTS..];
        // One activation row (decode) gets its own instance, with the state in registers.
        if tile.len() == 1 {
            kquant_tile::<K, 1>(w, row_bytes, nrows, tile, out, stride);
        } else {
            kquant_tile::<K, MAX_ACTS>(w, row_bytes, nrows, tile, out, stride);
        }
    }
}

/// [`kquant_block`] for at most `M` activation rows.
#[inline(always)]
unsafe fn kquant_tile<K: KQuant, const M: usize>(
    w: &[u8],
    row_bytes: usize,
    nrows: usize,
    tile: &[QuantizedActs],
    out: &mut [f32],
    stride: usize,
) {
    let nb = row_bytes / K::BB;
    let zero = KState {
        sums: _mm256_setzero_ps(),
        sum: 0.0,
    };
    for j in 0..nrows {
        let wp = w.as_ptr().add(j * row_bytes);
        let mut st = [zero; M];
        for b in 0..nb {
            let u = K::unpack(wp.add(b * K::BB));
            for (a, s) in tile.iter().zip(st.iter_mut()) {
                K::update(&u, a, b, s);
            }
        }
        for (i, s) in st.iter().enumerate().take(tile.len()) {
            out[j * stride + i] = finish_lanes(s.sum, s.sums);
        }
    }
}

/// The 0x10 bits of Q5_K elements `64c + 32t + l` (bit `2c + t` of `qh[l]`).
#[inline(always)]
unsafe fn q5_k_high(qh: __m256i, shift: usize) -> __m256i {
    let bit = _mm256_set1_epi8((1u8 << shift) as i8);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit);
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// One Q4_K / Q5_K super-block, unpacked.
struct UnpackedK4 {
    /// Quants (0..32) in pair order: `q[2c]` of elements `64c..64c+32`, `q[2c+1]` of the next 32.
    q: [__m256i; 8],
    /// Chunk `c`: the i16 pair (scale of sub-block `2c`, of `2c + 1`) in every i32 lane.
    scales: [__m256i; 4],
    /// The 8 minimums as i16.
    mins: __m128i,
    d: f32,
    dmin: f32,
}

/// `Σ_j mins[j] * (bsums[2j] + bsums[2j+1])` for Q4_K / Q5_K (`m`: the mins as i16; pair sums
/// fit i16: |bsum| ≤ 2032).
#[inline(always)]
unsafe fn summ_k4(m: __m128i, bsums: *const i16) -> i32 {
    let b0 = _mm_loadu_si128(bsums as *const __m128i);
    let b1 = _mm_loadu_si128(bsums.add(8) as *const __m128i);
    let s = _mm_madd_epi16(m, _mm_hadd_epi16(b0, b1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// Q4_K (`HAS_QH = false`) and Q5_K.
struct K4Like<const HAS_QH: bool>;

impl<const HAS_QH: bool> KQuant for K4Like<HAS_QH> {
    const BB: usize = if HAS_QH { 176 } else { 144 };
    type Unpacked = UnpackedK4;

    #[inline(always)]
    unsafe fn unpack(p: *const u8) -> UnpackedK4 {
        let m4 = _mm256_set1_epi8(0x0f);
        let qs_at = if HAS_QH { 48 } else { 16 };
        let words = kquants::scale_min_words_k4(&*(p.add(4) as *const [u8; 12]));
        let sc16 = _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, words[1] as i32, words[0] as i32));
        let mins = _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, words[3] as i32, words[2] as i32));
        // Dword c of sc16 is the pair (scale 2c, scale 2c + 1).
        let sc16 = _mm256_castsi128_si256(sc16);
        let qh = if HAS_QH {
            pair_order(_mm256_loadu_si256(p.add(16) as *const __m256i))
        } else {
            _mm256_setzero_si256()
        };
        let mut q = [_mm256_setzero_si256(); 8];
        let mut scales = [_mm256_setzero_si256(); 4];
        for c in 0..4 {
            let raw = pair_order(_mm256_loadu_si256(p.add(qs_at + 32 * c) as *const __m256i));
            let mut lo = _mm256_and_si256(raw, m4);
            let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), m4);
            if HAS_QH {
                lo = _mm256_or_si256(lo, q5_k_high(qh, 2 * c));
                hi = _mm256_or_si256(hi, q5_k_high(qh, 2 * c + 1));
            }
            q[2 * c] = lo;
            q[2 * c + 1] = hi;
            scales[c] = _mm256_permutevar8x32_epi32(sc16, _mm256_set1_epi32(c as i32));
        }
        let (d, dmin) = f16x2(p);
        UnpackedK4 {
            q,
            scales,
            mins,
            d,
            dmin,
        }
    }

    #[inline(always)]
    unsafe fn update(u: &UnpackedK4, a: &QuantizedActs, b: usize, st: &mut KState) {
        let aq = a.pq.as_ptr().add(b * QK_K);
        let mut acc = (_mm256_setzero_si256(), _mm256_setzero_si256());
        for c in 0..4 {
            // Pairs: 31 * 127 * 2 < 2^15.
            let p0 = _mm256_maddubs_epi16(
                u.q[2 * c],
                _mm256_loadu_si256(aq.add(64 * c) as *const __m256i),
            );
            let p1 = _mm256_maddubs_epi16(
                u.q[2 * c + 1],
                _mm256_loadu_si256(aq.add(64 * c + 32) as *const __m256i),
            );
            accumulate_pair(&mut acc, p0, p1, u.scales[c]);
        }
        let summ = summ_k4(u.mins, a.bsums.as_ptr().add(b * 16));
        st.sums = fold_lanes(st.sums, u.d * a.d[b], lanes_f32(acc));
        st.sum -= (u.dmin * a.d[b]) * summ as f32;
    }
}

/// Shuffle masks for the scales of 32-element groups `2p` and `2p + 1` of a 128-element half
/// (Q3_K, Q6_K; 16-element sub-blocks), applied to that half's 8 i16 scales present in both
/// 128-bit lanes: the low lane repeats the pair (scale `4p`, scale `4p + 2`), the high lane
/// (scale `4p + 1`, scale `4p + 3`) - the sub-blocks of the elements that
/// [`accumulate_pair`] puts in each lane.
const SCALE_PAIRS: [[u8; 32]; 2] = {
    let mut m = [[0u8; 32]; 2];
    let mut p = 0;
    while p < 2 {
        let mut i = 0;
        while i < 4 {
            let (lo0, lo1) = (2 * (4 * p) as u8, 2 * (4 * p + 2) as u8);
            let (hi0, hi1) = (2 * (4 * p + 1) as u8, 2 * (4 * p + 3) as u8);
            m[p][4 * i] = lo0;
            m[p][4 * i + 1] = lo0 + 1;
            m[p][4 * i + 2] = lo1;
            m[p][4 * i + 3] = lo1 + 1;
            m[p][16 + 4 * i] = hi0;
            m[p][16 + 4 * i + 1] = hi0 + 1;
            m[p][16 + 4 * i + 2] = hi1;
            m[p][16 + 4 * i + 3] = hi1 + 1;
            i += 1;
        }
        p += 1;
    }
    m
};

/// One Q3_K / Q6_K super-block, unpacked.
struct Unpacked16 {
    /// Signed quants in pair order: `w[4h + g]` of elements `128h + 32g..` (32 of them).
    w: [__m256i; 8],
    /// `scales[2h + p]`: the [`accumulate_pair`] scales for groups `2p`, `2p + 1` of half `h`.
    scales: [__m256i; 4],
    d: f32,
}

/// The [`Unpacked16`] scale vectors from the 16 sub-block scales as i16.
#[inline(always)]
unsafe fn scales16(sc16: __m256i) -> [__m256i; 4] {
    let halves = [
        _mm256_permute2x128_si256::<0x00>(sc16, sc16),
        _mm256_permute2x128_si256::<0x11>(sc16, sc16),
    ];
    let mut out = [_mm256_setzero_si256(); 4];
    for (h, sch) in halves.iter().enumerate() {
        for (p, mask) in SCALE_PAIRS.iter().enumerate() {
            out[2 * h + p] =
                _mm256_shuffle_epi8(*sch, _mm256_loadu_si256(mask.as_ptr() as *const __m256i));
        }
    }
    out
}

/// Folds one Q3_K / Q6_K super-block into the state (no minimum term).
#[inline(always)]
unsafe fn update16(u: &Unpacked16, a: &QuantizedActs, b: usize, st: &mut KState) {
    let aq = a.pq.as_ptr().add(b * QK_K);
    let aabs = a.pq_abs.as_ptr().add(b * QK_K);
    let mut acc = (_mm256_setzero_si256(), _mm256_setzero_si256());
    for h in 0..2 {
        for p in 0..2 {
            let at = 128 * h + 64 * p;
            let p0 = signed_products(u.w[4 * h + 2 * p], aq.add(at), aabs.add(at));
            let p1 = signed_products(u.w[4 * h + 2 * p + 1], aq.add(at + 32), aabs.add(at + 32));
            accumulate_pair(&mut acc, p0, p1, u.scales[2 * h + p]);
        }
    }
    st.sums = fold_lanes(st.sums, u.d * a.d[b], lanes_f32(acc));
}

struct Q6K;

impl KQuant for Q6K {
    const BB: usize = 210;
    type Unpacked = Unpacked16;

    #[inline(always)]
    unsafe fn unpack(p: *const u8) -> Unpacked16 {
        let m4 = _mm256_set1_epi8(0x0f);
        let m30 = _mm256_set1_epi8(0x30);
        let x32 = _mm256_set1_epi8(32);
        let mut w = [_mm256_setzero_si256(); 8];
        for h in 0..2 {
            let l0 = pair_order(_mm256_loadu_si256(p.add(64 * h) as *const __m256i));
            let l1 = pair_order(_mm256_loadu_si256(p.add(64 * h + 32) as *const __m256i));
            let qh = pair_order(_mm256_loadu_si256(p.add(128 + 32 * h) as *const __m256i));
            // 6-bit quants (0..=63) of the four 32-element groups; the 16-bit shifts spill bits
            // across bytes only into positions the masks clear.
            let u = [
                _mm256_or_si256(
                    _mm256_and_si256(l0, m4),
                    _mm256_and_si256(_mm256_slli_epi16::<4>(qh), m30),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(l1, m4),
                    _mm256_and_si256(_mm256_slli_epi16::<2>(qh), m30),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(l0), m4),
                    _mm256_and_si256(qh, m30),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(l1), m4),
                    _mm256_and_si256(_mm256_srli_epi16::<2>(qh), m30),
                ),
            ];
            for (g, ug) in u.iter().enumerate() {
                w[4 * h + g] = _mm256_sub_epi8(*ug, x32);
            }
        }
        let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(192) as *const __m128i));
        Unpacked16 {
            w,
            scales: scales16(sc16),
            d: f16x1(p.add(208)),
        }
    }

    #[inline(always)]
    unsafe fn update(u: &Unpacked16, a: &QuantizedActs, b: usize, st: &mut KState) {
        update16(u, a, b, st)
    }
}

struct Q3K;

impl KQuant for Q3K {
    const BB: usize = 110;
    type Unpacked = Unpacked16;

    #[inline(always)]
    unsafe fn unpack(p: *const u8) -> Unpacked16 {
        let m3 = _mm256_set1_epi8(3);
        let x04 = _mm256_set1_epi8(4);
        let hmask = pair_order(_mm256_loadu_si256(p as *const __m256i));
        let mut w = [_mm256_setzero_si256(); 8];
        for h in 0..2 {
            let q = pair_order(_mm256_loadu_si256(p.add(32 + 32 * h) as *const __m256i));
            for s in 0..4 {
                // 16-bit shifts move bits across bytes only above the 2 bits kept.
                let low =
                    _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * s as i32)), m3);
                let bit = _mm256_set1_epi8((1u8 << (4 * h + s)) as i8);
                let set = _mm256_cmpeq_epi8(_mm256_and_si256(hmask, bit), bit);
                // low - 4, plus 4 where the high bit is set.
                w[4 * h + s] =
                    _mm256_sub_epi8(_mm256_or_si256(low, _mm256_and_si256(set, x04)), x04);
            }
        }
        let u6 = kquants::scales_q3_k_u6(&*(p.add(96) as *const [u8; 12]));
        let sc16 = _mm256_sub_epi16(
            _mm256_cvtepu8_epi16(_mm_loadu_si128(u6.as_ptr() as *const __m128i)),
            _mm256_set1_epi16(32),
        );
        Unpacked16 {
            w,
            scales: scales16(sc16),
            d: f16x1(p.add(108)),
        }
    }

    #[inline(always)]
    unsafe fn update(u: &Unpacked16, a: &QuantizedActs, b: usize, st: &mut KState) {
        update16(u, a, b, st)
    }
}

/// Shuffle masks for 32-element group `g` of a 128-element half (Q2_K, element order): the low
/// 128-bit lane broadcasts i16 scale `2g`, the high lane scale `2g + 1` (of the half's 8 scales
/// present in both lanes), matching maddubs lanes 0..8 (elements 0..16) and 8..16.
const SCALE_BCAST: [[u8; 32]; 4] = {
    let mut m = [[0u8; 32]; 4];
    let mut g = 0;
    while g < 4 {
        let mut i = 0;
        while i < 8 {
            m[g][2 * i] = 4 * g as u8;
            m[g][2 * i + 1] = 4 * g as u8 + 1;
            m[g][16 + 2 * i] = 4 * g as u8 + 2;
            m[g][16 + 2 * i + 1] = 4 * g as u8 + 3;
            i += 1;
        }
        g += 1;
    }
    m
};

/// One Q2_K super-block, unpacked (element order: Q2_K's dot needs only the total sum).
struct UnpackedQ2 {
    /// Quants (0..4) of elements `32k..32k+32`.
    q: [__m256i; 8],
    /// For `q[k]`: each 16-element half's scale in all i16 lanes of its 128-bit half.
    scales: [__m256i; 8],
    /// The 16 minimums as i16.
    mins: __m256i,
    d: f32,
    dmin: f32,
}

struct Q2K;

impl KQuant for Q2K {
    const BB: usize = 84;
    type Unpacked = UnpackedQ2;

    #[inline(always)]
    unsafe fn unpack(p: *const u8) -> UnpackedQ2 {
        let m3 = _mm256_set1_epi8(3);
        let sc = _mm_loadu_si128(p as *const __m128i);
        let sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(sc, _mm_set1_epi8(0x0f)));
        let mins =
            _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(sc), _mm_set1_epi8(0x0f)));
        let halves = [
            _mm256_permute2x128_si256::<0x00>(sc16, sc16),
            _mm256_permute2x128_si256::<0x11>(sc16, sc16),
        ];
        let mut q = [_mm256_setzero_si256(); 8];
        let mut scales = [_mm256_setzero_si256(); 8];
        for (h, sch) in halves.iter().enumerate() {
            let raw = _mm256_loadu_si256(p.add(16 + 32 * h) as *const __m256i);
            for (s, mask) in SCALE_BCAST.iter().enumerate() {
                // 16-bit shifts move bits across bytes only above the 2 bits kept.
                q[4 * h + s] =
                    _mm256_and_si256(_mm256_srl_epi16(raw, _mm_cvtsi32_si128(2 * s as i32)), m3);
                scales[4 * h + s] =
                    _mm256_shuffle_epi8(*sch, _mm256_loadu_si256(mask.as_ptr() as *const __m256i));
            }
        }
        let (d, dmin) = f16x2(p.add(80));
        UnpackedQ2 {
            q,
            scales,
            mins,
            d,
            dmin,
        }
    }

    #[inline(always)]
    unsafe fn update(u: &UnpackedQ2, a: &QuantizedActs, b: usize, st: &mut KState) {
        let aq = a.qs.as_ptr().add(b * QK_K);
        let mut acc = _mm256_setzero_si256();
        for k in 0..8 {
            let av = _mm256_loadu_si256(aq.add(32 * k) as *const __m256i);
            // Pairs: 3 * 127 * 2 < 2^15.
            let prod = _mm256_maddubs_epi16(u.q[k], av);
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(prod, u.scales[k]));
        }
        let bsums = _mm256_loadu_si256(a.bsums.as_ptr().add(b * 16) as *const __m256i);
        let summ = hsum_i32(_mm256_madd_epi16(bsums, u.mins));
        st.sum += kquants::q2_k_term(a.d[b], u.d, u.dmin, hsum_i32(acc), summ);
    }
}

// ---------------------------------------------------------------------------------------------
// Q4_K / Q6_K prefill with AVX-512 VNNI: one activation row per 32-bit lane.
//
// ggml's eight lane sums (`aux32`, lane = element index mod 8) of a super-block, for up to 16
// activation rows at once: the activation quants of each 16-element group, widened to i16 pairs
// (element `l`, element `l + 8`: ggml lane `l`, the pair order of `pq`), regrouped per tile so
// that vector (group, lane `l`) holds in lane `i` row `i`'s pair; the weight quants premultiplied
// by their sub-block scale (|w * scale| <= 4096, exact in i16) and each pair broadcast and
// `vpdpwssd`'d into the accumulator of its ggml lane. Q4_K's minimum term likewise from the
// bsums pairs. Then the float operations of the scalar kernel, lane-wise per activation row, in
// order.

/// A tile of activation rows for [`kquant_lanes`]: lane `i` of vector `g` is row `g * LANES + i`
/// (unused lanes zero).
struct KLaneActs {
    /// Super-block `b`, 16-element group `t`, ggml lane `l`: vector `((b * 16 + t) * 8 + l) * G
    /// + g`, lanes the i16 pairs (`q[16t + l]`, `q[16t + l + 8]`).
    qs: Vec<__m512i>,
    /// Q4_K: super-block `b`, `m` in 0..4: vector `(b * 4 + m) * G + g`, lanes the i16 pairs
    /// (`P[2m]`, `P[2m + 1]`), `P[j] = bsums[2j] + bsums[2j + 1]`.
    bs: Vec<__m512i>,
    /// Super-block `b`: vector `b * G + g`, the activation scales.
    d: Vec<__m512>,
}

#[inline(always)]
unsafe fn klane_acts<const Q4: bool, const G: usize>(
    tile: &[QuantizedActs],
    nb: usize,
) -> KLaneActs {
    let n = tile.len();
    let mut qs = vec![_mm512_setzero_si512(); nb * 128 * G];
    for b in 0..nb {
        for t in 0..16 {
            for half in 0..2 * G {
                let mut r = [_mm256_setzero_si256(); 8];
                for (ii, rr) in r.iter_mut().enumerate() {
                    let i = half * 8 + ii;
                    if i < n {
                        let p = tile[i].pq.as_ptr().add(b * QK_K + 16 * t);
                        *rr = _mm256_cvtepi8_epi16(_mm_loadu_si128(p as *const __m128i));
                    }
                }
                let tr = transpose8x8_epi32(&r);
                for (l, tl) in tr.iter().enumerate() {
                    let v = qs.as_mut_ptr().add(((b * 16 + t) * 8 + l) * G);
                    _mm256_storeu_si256((v as *mut __m256i).add(half), *tl);
                }
            }
        }
    }
    let mut bs = Vec::new();
    if Q4 {
        bs = vec![_mm512_setzero_si512(); nb * 4 * G];
        for (x, bv) in bs.iter_mut().enumerate() {
            let (b, m, g) = (x / (4 * G), (x / G) % 4, x % G);
            let mut v = [0i32; LANES];
            for (vi, a) in v.iter_mut().zip(tile.iter().skip(g * LANES)) {
                let s = &a.bsums[b * 16 + 4 * m..b * 16 + 4 * m + 4];
                let p0 = (s[0] as i32 + s[1] as i32) as u16 as u32;
                let p1 = (s[2] as i32 + s[3] as i32) as u16 as u32;
                *vi = (p0 | (p1 << 16)) as i32;
            }
            *bv = _mm512_loadu_si512(v.as_ptr() as *const __m512i);
        }
    }
    let mut d = vec![_mm512_setzero_ps(); nb * G];
    for (x, dv) in d.iter_mut().enumerate() {
        let (b, g) = (x / G, x % G);
        let mut v = [0f32; LANES];
        for (vi, a) in v.iter_mut().zip(tile.iter().skip(g * LANES)) {
            *vi = a.d[b];
        }
        *dv = _mm512_loadu_ps(v.as_ptr());
    }
    KLaneActs { qs, bs, d }
}

/// One Q4_K / Q6_K weight row prepared for [`kquant_lanes_pass`].
struct KLaneRow {
    /// Super-block `b`: dword `(b * 16 + t) * 8 + l` the i16 pair (`scale * w[16t + l]`,
    /// `scale * w[16t + l + 8]`).
    wq: Vec<i32>,
    /// Q4_K: super-block `b`, `m` in 0..4: the i16 pair (`min[2m]`, `min[2m + 1]`).
    mins: Vec<i32>,
    d: Vec<f32>,
    dmin: Vec<f32>,
}

impl KLaneRow {
    fn new(nb: usize) -> Self {
        KLaneRow {
            wq: vec![0; nb * 128],
            mins: vec![0; nb * 4],
            d: vec![0.0; nb],
            dmin: vec![0.0; nb],
        }
    }
}

/// The 16 quants of one 128-bit half (pair order), widened to i16 (`SIGNED`: as i8) and
/// multiplied by `scale`, stored at `dst`.
#[inline(always)]
unsafe fn store_scaled<const SIGNED: bool>(q: __m128i, scale: i16, dst: *mut i32) {
    let w = if SIGNED {
        _mm256_cvtepi8_epi16(q)
    } else {
        _mm256_cvtepu8_epi16(q)
    };
    let v = _mm256_mullo_epi16(w, _mm256_set1_epi16(scale));
    _mm256_storeu_si256(dst as *mut __m256i, v);
}

#[inline(always)]
unsafe fn prepare_krow<const Q4: bool>(wp: *const u8, nb: usize, row: &mut KLaneRow) {
    for b in 0..nb {
        let dst = row.wq.as_mut_ptr().add(b * 128);
        if Q4 {
            let p = wp.add(b * 144);
            let u = K4Like::<false>::unpack(p);
            let (sc, mn) = kquants::scales_mins_k4(&*(p.add(4) as *const [u8; 12]));
            // q[k]: sub-block k, groups 2k (low half) and 2k + 1.
            for (k, qk) in u.q.iter().enumerate() {
                let s = sc[k] as i16;
                store_scaled::<false>(_mm256_castsi256_si128(*qk), s, dst.add(16 * k));
                store_scaled::<false>(_mm256_extracti128_si256::<1>(*qk), s, dst.add(16 * k + 8));
            }
            for m in 0..4 {
                row.mins[b * 4 + m] = (mn[2 * m] as u32 | ((mn[2 * m + 1] as u32) << 16)) as i32;
            }
            row.d[b] = u.d;
            row.dmin[b] = u.dmin;
        } else {
            let p = wp.add(b * 210);
            let u = Q6K::unpack(p);
            // w[k]: groups 2k (low half) and 2k + 1; one scale per group.
            for (k, wk) in u.w.iter().enumerate() {
                let s0 = *p.add(192 + 2 * k) as i8 as i16;
                let s1 = *p.add(193 + 2 * k) as i8 as i16;
                store_scaled::<true>(_mm256_castsi256_si128(*wk), s0, dst.add(16 * k));
                store_scaled::<true>(_mm256_extracti128_si256::<1>(*wk), s1, dst.add(16 * k + 8));
            }
            row.d[b] = u.d;
        }
    }
}

/// Running float state of one weight row's dots in [`kquant_lanes`] (vector `g`, lane `i`:
/// activation row `g * LANES + i`): the scalar kernel's eight lane sums and its sum.
#[derive(Clone, Copy)]
struct KLaneState<const G: usize> {
    sums: [[__m512; 8]; G],
    sum: [__m512; G],
}

/// Folds super-block `b` of a prepared weight row into its state, with the float operations
/// of the scalar kernel per lane.
#[inline(always)]
unsafe fn kquant_lanes_step<const Q4: bool, const G: usize>(
    row: &KLaneRow,
    la: &KLaneActs,
    b: usize,
    st: &mut KLaneState<G>,
) {
    let wq = row.wq.as_ptr().add(b * 128);
    let aq = la.qs.as_ptr().add(b * 128 * G);
    let mut acc = [[_mm512_setzero_si512(); 8]; G];
    for t in 0..16 {
        for l in 0..8 {
            let wv = _mm512_set1_epi32(*wq.add(t * 8 + l));
            for (g, ag) in acc.iter_mut().enumerate() {
                ag[l] = _mm512_dpwssd_epi32(ag[l], wv, *aq.add((t * 8 + l) * G + g));
            }
        }
    }
    let dw = _mm512_set1_ps(*row.d.get_unchecked(b));
    for (g, ag) in acc.iter().enumerate() {
        let da = *la.d.get_unchecked(b * G + g);
        // sums[l] += (d * d_a) * lane[l].
        let dd = _mm512_mul_ps(dw, da);
        for (sl, al) in st.sums[g].iter_mut().zip(ag) {
            let lane = _mm512_cvtepi32_ps(*al);
            *sl = _mm512_add_ps(*sl, _mm512_mul_ps(dd, lane));
        }
        if Q4 {
            let mut s = _mm512_setzero_si512();
            for m in 0..4 {
                let mv = _mm512_set1_epi32(*row.mins.get_unchecked(b * 4 + m));
                s = _mm512_dpwssd_epi32(s, mv, *la.bs.get_unchecked((b * 4 + m) * G + g));
            }
            // sum -= (dmin * d_a) * summ.
            let dm = _mm512_mul_ps(_mm512_set1_ps(*row.dmin.get_unchecked(b)), da);
            st.sum[g] = _mm512_sub_ps(st.sum[g], _mm512_mul_ps(dm, _mm512_cvtepi32_ps(s)));
        }
    }
}

/// `sum + sums[0] + ... + sums[7]`, left to right, per lane.
#[inline(always)]
unsafe fn kquant_lanes_finish<const G: usize>(st: &KLaneState<G>) -> [__m512; G] {
    let mut out = st.sum;
    for (r, sg) in out.iter_mut().zip(st.sums.iter()) {
        for s in sg {
            *r = _mm512_add_ps(*r, *s);
        }
    }
    out
}

/// Weight rows [`kquant_lanes`] runs through each super-block together, so that the super-block's
/// regrouped activations (16 KiB for 32 rows) stay in L1.
const KLANE_ROWS: usize = 16;

/// Q4_K (`Q4`) / Q6_K dots of `nrows` weight rows with up to `G` × [`LANES`] activation rows.
#[inline(always)]
unsafe fn kquant_lanes<const Q4: bool, const G: usize>(
    w: &[u8],
    row_bytes: usize,
    nrows: usize,
    tile: &[QuantizedActs],
    out: &mut [f32],
    stride: usize,
) {
    let bb = if Q4 { 144 } else { 210 };
    let nb = row_bytes / bb;
    let n = tile.len();
    assert!(n <= G * LANES && w.len() >= nrows * row_bytes);
    assert!(nrows == 0 || out.len() >= (nrows - 1) * stride + n);
    assert!(tile
        .iter()
        .all(|a| a.pq.len() >= nb * QK_K && a.bsums.len() >= nb * 16 && a.d.len() >= nb));
    let la = klane_acts::<Q4, G>(tile, nb);
    let mut rows: [KLaneRow; KLANE_ROWS] = core::array::from_fn(|_| KLaneRow::new(nb));
    // The masked stores write only outputs `j * stride + i` with `i < n` (asserted above).
    let masks: [__mmask16; G] = core::array::from_fn(|g| {
        let k = n.saturating_sub(g * LANES).min(LANES);
        ((1u32 << k) - 1) as __mmask16
    });
    let zero = KLaneState::<G> {
        sums: [[_mm512_setzero_ps(); 8]; G],
        sum: [_mm512_setzero_ps(); G],
    };
    let mut j0 = 0;
    while j0 < nrows {
        let jn = (nrows - j0).min(KLANE_ROWS);
        for (r, row) in rows.iter_mut().enumerate().take(jn) {
            prepare_krow::<Q4>(w.as_ptr().add((j0 + r) * row_bytes), nb, row);
        }
        let mut st = [zero; KLANE_ROWS];
        for b in 0..nb {
            for (row, sr) in rows.iter().zip(st.iter_mut()).take(jn) {
                kquant_lanes_step::<Q4, G>(row, &la, b, sr);
            }
        }
        for (r, sr) in st.iter().enumerate().take(jn) {
            let sums = kquant_lanes_finish(sr);
            store_lanes(out.as_mut_ptr().add((j0 + r) * stride), &masks, &sums);
        }
        j0 += jn;
    }
}

/// Q4_K (`Q4`) / Q6_K prefill (several activation rows) with AVX-512 VNNI, through
/// [`kquant_lanes`] (decode keeps [`kquant_block`]).
#[inline(always)]
unsafe fn kquant_lanes_block<const Q4: bool>(
    w: &[u8],
    row_bytes: usize,
    nrows: usize,
    acts: &[QuantizedActs],
    out: &mut [f32],
    stride: usize,
) {
    for (t, tile) in acts.chunks(2 * LANES).enumerate() {
        let out = &mut out[t * 2 * LANES..];
        if tile.len() > LANES {
            kquant_lanes::<Q4, 2>(w, row_bytes, nrows, tile, out, stride);
        } else {
            kquant_lanes::<Q4, 1>(w, row_bytes, nrows, tile, out, stride);
        }
    }
}

/// Defines a k-quant's single-dot and block entry points for one feature set (the AVX-512 set
/// adds no instructions here, only the 16 extra vector registers of AVX512VL, which keep an
/// unpacked super-block in registers across activation rows).
macro_rules! kquant_entries {
    ($dot:ident, $block:ident, $k:ty, $features:literal) => {
        #[target_feature(enable = $features)]
        unsafe fn $block(
            w: &[u8],
            row_bytes: usize,
            nrows: usize,
            acts: &[QuantizedActs],
            out: &mut [f32],
            stride: usize,
        ) {
            kquant_block::<$k>(w, row_bytes, nrows, acts, out, stride)
        }

        #[target_feature(enable = $features)]
        unsafe fn $dot(w: &[u8], a: &QuantizedActs) -> f32 {
            let mut out = [0f32];
            kquant_block::<$k>(w, w.len(), 1, core::slice::from_ref(a), &mut out, 1);
            out[0]
        }
    };
    ($dot:ident, $block:ident, $k:ty, $features:literal, lanes = $q4:expr) => {
        #[target_feature(enable = $features)]
        unsafe fn $block(
            w: &[u8],
            row_bytes: usize,
            nrows: usize,
            acts: &[QuantizedActs],
            out: &mut [f32],
            stride: usize,
        ) {
            // Prefill in a function of its own: the decode code stays as it was.
            #[target_feature(enable = $features)]
            #[inline(never)]
            unsafe fn lanes(
                w: &[u8],
                row_bytes: usize,
                nrows: usize,
                acts: &[QuantizedActs],
                out: &mut [f32],
                stride: usize,
            ) {
                kquant_lanes_block::<{ $q4 }>(w, row_bytes, nrows, acts, out, stride)
            }
            if acts.len() > 1 {
                lanes(w, row_bytes, nrows, acts, out, stride)
            } else {
                kquant_block::<$k>(w, row_bytes, nrows, acts, out, stride)
            }
        }

        #[target_feature(enable = $features)]
        unsafe fn $dot(w: &[u8], a: &QuantizedActs) -> f32 {
            let mut out = [0f32];
            kquant_block::<$k>(w, w.len(), 1, core::slice::from_ref(a), &mut out, 1);
            out[0]
        }
    };
}

kquant_entries!(q2_k_avx2, q2_k_block_avx2, Q2K, "avx2,fma,f16c");
kquant_entries!(q3_k_avx2, q3_k_block_avx2, Q3K, "avx2,fma,f16c");
kquant_entries!(q4_k_avx2, q4_k_block_avx2, K4Like<false>, "avx2,fma,f16c");
kquant_entries!(q5_k_avx2, q5_k_block_avx2, K4Like<true>, "avx2,fma,f16c");
kquant_entries!(q6_k_avx2, q6_k_block_avx2, Q6K, "avx2,fma,f16c");
kquant_entries!(
    q2_k_avx512,
    q2_k_block_avx512,
    Q2K,
    "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"
);
kquant_entries!(
    q3_k_avx512,
    q3_k_block_avx512,
    Q3K,
    "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"
);
kquant_entries!(
    q4_k_avx512,
    q4_k_block_avx512,
    K4Like<false>,
    "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c",
    lanes = true
);
kquant_entries!(
    q5_k_avx512,
    q5_k_block_avx512,
    K4Like<true>,
    "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"
);
kquant_entries!(
    q6_k_avx512,
    q6_k_block_avx512,
    Q6K,
    "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c",
    lanes = false
);

/// The AVX2 single-dot and block entry points of a kernel body over f32 activations (synaptix's
/// own types); the single dot is the block body's one-row, one-activation instance.
macro_rules! float_acts_entries {
    ($dot:ident, $block:ident, $body:ident) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $block(
            w: &[u8],
            row_bytes: usize,
            nrows: usize,
            acts: &[QuantizedActs],
            out: &mut [f32],
            stride: usize,
        ) {
            $body(w, row_bytes, nrows, acts, out, stride)
        }

        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $dot(w: &[u8], a: &QuantizedActs) -> f32 {
            let mut out = [0f32];
            $body(w, w.len(), 1, core::slice::from_ref(a), &mut out, 1);
            out[0]
        }
    };
}

// ---------------------------------------------------------------------------------------------
// MXFP8 (synaptix's own type, `quant::mx`): the scalar kernel's eight lane sums a block as one
// 8-lane vector (four multiplies and adds, never fused), its lane tree, then the block term
// added to the row's f32 sum in block order. E4M3 bytes become f32 without a table: the byte's
// exponent and mantissa put under an f32's (`(b & 0x7f) << 20`, which is the value times 2^-120,
// E4M3 subnormals landing on f32 subnormals) times 2^120, the sign moved to bit 31, and the two
// NaN bytes (0x7f, 0xff) replaced by the table's NaN.

/// The 32 weights of one MXFP8 block (its E4M3 bytes at `q`) as four 8-lane vectors.
#[inline(always)]
unsafe fn mxfp8_weights(q: *const u8) -> [__m256; 4] {
    let low = _mm256_set1_epi32(0x7f);
    let up = _mm256_set1_ps(f32::from_bits((127 + 120) << 23));
    let nan = _mm256_set1_ps(f32::NAN);
    // A loop, not `array::from_fn`: a closure would not inherit the caller's target features.
    let mut out = [_mm256_setzero_ps(); 4];
    for (c, o) in out.iter_mut().enumerate() {
        let b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(q.add(8 * c) as *const __m128i));
        let magnitude = _mm256_and_si256(b, low);
        let bits = _mm256_or_si256(
            _mm256_slli_epi32(magnitude, 20),
            _mm256_slli_epi32(_mm256_andnot_si256(low, b), 24),
        );
        let v = _mm256_mul_ps(_mm256_castsi256_ps(bits), up);
        let is_nan = _mm256_castsi256_ps(_mm256_cmpeq_epi32(magnitude, low));
        *o = _mm256_blendv_ps(v, nan, is_nan);
    }
    out
}

/// ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)) of one 8-lane vector.
#[inline(always)]
unsafe fn mxfp8_lane_tree(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)))
}

/// A block type whose float-activation kernel is a lane sum (MXFP8, SYMB4): `decode` gives a
/// block's 8·N weights as N 8-lane vectors in element order, and the block's scale.
trait LaneSumBlock<const N: usize> {
    const BYTES: usize;
    unsafe fn decode(block: &[u8]) -> ([__m256; N], f32);
}

/// The float-activation kernel of a [`LaneSumBlock`] type: each activation row's block term is the
/// eight lanes' sums of the products in element order (0 + p first, as the scalar lanes start: it
/// turns a -0 product into +0; multiplies and adds, never fused), MXFP8's lane tree, times the
/// block's scale, added to the row's f32 sum in block order.
#[inline(always)]
unsafe fn lane_sum_blocks<const N: usize, B: LaneSumBlock<N>>(
    w: &[u8],
    row_bytes: usize,
    nrows: usize,
    acts: &[QuantizedActs],
    out: &mut [f32],
    stride: usize,
) {
    let nb = row_bytes / B::BYTES;
    let mut sums = [0f32; MAX_ACTS];
    assert!(w.len() >= nrows * row_bytes);
    for j in 0..nrows {
        let row = w.as_ptr().add(j * row_bytes);
        for (g, group) in acts.chunks(MAX_ACTS).enumerate() {
            sums[..group.len()].fill(0.0);
            for b in 0..nb {
                let block = core::slice::from_raw_parts(row.add(b * B::BYTES), B::BYTES);
                let (ws, scale) = B::decode(block);
                for (s, a) in sums.iter_mut().zip(group) {
                    let x = a.vals.as_ptr().add(b * 8 * N);
                    let mut lanes = _mm256_add_ps(
                        _mm256_setzero_ps(),
                        _mm256_mul_ps(ws[0], _mm256_loadu_ps(x)),
                    );
                    for (c, wc) in ws.iter().enumerate().skip(1) {
                        lanes =
                            _mm256_add_ps(lanes, _mm256_mul_ps(*wc, _mm256_loadu_ps(x.add(8 * c))));
                    }
                    *s += mxfp8_lane_tree(lanes) * scale;
                }
            }
            for (i, s) in sums[..group.len()].iter().enumerate() {
                out[j * stride + g * MAX_ACTS + i] = *s;
            }
        }
    }
}

struct Mxfp8;
impl LaneSumBlock<4> for Mxfp8 {
    const BYTES: usize = crate::quant::mx::BLOCK_BYTES;
    #[inline(always)]
    unsafe fn decode(block: &[u8]) -> ([__m256; 4], f32) {
        (
            mxfp8_weights(block.as_ptr().add(1)),
            crate::quant::mx::e8m0_value(block[0]),
        )
    }
}

#[inline(always)]
unsafe fn mxfp8_block(
    w: &[u8],
    row_bytes: usize,
    nrows: usize,
    acts: &[QuantizedActs],
    out: &mut [f32],
    stride: usize,
) {
    lane_sum_blocks::<4, Mxfp8>(w, row_bytes, nrows, acts, out, stride)
}

float_acts_entries!(mxfp8_avx2, mxfp8_block_avx2, mxfp8_block);

// ---------------------------------------------------------------------------------------------
// NVFP4 (synaptix's own type, `quant::mx`): the scalar kernel's order, each 16-value micro-block
// as two 8-lane steps. E2M1 codes become f32 by a permute of the eight magnitudes and the sign
// bit moved to bit 31.

/// The 16 values of micro-block `m` of an NVFP4 block (its 8 code bytes at `q`), as two 8-lane
/// vectors in element order.
#[inline(always)]
unsafe fn nvfp4_values(q: *const u8) -> [__m256; 2] {
    let magnitudes = _mm256_setr_ps(0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0);
    let shifts = _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4);
    let mut out = [_mm256_setzero_ps(); 2];
    for (c, o) in out.iter_mut().enumerate() {
        // Bytes 4c .. 4c + 3, each twice: element 2i's code in the low nibble, 2i + 1's high.
        let four = _mm_cvtsi32_si128((q.add(4 * c) as *const i32).read_unaligned());
        let pairs = _mm256_cvtepu8_epi32(_mm_unpacklo_epi8(four, four));
        let code = _mm256_and_si256(_mm256_srlv_epi32(pairs, shifts), _mm256_set1_epi32(15));
        let v = _mm256_permutevar8x32_ps(magnitudes, code);
        let sign = _mm256_slli_epi32(_mm256_and_si256(code, _mm256_set1_epi32(8)), 28);
        *o = _mm256_castsi256_ps(_mm256_or_si256(_mm256_castps_si256(v), sign));
    }
    out
}

#[inline(always)]
unsafe fn nvfp4_block(
    w: &[u8],
    row_bytes: usize,
    nrows: usize,
    acts: &[QuantizedActs],
    out: &mut [f32],
    stride: usize,
) {
    use crate::quant::mx::{e4m3_scale, nvfp4_block_scale, NVFP4_BLOCK_BYTES, NVFP4_QK};
    let nb = row_bytes / NVFP4_BLOCK_BYTES;
    let mut sums = [0f32; MAX_ACTS];
    for j in 0..nrows {
        let row = w.as_ptr().add(j * row_bytes);
        for (g, group) in acts.chunks(MAX_ACTS).enumerate() {
            sums[..group.len()].fill(0.0);
            for b in 0..nb {
                let block = row.add(b * NVFP4_BLOCK_BYTES);
                let ts = nvfp4_block_scale(core::slice::from_raw_parts(block, 4));
                let mut micro = [[_mm256_setzero_ps(); 2]; 4];
                let mut scales = [0f32; 4];
                for m in 0..4 {
                    micro[m] = nvfp4_values(block.add(8 + 8 * m));
                    scales[m] = e4m3_scale(*block.add(4 + m));
                }
                for (s, a) in sums.iter_mut().zip(group) {
                    let x = a.vals.as_ptr().add(b * NVFP4_QK);
                    let mut block_sum = 0f32;
                    for (m, vs) in micro.iter().enumerate() {
                        let xm = x.add(16 * m);
                        // 0 + p first, as the scalar lanes start.
                        let lanes = _mm256_add_ps(
                            _mm256_setzero_ps(),
                            _mm256_mul_ps(vs[0], _mm256_loadu_ps(xm)),
                        );
                        let lanes =
                            _mm256_add_ps(lanes, _mm256_mul_ps(vs[1], _mm256_loadu_ps(xm.add(8))));
                        block_sum += mxfp8_lane_tree(lanes) * scales[m];
                    }
                    *s += block_sum * ts;
                }
            }
            for (i, s) in sums[..group.len()].iter().enumerate() {
                out[j * stride + g * MAX_ACTS + i] = *s;
            }
        }
    }
}

float_acts_entries!(nvfp4_avx2, nvfp4_block_avx2, nvfp4_block);

// ---------------------------------------------------------------------------------------------
// SYMB4 (`.symb`'s INT4 groups, `quant::symb`): the scalar kernel's eight lane sums a block as
// one 8-lane vector over sixteen steps (multiplies and adds, never fused), MXFP8's lane tree,
// then the block term added in block order. Eight codes come from four bytes: the word
// broadcast to every lane and shifted right by 4, 0, 12, 8, ... (high nibble first).

struct Symb4;
impl LaneSumBlock<{ crate::quant::symb::QK / 8 }> for Symb4 {
    const BYTES: usize = crate::quant::symb::BLOCK_BYTES;
    #[inline(always)]
    unsafe fn decode(block: &[u8]) -> ([__m256; crate::quant::symb::QK / 8], f32) {
        let shifts = _mm256_setr_epi32(4, 0, 12, 8, 20, 16, 28, 24);
        let mut ws = [_mm256_setzero_ps(); crate::quant::symb::QK / 8];
        for (c, wc) in ws.iter_mut().enumerate() {
            let word = u32::from_le_bytes([
                block[4 + 4 * c],
                block[5 + 4 * c],
                block[6 + 4 * c],
                block[7 + 4 * c],
            ]);
            let codes = _mm256_and_si256(
                _mm256_srlv_epi32(_mm256_set1_epi32(word as i32), shifts),
                _mm256_set1_epi32(0x0f),
            );
            *wc = _mm256_cvtepi32_ps(_mm256_sub_epi32(codes, _mm256_set1_epi32(8)));
        }
        (ws, crate::quant::symb::block_scale(block))
    }
}

#[inline(always)]
unsafe fn symb4_block(
    w: &[u8],
    row_bytes: usize,
    nrows: usize,
    acts: &[QuantizedActs],
    out: &mut [f32],
    stride: usize,
) {
    lane_sum_blocks::<{ crate::quant::symb::QK / 8 }, Symb4>(w, row_bytes, nrows, acts, out, stride)
}

float_acts_entries!(symb4_avx2, symb4_block_avx2, symb4_block);

// ---------------------------------------------------------------------------------------------
// IQ4_NL / IQ4_XS (`quant::iquants`): a 32-code block becomes its 32 table values by `pshufb`
// from the 16-entry table, the signed products with the int8 activations by `maddubs` of
// |w| with a·sign(w) (|w| ≤ 127, so no pair saturates), summed exactly to one i32; the float
// terms are the scalar kernel's, in block order.

/// One block's 32 table values as (|w|, w) for `maddubs`.
#[inline(always)]
unsafe fn iq4_weights(table: __m128i, codes: *const u8) -> (__m256i, __m256i) {
    let q = _mm_loadu_si128(codes as *const __m128i);
    let nib = _mm_set1_epi8(0x0f);
    let lo = _mm_shuffle_epi8(table, _mm_and_si128(q, nib));
    let hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(q, 4), nib));
    let w = _mm256_set_m128i(hi, lo);
    (_mm256_sign_epi8(w, w), w)
}

/// Σ a_j · w_j of one block from [`iq4_weights`] and 32 activations at `a`.
#[inline(always)]
unsafe fn iq4_block_sum((abs_w, w): (__m256i, __m256i), a: *const i8) -> i32 {
    let av = _mm256_loadu_si256(a as *const __m256i);
    let p = _mm256_maddubs_epi16(abs_w, _mm256_sign_epi8(av, w));
    hsum_i32(_mm256_madd_epi16(p, _mm256_set1_epi16(1)))
}

#[inline(always)]
unsafe fn iq4_table() -> __m128i {
    use crate::quant::iquants::IQ4NL_VALUES;
    _mm_loadu_si128(IQ4NL_VALUES.as_ptr() as *const __m128i)
}

/// Both IQ4 types: each row's blocks decoded once for a group of up to [`MAX_ACTS`] activation
/// rows; `XS` selects IQ4_XS's super-blocks of eight scaled sub-blocks.
#[inline(always)]
unsafe fn iq4_block<const XS: bool>(
    w: &[u8],
    row_bytes: usize,
    nrows: usize,
    acts: &[QuantizedActs],
    out: &mut [f32],
    stride: usize,
) {
    use crate::quant::iquants::{iq4_xs_scale, IQ4NL_BYTES, IQ4XS_BYTES};
    let table = iq4_table();
    let bb = if XS { IQ4XS_BYTES } else { IQ4NL_BYTES };
    let nb = row_bytes / bb;
    if let [a] = acts {
        // One activation row (decode): the running sum stays in a register.
        for j in 0..nrows {
            let row = &w[j * row_bytes..(j + 1) * row_bytes];
            let mut sum = 0f32;
            for b in 0..nb {
                let blk = &row[b * bb..(b + 1) * bb];
                let dw = read_f16(blk, 0);
                if XS {
                    let d4d8 = dw * a.d[b];
                    for ib in 0..QK_K / QK {
                        let ws = iq4_weights(table, blk.as_ptr().add(8 + 16 * ib));
                        let isum = iq4_block_sum(ws, a.qs.as_ptr().add(QK_K * b + QK * ib));
                        sum += (d4d8 * iq4_xs_scale(blk, ib) as f32) * isum as f32;
                    }
                } else {
                    let ws = iq4_weights(table, blk.as_ptr().add(2));
                    let isum = iq4_block_sum(ws, a.qs.as_ptr().add(QK * b));
                    sum += (a.d[b] * dw) * isum as f32;
                }
            }
            out[j * stride] = sum;
        }
        return;
    }
    let mut sums = [0f32; MAX_ACTS];
    for j in 0..nrows {
        let row = &w[j * row_bytes..(j + 1) * row_bytes];
        for (g, group) in acts.chunks(MAX_ACTS).enumerate() {
            sums[..group.len()].fill(0.0);
            for b in 0..nb {
                let blk = &row[b * bb..(b + 1) * bb];
                let dw = read_f16(blk, 0);
                if XS {
                    for ib in 0..QK_K / QK {
                        let ws = iq4_weights(table, blk.as_ptr().add(8 + 16 * ib));
                        let ls = iq4_xs_scale(blk, ib) as f32;
                        for (s, a) in sums.iter_mut().zip(group) {
                            let isum = iq4_block_sum(ws, a.qs.as_ptr().add(QK_K * b + QK * ib));
                            *s += (dw * a.d[b] * ls) * isum as f32;
                        }
                    }
                } else {
                    let ws = iq4_weights(table, blk.as_ptr().add(2));
                    for (s, a) in sums.iter_mut().zip(group) {
                        let isum = iq4_block_sum(ws, a.qs.as_ptr().add(QK * b));
                        *s += (a.d[b] * dw) * isum as f32;
                    }
                }
            }
            for (i, s) in sums[..group.len()].iter().enumerate() {
                out[j * stride + g * MAX_ACTS + i] = *s;
            }
        }
    }
}

#[inline(always)]
unsafe fn iq4_nl_block(
    w: &[u8],
    row_bytes: usize,
    nrows: usize,
    acts: &[QuantizedActs],
    out: &mut [f32],
    stride: usize,
) {
    iq4_block::<false>(w, row_bytes, nrows, acts, out, stride)
}

#[inline(always)]
unsafe fn iq4_xs_block(
    w: &[u8],
    row_bytes: usize,
    nrows: usize,
    acts: &[QuantizedActs],
    out: &mut [f32],
    stride: usize,
) {
    iq4_block::<true>(w, row_bytes, nrows, acts, out, stride)
}

float_acts_entries!(iq4_nl_avx2, iq4_nl_block_avx2, iq4_nl_block);
float_acts_entries!(iq4_xs_avx2, iq4_xs_block_avx2, iq4_xs_block);

// ---------------------------------------------------------------------------------------------
// SQ1 .. SQ8 (synaptix's own types, `quant::sq`): the scalar kernel's lane sums (`Σ q·x` and
// `Σ x`, element i to lane i mod 8) as 8-lane vectors, its trees and terms. A sub-block's codes
// come from its bit-planes by shifting each broadcast plane right by the lanes' element indices.

/// The 32 codes of one sub-block (its `bits` planes at `planes`) as four 8-lane f32 vectors.
#[inline(always)]
unsafe fn sq_codes(planes: *const u8, bits: usize) -> [__m256; 4] {
    let one = _mm256_set1_epi32(1);
    let mut out = [_mm256_setzero_ps(); 4];
    for (c, o) in out.iter_mut().enumerate() {
        let shifts = _mm256_add_epi32(
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
            _mm256_set1_epi32(8 * c as i32),
        );
        let mut q = _mm256_setzero_si256();
        for j in 0..bits {
            let word = _mm256_set1_epi32((planes.add(4 * j) as *const i32).read_unaligned());
            let bit = _mm256_and_si256(_mm256_srlv_epi32(word, shifts), one);
            q = _mm256_or_si256(q, _mm256_sllv_epi32(bit, _mm256_set1_epi32(j as i32)));
        }
        *o = _mm256_cvtepi32_ps(q);
    }
    out
}

#[inline(always)]
unsafe fn sq_block<const BITS: usize>(
    w: &[u8],
    row_bytes: usize,
    nrows: usize,
    acts: &[QuantizedActs],
    out: &mut [f32],
    stride: usize,
) {
    use crate::quant::float::read_f16;
    use crate::quant::sq::{block_bytes, HEADER, QK as SQ_QK, SUB};
    let bb = block_bytes(BITS);
    let nb = row_bytes / bb;
    let mut sums = [0f32; MAX_ACTS];
    for j in 0..nrows {
        let row = &w[j * row_bytes..(j + 1) * row_bytes];
        for (g, group) in acts.chunks(MAX_ACTS).enumerate() {
            sums[..group.len()].fill(0.0);
            for b in 0..nb {
                let block = &row[b * bb..(b + 1) * bb];
                let d = read_f16(block, 0);
                let dmin = read_f16(block, 2);
                for s in 0..8 {
                    let q = sq_codes(block.as_ptr().add(HEADER + 4 * BITS * s), BITS);
                    let a_s = d * block[4 + s] as f32;
                    let m_s = dmin * block[12 + s] as f32;
                    for (sum, a) in sums.iter_mut().zip(group) {
                        let x = a.vals.as_ptr().add(b * SQ_QK + s * SUB);
                        let x0 = _mm256_loadu_ps(x);
                        // 0 + first, as the scalar lanes start.
                        let mut qx = _mm256_add_ps(_mm256_setzero_ps(), _mm256_mul_ps(q[0], x0));
                        let mut sx = _mm256_add_ps(_mm256_setzero_ps(), x0);
                        for (c, qc) in q.iter().enumerate().skip(1) {
                            let xc = _mm256_loadu_ps(x.add(8 * c));
                            qx = _mm256_add_ps(qx, _mm256_mul_ps(*qc, xc));
                            sx = _mm256_add_ps(sx, xc);
                        }
                        *sum += a_s * mxfp8_lane_tree(qx) - m_s * mxfp8_lane_tree(sx);
                    }
                }
            }
            for (i, s) in sums[..group.len()].iter().enumerate() {
                out[j * stride + g * MAX_ACTS + i] = *s;
            }
        }
    }
}

macro_rules! sq_entries {
    ($($bits:literal: $dot:ident, $block:ident, $body:ident;)*) => {
        $(
            #[inline(always)]
            unsafe fn $body(
                w: &[u8],
                row_bytes: usize,
                nrows: usize,
                acts: &[QuantizedActs],
                out: &mut [f32],
                stride: usize,
            ) {
                sq_block::<$bits>(w, row_bytes, nrows, acts, out, stride)
            }
            float_acts_entries!($dot, $block, $body);
        )*
    };
}

sq_entries! {
    1: sq1_avx2, sq1_block_avx2, sq1_body;
    2: sq2_avx2, sq2_block_avx2, sq2_body;
    3: sq3_avx2, sq3_block_avx2, sq3_body;
    4: sq4_avx2, sq4_block_avx2, sq4_body;
    5: sq5_avx2, sq5_block_avx2, sq5_body;
    6: sq6_avx2, sq6_block_avx2, sq6_body;
    7: sq7_avx2, sq7_block_avx2, sq7_body;
    8: sq8_avx2, sq8_block_avx2, sq8_body;
}
