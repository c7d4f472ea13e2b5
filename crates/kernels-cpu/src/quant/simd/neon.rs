//! aarch64 kernels: NEON (Advanced SIMD, present on every aarch64 CPU) for every supported
//! weight type, `ops::dot` and the activation quantizers, plus the Armv8.2 dot-product
//! instruction `sdot` for the 32-element block types and Q2_K where the CPU has it (run-time
//! detection; both forms give identical results).
//!
//! Shared bodies are `#[inline(always)]` helpers instantiated inside `#[target_feature]` entry
//! points; a `const DOT: bool` parameter selects `sdot` for the 8-bit products, otherwise
//! widening multiplies (`smull` / `smlal` into i16, pairwise-added into i32) that are baseline
//! NEON. `vdotq_s32` is not stable in Rust yet, so [`sdot`] issues the instruction with `asm!`,
//! and the half <-> f32 conversions (`fcvtl` / `fcvtn`, baseline AArch64) likewise.
//!
//! Every kernel performs the float operations of ggml's portable code (see the scalar kernels)
//! in the same order, with separate multiplies and adds (never fused, except where the scalar
//! reference itself fuses: `ops::dot`); only exact integer work is reorganised:
//! - F32 / F16 / BF16: the f64 running sum of one row is serial, so the block kernel runs eight
//!   weight rows at once, two rows per `float64x2_t` (single dots use the scalar kernel);
//! - 32-element block types: weight quants unpacked to signed bytes (`q - 8`, `q - 16`, or as
//!   stored), so one block's integer sum is Σ w * a directly; four blocks' sums at a time, their
//!   float terms (`legacy::block_term`) formed lane-wise, then added to the running f32 sum one
//!   by one in block order;
//! - k-quants: ggml's eight lane sums (`aux32`, lane = element index mod 8). A 16-byte vector
//!   starts at an element index that is a multiple of 16, so its bytes `i` and `i + 8` are
//!   both ggml lane `i % 8`: `smull` of the low eight bytes plus `smlal2` of the high eight give
//!   one i16 vector with lane `l` holding that lane's products, which `smlal` with the
//!   sub-block scale widens into two i32 vectors (lanes 0..4, 4..8); then
//!   `sums[l] += d * lane[l]` as two 4-lane f32 operations. (`sdot` would add four adjacent
//!   products, mixing lanes, except for Q2_K, whose integer sum is a single one.)
//!
//! Bounds that keep the i16 accumulations exact for any activation byte (-128..=127): Q4_0 /
//! Q5_0 / Q4_1 / Q5_1 take four products per i16 lane (|w| <= 31: 4 * 31 * 128 < 2^15), Q8_0
//! one (then pairwise-added), Q4_K / Q5_K four (4 * 31 * 128), Q2_K / Q3_K / Q6_K two
//! (2 * 32 * 128).

use core::arch::aarch64::*;
use core::arch::asm;

use synaptix_core::DType;

use super::FloatDotFn;
use crate::cpu::{cpu_features, Path};
use crate::quant::float::{self, accumulate_tail, reduce32, FLOAT_LANES};
use crate::quant::kquants::{self, QK_K};
use crate::quant::legacy::{self, Kind, QK};
use crate::quant::{BlockFn, DotFn, QuantizedActs};

/// Activation rows one pass of a block kernel keeps running state for.
const MAX_ACTS: usize = 16;

/// The SIMD single-dot and block kernels for `dtype` on `path` (either may be absent: the
/// scalar dot and the generic block loop serve then).
pub(crate) fn kernels(dtype: DType, path: Path) -> (Option<DotFn>, Option<BlockFn>) {
    match path {
        Path::Scalar => (None, None),
        Path::Neon => kernels_neon(dtype, cpu_features().dotprod),
    }
}

/// The NEON kernels for `dtype`, with `sdot` (`dotprod`: the CPU must have it) or without.
pub(crate) fn kernels_neon(dtype: DType, dotprod: bool) -> (Option<DotFn>, Option<BlockFn>) {
    let (dot, block): (DotFn, BlockFn) = match (dtype, dotprod) {
        // Float single dots are a serial f64 chain: the scalar kernel. Their block kernel runs
        // eight rows side by side.
        (DType::F32, _) => return (None, Some(f32_block_neon)),
        (DType::F16, _) => return (None, Some(f16_block_neon)),
        (DType::BF16, _) => return (None, Some(bf16_block_neon)),
        (DType::Q4_0, true) => (q4_0_sdot, q4_0_block_sdot),
        (DType::Q5_0, true) => (q5_0_sdot, q5_0_block_sdot),
        (DType::Q8_0, true) => (q8_0_sdot, q8_0_block_sdot),
        (DType::Q4_1, true) => (q4_1_sdot, q4_1_block_sdot),
        (DType::Q5_1, true) => (q5_1_sdot, q5_1_block_sdot),
        (DType::Q2K, true) => (q2_k_sdot, q2_k_block_sdot),
        (DType::Q4_0, false) => (q4_0_neon, q4_0_block_neon),
        (DType::Q5_0, false) => (q5_0_neon, q5_0_block_neon),
        (DType::Q8_0, false) => (q8_0_neon, q8_0_block_neon),
        (DType::Q4_1, false) => (q4_1_neon, q4_1_block_neon),
        (DType::Q5_1, false) => (q5_1_neon, q5_1_block_neon),
        (DType::Q2K, false) => (q2_k_neon, q2_k_block_neon),
        (DType::Q3K, _) => (q3_k_neon, q3_k_block_neon),
        (DType::Q4K, _) => (q4_k_neon, q4_k_block_neon),
        (DType::Q5K, _) => (q5_k_neon, q5_k_block_neon),
        (DType::Q6K, _) => (q6_k_neon, q6_k_block_neon),
        _ => return (None, None),
    };
    (Some(dot), Some(block))
}

pub(crate) fn f32_dot(path: Path) -> Option<FloatDotFn> {
    match path {
        Path::Scalar => None,
        Path::Neon => Some(f32_neon),
    }
}

// ---------------------------------------------------------------------------------------------
// Instructions without a stable intrinsic.

/// `sdot`: lane `i` of the result is `acc[i] + Σ_{k<4} w[4i + k] * a[4i + k]` (i8 products,
/// exact). Inlined into the `dotprod` entry points; the `DOT = false` instances never call it.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn sdot(acc: int32x4_t, w: int8x16_t, a: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    asm!(
        "sdot {acc:v}.4s, {w:v}.16b, {a:v}.16b",
        acc = inout(vreg) acc,
        w = in(vreg) w,
        a = in(vreg) a,
        options(pure, nomem, nostack, preserves_flags)
    );
    acc
}

/// Four IEEE halves (bits) to f32 with `fcvtl`: exact; NaN payloads kept with the quiet bit
/// set, like `float::f16_to_f32`.
#[inline(always)]
unsafe fn widen_f16x4(h: uint16x4_t) -> float32x4_t {
    let out: float32x4_t;
    asm!(
        "fcvtl {out:v}.4s, {h:v}.4h",
        out = lateout(vreg) out,
        h = in(vreg) h,
        options(pure, nomem, nostack, preserves_flags)
    );
    out
}

/// Four f32 to IEEE halves (bits) with `fcvtn`: round to nearest even (the default rounding
/// mode), overflow to infinity, gradual underflow: `float::f32_to_f16` for every non-NaN value.
#[inline(always)]
unsafe fn narrow_f16x4(v: float32x4_t) -> uint16x4_t {
    let out: uint16x4_t;
    asm!(
        "fcvtn {out:v}.4h, {v:v}.4s",
        out = lateout(vreg) out,
        v = in(vreg) v,
        options(pure, nomem, nostack, preserves_flags)
    );
    out
}

/// The half at `p` (little-endian, unaligned), as bits.
#[inline(always)]
unsafe fn half_bits(p: *const u8) -> u16 {
    (p as *const u16).read_unaligned()
}

/// The four halves at `p`, `p + step`, `p + 2 * step`, `p + 3 * step`, widened.
#[inline(always)]
unsafe fn halves4(p: *const u8, step: usize) -> float32x4_t {
    let h = [
        half_bits(p),
        half_bits(p.add(step)),
        half_bits(p.add(2 * step)),
        half_bits(p.add(3 * step)),
    ];
    widen_f16x4(vld1_u16(h.as_ptr()))
}

// ---------------------------------------------------------------------------------------------
// Activation quantization.

/// NEON activation quantizers. Same IEEE operations as the portable ones (`x * id` in f32,
/// rounding half away from zero for Q8_0 / Q8_1 (`fcvtas`) and half to even for Q8_K
/// (`fcvtns`), half rounding to nearest even), so identical results; blocks with non-finite
/// values take the portable code.
///
/// # Safety
/// The CPU must have NEON (every aarch64 CPU does); `a` must be allocated for `x` (as
/// `quantize_acts_on` does).
#[target_feature(enable = "neon")]
pub(crate) unsafe fn fill_acts_neon(x: &[f32], a: &mut QuantizedActs) {
    match a.dtype {
        DType::F16 => round_f16_neon(x, a),
        DType::Q8_0 | DType::Q8_1 => quantize_q8_neon(x, a),
        DType::Q8K => quantize_q8_k_neon(x, a),
        _ => crate::quant::fill_acts_portable(x, a),
    }
}

#[inline(always)]
unsafe fn round_f16_neon(x: &[f32], a: &mut QuantizedActs) {
    let n = x.len().min(a.vals.len());
    let (xp, vp) = (x.as_ptr(), a.vals.as_mut_ptr());
    let mut i = 0;
    while i + 4 <= n {
        let v = vld1q_f32(xp.add(i));
        // ggml turns NaN into 0x7e00 (with the sign); the instruction keeps payload bits.
        if vminvq_u32(vceqq_f32(v, v)) == 0 {
            break;
        }
        vst1q_f32(vp.add(i), widen_f16x4(narrow_f16x4(v)));
        i += 4;
    }
    for (v, &xv) in a.vals[i..n].iter_mut().zip(&x[i..n]) {
        *v = float::f16_to_f32(float::f32_to_f16(xv));
    }
}

/// Largest |x| of the `n` (a multiple of 16) values at `p`; NaN if any is NaN (`fmax`
/// propagates it), infinite if any is infinite.
#[inline(always)]
unsafe fn abs_max(p: *const f32, n: usize) -> f32 {
    let mut m = [vdupq_n_f32(0.0); 4];
    for j in (0..n).step_by(16) {
        for (r, mr) in m.iter_mut().enumerate() {
            *mr = vmaxq_f32(*mr, vabsq_f32(vld1q_f32(p.add(j + 4 * r))));
        }
    }
    vmaxvq_f32(vmaxq_f32(vmaxq_f32(m[0], m[1]), vmaxq_f32(m[2], m[3])))
}

/// The 16 values at `x`, times `scale`, rounded to i32 (ties away from zero when `AWAY`, else
/// to even) and narrowed to i8 (the callers' values are within ±127.5, so the saturating
/// narrowings never saturate).
#[inline(always)]
unsafe fn scale_round_16<const AWAY: bool>(x: *const f32, scale: float32x4_t) -> int8x16_t {
    let mut i = [vdupq_n_s32(0); 4];
    for (r, ir) in i.iter_mut().enumerate() {
        let v = vmulq_f32(vld1q_f32(x.add(4 * r)), scale);
        // fcvtas: to nearest, ties away from zero (C's roundf); fcvtns: ties to even.
        *ir = if AWAY {
            vcvtaq_s32_f32(v)
        } else {
            vcvtnq_s32_f32(v)
        };
    }
    let lo = vcombine_s16(vqmovn_s32(i[0]), vqmovn_s32(i[1]));
    let hi = vcombine_s16(vqmovn_s32(i[2]), vqmovn_s32(i[3]));
    vcombine_s8(vqmovn_s16(lo), vqmovn_s16(hi))
}

/// Q8_0 / Q8_1 blocks of 32; see `legacy::quantize_q8_block`.
#[inline(always)]
unsafe fn quantize_q8_neon(x: &[f32], a: &mut QuantizedActs) {
    let nb = (x.len() / QK).min(a.d.len());
    for b in 0..nb {
        let xp = x.as_ptr().add(b * QK);
        let amax = abs_max(xp, QK);
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        if !amax.is_finite() || !id.is_finite() {
            // C's conversions decide the quants: the scalar code.
            legacy::quantize_q8_block(&x[b * QK..(b + 1) * QK], a, b);
            continue;
        }
        let q = a.qs.as_mut_ptr().add(b * QK);
        let idv = vdupq_n_f32(id);
        let q0 = scale_round_16::<true>(xp, idv);
        let q1 = scale_round_16::<true>(xp.add(16), idv);
        vst1q_s8(q, q0);
        vst1q_s8(q.add(16), q1);
        let sum = vaddlvq_s8(q0) as i32 + vaddlvq_s8(q1) as i32;
        legacy::set_q8_block_scales(a, b, d, sum);
    }
}

/// Table index taking 16 bytes to pair order: `i` to `2i`, `i + 8` to `2i + 1`.
const PAIR_ORDER: [u8; 16] = [0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15];

/// Q8_K blocks of 256; see `kquants::quantize_q8_k`.
#[inline(always)]
unsafe fn quantize_q8_k_neon(x: &[f32], a: &mut QuantizedActs) {
    let nb = (x.len() / QK_K).min(a.d.len());
    for b in 0..nb {
        let xb = &x[b * QK_K..(b + 1) * QK_K];
        let amax = abs_max(xb.as_ptr(), QK_K);
        let max = xb.iter().copied().find(|v| v.abs() == amax).unwrap_or(amax);
        let iscale = -127.0 / max;
        if amax == 0.0 || !amax.is_finite() || !iscale.is_finite() {
            // All zero, or C's conversions decide the quants: the scalar code.
            kquants::quantize_q8_k_block(xb, a, b);
        } else {
            let q = a.qs.as_mut_ptr().add(b * QK_K);
            let sv = vdupq_n_f32(iscale);
            for g in 0..QK_K / 16 {
                let qg = scale_round_16::<false>(xb.as_ptr().add(16 * g), sv);
                vst1q_s8(q.add(16 * g), qg);
                a.bsums[b * 16 + g] = vaddlvq_s8(qg);
            }
            a.d[b] = 1.0 / iscale;
        }
        fill_pair_order_block(a, b);
    }
}

/// `a.pq` / `a.pq_abs` of super-block `b` from `a.qs`.
#[inline(always)]
unsafe fn fill_pair_order_block(a: &mut QuantizedActs, b: usize) {
    let order = vld1q_u8(PAIR_ORDER.as_ptr());
    for g in 0..QK_K / 16 {
        let at = b * QK_K + 16 * g;
        let p = vqtbl1q_s8(vld1q_s8(a.qs.as_ptr().add(at)), order);
        vst1q_s8(a.pq.as_mut_ptr().add(at), p);
        // |-128| wraps to 0x80, as `i8::unsigned_abs` gives 128.
        vst1q_u8(
            a.pq_abs.as_mut_ptr().add(at),
            vreinterpretq_u8_s8(vabsq_s8(p)),
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
        W_F16 => float::read_f16(w, 2 * i),
        _ => float::bf16_to_f32(float::read_u16(w, 2 * i)),
    }
}

/// 4 weights starting at element `i` of the row at `w`, widened to f32.
#[inline(always)]
unsafe fn load4<const W: u8>(w: *const u8, i: usize) -> float32x4_t {
    match W {
        W_F32 => vld1q_f32(w.add(4 * i) as *const f32),
        W_F16 => widen_f16x4(vld1_u16(w.add(2 * i) as *const u16)),
        _ => vreinterpretq_f32_u32(vshll_n_u16::<16>(vld1_u16(w.add(2 * i) as *const u16))),
    }
}

/// Weight rows [`float_rows`] runs at once: two per f64 accumulator.
const FLOAT_ROWS: usize = 8;

/// ggml's float dot (f32 products, serial f64 sum) of [`FLOAT_ROWS`] weight rows `rows[r]` with
/// `a` at once, rows `2p` and `2p + 1` in the two f64 lanes of accumulator `p`: each lane sees
/// exactly the additions of the scalar kernel, in order.
#[inline(always)]
unsafe fn float_rows<const W: u8>(rows: &[&[u8]; FLOAT_ROWS], a: &[f32]) -> [f32; FLOAT_ROWS] {
    let n = a.len();
    let ap = a.as_ptr();
    let mut acc = [vdupq_n_f64(0.0); FLOAT_ROWS / 2];
    let mut i = 0;
    while i + 4 <= n {
        let x = vld1q_f32(ap.add(i));
        for (p, accp) in acc.iter_mut().enumerate() {
            let p0 = vmulq_f32(load4::<W>(rows[2 * p].as_ptr(), i), x);
            let p1 = vmulq_f32(load4::<W>(rows[2 * p + 1].as_ptr(), i), x);
            // Element pairs (row 2p, row 2p + 1): columns 0, 1 in `z01`, columns 2, 3 in `z23`.
            let z01 = vzip1q_f32(p0, p1);
            let z23 = vzip2q_f32(p0, p1);
            *accp = vaddq_f64(*accp, vcvt_f64_f32(vget_low_f32(z01)));
            *accp = vaddq_f64(*accp, vcvt_high_f64_f32(z01));
            *accp = vaddq_f64(*accp, vcvt_f64_f32(vget_low_f32(z23)));
            *accp = vaddq_f64(*accp, vcvt_high_f64_f32(z23));
        }
        i += 4;
    }
    let mut sums = [0f64; FLOAT_ROWS];
    for (p, accp) in acc.iter().enumerate() {
        vst1q_f64(sums.as_mut_ptr().add(2 * p), *accp);
    }
    let mut out = [0f32; FLOAT_ROWS];
    for (r, (o, &sum)) in out.iter_mut().zip(&sums).enumerate() {
        let row = rows[r];
        *o = float::dot_f64_serial_from(sum, i, a, |j| weight_at::<W>(row, j)) as f32;
    }
    out
}

/// Block kernel for float weights: groups of [`FLOAT_ROWS`] rows through [`float_rows`] (a last
/// partial group repeats its first row in the unused lanes), every activation row per group.
#[inline(always)]
unsafe fn float_block<const W: u8>(
    w: &[u8],
    row_bytes: usize,
    nrows: usize,
    acts: &[QuantizedActs],
    out: &mut [f32],
    stride: usize,
) {
    for r0 in (0..nrows).step_by(FLOAT_ROWS) {
        let g = (nrows - r0).min(FLOAT_ROWS);
        let mut rows = [&w[..0]; FLOAT_ROWS];
        for (r, row) in rows.iter_mut().enumerate() {
            let r = r0 + if r < g { r } else { 0 };
            *row = &w[r * row_bytes..(r + 1) * row_bytes];
        }
        for (i, a) in acts.iter().enumerate() {
            let res = float_rows::<W>(&rows, &a.vals);
            for (r, &v) in res.iter().enumerate().take(g) {
                out[(r0 + r) * stride + i] = v;
            }
        }
    }
}

macro_rules! float_block_entry {
    ($name:ident, $w:expr) => {
        #[target_feature(enable = "neon")]
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

float_block_entry!(f32_block_neon, W_F32);
float_block_entry!(f16_block_neon, W_F16);
float_block_entry!(bf16_block_neon, W_BF16);

/// `ops::dot`'s f32 × f32 dot: 32 lanes (8 × 4-lane fused multiply-add accumulators; element
/// `i` in lane `i % 32`), then `reduce32`.
#[target_feature(enable = "neon")]
unsafe fn f32_neon(w: &[u8], a: &[f32]) -> f32 {
    let n = a.len();
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let mut acc = [vdupq_n_f32(0.0); FLOAT_LANES / 4];
    let mut i = 0;
    while i + FLOAT_LANES <= n {
        for (r, accr) in acc.iter_mut().enumerate() {
            let x = vld1q_f32(ap.add(i + 4 * r));
            // fmla: acc + w * x with one rounding, as `f32::mul_add`.
            *accr = vfmaq_f32(*accr, load4::<W_F32>(wp, i + 4 * r), x);
        }
        i += FLOAT_LANES;
    }
    let mut lanes = [0f32; FLOAT_LANES];
    for (r, accr) in acc.iter().enumerate() {
        vst1q_f32(lanes.as_mut_ptr().add(4 * r), *accr);
    }
    accumulate_tail(&mut lanes, i, a, |j| weight_at::<W_F32>(w, j));
    reduce32(&lanes)
}

// ---------------------------------------------------------------------------------------------
// Q4_0 / Q5_0 / Q8_0 × Q8_0 and Q4_1 / Q5_1 × Q8_1.

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

/// Offsets of a 4/5-bit block's `qs` and `qh` fields (`qh`: 0 for 4-bit types).
const fn nibble_fields(kind: u8) -> (usize, usize) {
    match kind {
        KIND_Q4_0 => (2, 0),
        KIND_Q5_0 => (6, 2),
        KIND_Q4_1 => (4, 0),
        _ => (8, 4),
    }
}

/// The weight quant offset subtracted from the unsigned quant (0: none).
const fn quant_offset(kind: u8) -> u8 {
    match kind {
        KIND_Q4_0 => 8,
        KIND_Q5_0 => 16,
        _ => 0,
    }
}

/// Bit `i % 8` of each byte `i` of a 16-byte vector (to test bit `i` of 16 spread bits).
const BIT_OF_BYTE: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];

/// Byte `i` = 0x10 where bit `i` of the 16 bits `bits` is set, else 0.
#[inline(always)]
unsafe fn bits_to_0x10(bits: u32) -> uint8x16_t {
    // Bytes 0..8 hold the low byte of `bits`, bytes 8..16 the high one.
    let spread = vcombine_u8(vdup_n_u8(bits as u8), vdup_n_u8((bits >> 8) as u8));
    let set = vtstq_u8(spread, vld1q_u8(BIT_OF_BYTE.as_ptr()));
    vandq_u8(set, vdupq_n_u8(0x10))
}

/// The 32 signed weight quants of the block at `blk` in element order (elements 0..16,
/// 16..32): `q - 8` (Q4_0), `q - 16` (Q5_0), `q` (Q8_0, Q4_1 0..16, Q5_1 0..32), so that the
/// block's integer sum is Σ w * a, as the scalar `isum_*` functions compute it.
#[inline(always)]
unsafe fn unpack_legacy<const KIND: u8>(blk: *const u8) -> [int8x16_t; 2] {
    if KIND == KIND_Q8_0 {
        return [
            vld1q_s8(blk.add(2) as *const i8),
            vld1q_s8(blk.add(18) as *const i8),
        ];
    }
    let (qs, qh) = nibble_fields(KIND);
    let q = vld1q_u8(blk.add(qs));
    let mut lo = vandq_u8(q, vdupq_n_u8(0x0f));
    let mut hi = vshrq_n_u8::<4>(q);
    if qh > 0 {
        // The 5th bit of element j is bit j of `qh`.
        let bits = (blk.add(qh) as *const u32).read_unaligned();
        lo = vorrq_u8(lo, bits_to_0x10(bits & 0xffff));
        hi = vorrq_u8(hi, bits_to_0x10(bits >> 16));
    }
    // Two's complement: the wrapping byte subtraction gives the signed value.
    let off = vdupq_n_u8(quant_offset(KIND));
    [
        vreinterpretq_s8_u8(vsubq_u8(lo, off)),
        vreinterpretq_s8_u8(vsubq_u8(hi, off)),
    ]
}

/// Four i32 lanes summing to Σ w * a over one block (`w` from [`unpack_legacy`], the 32
/// activation quants at `q`).
#[inline(always)]
unsafe fn block_products<const KIND: u8, const DOT: bool>(
    w: &[int8x16_t; 2],
    q: *const i8,
) -> int32x4_t {
    let a0 = vld1q_s8(q);
    let a1 = vld1q_s8(q.add(16));
    if DOT {
        return sdot(sdot(vdupq_n_s32(0), w[0], a0), w[1], a1);
    }
    if KIND == KIND_Q8_0 {
        // |w * a| <= 2^14: each product vector is widened on its own.
        let mut acc = vpaddlq_s16(vmull_s8(vget_low_s8(w[0]), vget_low_s8(a0)));
        acc = vpadalq_s16(acc, vmull_high_s8(w[0], a0));
        acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(w[1]), vget_low_s8(a1)));
        vpadalq_s16(acc, vmull_high_s8(w[1], a1))
    } else {
        // |w| <= 31: four products per i16 lane stay below 2^15.
        let mut p = vmull_s8(vget_low_s8(w[0]), vget_low_s8(a0));
        p = vmlal_high_s8(p, w[0], a0);
        p = vmlal_s8(p, vget_low_s8(w[1]), vget_low_s8(a1));
        p = vmlal_high_s8(p, w[1], a1);
        vpaddlq_s16(p)
    }
}

/// Blocks a legacy kernel unpacks and reduces together.
const GROUP: usize = 4;

/// The float terms of blocks `b0..b0 + 4` with activation row `a`: `w` the weight blocks
/// unpacked by [`unpack_legacy`], `dw` / `mw` their half scales and minimums widened.
#[inline(always)]
unsafe fn group_terms<const KIND: u8, const DOT: bool>(
    w: &[[int8x16_t; 2]; GROUP],
    (dw, mw): (float32x4_t, float32x4_t),
    a: &QuantizedActs,
    b0: usize,
) -> float32x4_t {
    let qp = a.qs.as_ptr().add(b0 * QK);
    let v = [
        block_products::<KIND, DOT>(&w[0], qp),
        block_products::<KIND, DOT>(&w[1], qp.add(QK)),
        block_products::<KIND, DOT>(&w[2], qp.add(2 * QK)),
        block_products::<KIND, DOT>(&w[3], qp.add(3 * QK)),
    ];
    // Lane j: the whole sum of v[j].
    let isum = vpaddq_s32(vpaddq_s32(v[0], v[1]), vpaddq_s32(v[2], v[3]));
    let s = vcvtq_f32_s32(isum);
    let da = vld1q_f32(a.d.as_ptr().add(b0));
    // legacy::block_term, lane-wise.
    match kind_of(KIND) {
        Kind::Q4_0 => vmulq_f32(vmulq_f32(s, dw), da),
        Kind::Q5_0 => vmulq_f32(vmulq_f32(dw, da), s),
        Kind::Q8_0 => vmulq_f32(s, vmulq_f32(dw, da)),
        Kind::Q4_1 | Kind::Q5_1 => {
            let sa = vld1q_f32(a.s.as_ptr().add(b0));
            vaddq_f32(vmulq_f32(vmulq_f32(dw, da), s), vmulq_f32(mw, sa))
        }
    }
}

/// Dots of `nrows` rows of `KIND` blocks with each row of `acts` (see `BlockFn`).
#[inline(always)]
unsafe fn legacy_block<const KIND: u8, const DOT: bool>(
    w: &[u8],
    row_bytes: usize,
    nrows: usize,
    acts: &[QuantizedActs],
    out: &mut [f32],
    stride: usize,
) {
    for (t, tile) in acts.chunks(MAX_ACTS).enumerate() {
        let out = &mut out[t * MAX_ACTS..];
        // One activation row (decode) gets its own instance so that the running sum, a serial
        // chain of additions, stays in a register.
        if tile.len() == 1 {
            legacy_tile::<KIND, DOT, 1>(w, row_bytes, nrows, tile, out, stride);
        } else {
            legacy_tile::<KIND, DOT, MAX_ACTS>(w, row_bytes, nrows, tile, out, stride);
        }
    }
}

/// [`legacy_block`] for at most `M` activation rows.
#[inline(always)]
unsafe fn legacy_tile<const KIND: u8, const DOT: bool, const M: usize>(
    w: &[u8],
    row_bytes: usize,
    nrows: usize,
    tile: &[QuantizedActs],
    out: &mut [f32],
    stride: usize,
) {
    let kind = kind_of(KIND);
    let bb = kind.block_bytes();
    let nb = row_bytes / bb;
    for j in 0..nrows {
        let row = &w[j * row_bytes..(j + 1) * row_bytes];
        let wp = row.as_ptr();
        let mut sum = [0f32; M];
        let mut b0 = 0;
        while b0 + GROUP <= nb {
            // Unpacked once, used for every activation row.
            let gp = wp.add(b0 * bb);
            let wq = [
                unpack_legacy::<KIND>(gp),
                unpack_legacy::<KIND>(gp.add(bb)),
                unpack_legacy::<KIND>(gp.add(2 * bb)),
                unpack_legacy::<KIND>(gp.add(3 * bb)),
            ];
            let mw = if kind.has_min() {
                halves4(gp.add(2), bb)
            } else {
                vdupq_n_f32(0.0)
            };
            let scales = (halves4(gp, bb), mw);
            for (a, si) in tile.iter().zip(sum.iter_mut()) {
                let t = group_terms::<KIND, DOT>(&wq, scales, a, b0);
                // The running sum takes the terms one block after the other.
                *si += vgetq_lane_f32::<0>(t);
                *si += vgetq_lane_f32::<1>(t);
                *si += vgetq_lane_f32::<2>(t);
                *si += vgetq_lane_f32::<3>(t);
            }
            b0 += GROUP;
        }
        for b in b0..nb {
            let blk = &row[b * bb..(b + 1) * bb];
            let wq = unpack_legacy::<KIND>(blk.as_ptr());
            let ws = legacy::block_scales(kind, blk);
            for (a, si) in tile.iter().zip(sum.iter_mut()) {
                let q = a.qs.as_ptr().add(b * QK);
                let isum = vaddvq_s32(block_products::<KIND, DOT>(&wq, q));
                *si += legacy::block_term(kind, isum, ws, legacy::act_scales(kind, a, b));
            }
        }
        for (i, &si) in sum.iter().enumerate().take(tile.len()) {
            out[j * stride + i] = si;
        }
    }
}

/// Defines a legacy type's single-dot and block entry points for one feature set.
macro_rules! legacy_entries {
    ($dot:ident, $block:ident, $kind:expr, $sdot:expr, $features:literal) => {
        #[target_feature(enable = $features)]
        unsafe fn $block(
            w: &[u8],
            row_bytes: usize,
            nrows: usize,
            acts: &[QuantizedActs],
            out: &mut [f32],
            stride: usize,
        ) {
            legacy_block::<{ $kind }, { $sdot }>(w, row_bytes, nrows, acts, out, stride)
        }

        #[target_feature(enable = $features)]
        unsafe fn $dot(w: &[u8], a: &QuantizedActs) -> f32 {
            let mut out = [0f32];
            legacy_block::<{ $kind }, { $sdot }>(
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

legacy_entries!(q4_0_neon, q4_0_block_neon, KIND_Q4_0, false, "neon");
legacy_entries!(q5_0_neon, q5_0_block_neon, KIND_Q5_0, false, "neon");
legacy_entries!(q8_0_neon, q8_0_block_neon, KIND_Q8_0, false, "neon");
legacy_entries!(q4_1_neon, q4_1_block_neon, KIND_Q4_1, false, "neon");
legacy_entries!(q5_1_neon, q5_1_block_neon, KIND_Q5_1, false, "neon");
legacy_entries!(q4_0_sdot, q4_0_block_sdot, KIND_Q4_0, true, "neon,dotprod");
legacy_entries!(q5_0_sdot, q5_0_block_sdot, KIND_Q5_0, true, "neon,dotprod");
legacy_entries!(q8_0_sdot, q8_0_block_sdot, KIND_Q8_0, true, "neon,dotprod");
legacy_entries!(q4_1_sdot, q4_1_block_sdot, KIND_Q4_1, true, "neon,dotprod");
legacy_entries!(q5_1_sdot, q5_1_block_sdot, KIND_Q5_1, true, "neon,dotprod");

// ---------------------------------------------------------------------------------------------
// k-quants × Q8_K.
//
// Each super-block is unpacked once (signed or unsigned quants in element order, 16 per
// vector, and the sub-block scales) and then dotted with every activation row of the block
// kernel's tile. Activation quants are read in element order (`qs`); the pair-order copies
// are the x86 kernels'.

/// Running state of one k-quant dot: ggml's eight f32 lane sums (lanes 0..4, 4..8) and its
/// scalar sum.
#[derive(Clone, Copy)]
struct KState {
    sums: [float32x4_t; 2],
    sum: f32,
}

/// ggml's eight i32 lane sums of one super-block (lanes 0..4, 4..8).
type Lanes = [int32x4_t; 2];

/// Adds `scale` × the i16 lane products `p` (lane `l`: ggml lane `l`) to `acc`.
#[inline(always)]
unsafe fn add_scaled(acc: &mut Lanes, p: int16x8_t, scale: i16) {
    acc[0] = vmlal_n_s16(acc[0], vget_low_s16(p), scale);
    acc[1] = vmlal_high_n_s16(acc[1], p, scale);
}

/// The i16 lane products of 16 weight quants `w` with the 16 activation quants at `q` (a
/// multiple of 16 elements into the super-block): lane `l` = w[l] a[l] + w[l + 8] a[l + 8].
#[inline(always)]
unsafe fn products16(w: int8x16_t, q: *const i8) -> int16x8_t {
    let a = vld1q_s8(q);
    vmlal_high_s8(vmull_s8(vget_low_s8(w), vget_low_s8(a)), w, a)
}

/// `sums[l] += d * lane[l]`, lane-wise (as `kquants::fold_lanes`).
#[inline(always)]
unsafe fn fold_lanes(st: &mut KState, d: f32, lanes: &Lanes) {
    for (s, l) in st.sums.iter_mut().zip(lanes) {
        *s = vaddq_f32(*s, vmulq_n_f32(vcvtq_f32_s32(*l), d));
    }
}

/// `sum + sums[0] + ... + sums[7]`, left to right.
#[inline(always)]
unsafe fn finish_lanes(st: &KState) -> f32 {
    let mut s = [0f32; 8];
    vst1q_f32(s.as_mut_ptr(), st.sums[0]);
    vst1q_f32(s.as_mut_ptr().add(4), st.sums[1]);
    kquants::finish_lanes(st.sum, &s)
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
        sums: [vdupq_n_f32(0.0); 2],
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
            out[j * stride + i] = finish_lanes(s);
        }
    }
}

/// One Q4_K / Q5_K super-block, unpacked.
struct UnpackedK4 {
    /// Quants (0..32) in element order, 16 per vector: sub-block `s` is `q[2s]`, `q[2s + 1]`.
    q: [int8x16_t; 16],
    scales: [u8; 8],
    mins: [u8; 8],
    d: f32,
    dmin: f32,
}

/// Q4_K (`HAS_QH = false`) and Q5_K.
struct K4Like<const HAS_QH: bool>;

impl<const HAS_QH: bool> KQuant for K4Like<HAS_QH> {
    const BB: usize = if HAS_QH { 176 } else { 144 };
    type Unpacked = UnpackedK4;

    #[inline(always)]
    unsafe fn unpack(p: *const u8) -> UnpackedK4 {
        let m4 = vdupq_n_u8(0x0f);
        let qs_at = if HAS_QH { 48 } else { 16 };
        // qh[l]: bit 2c + t is the 0x10 bit of element 64c + 32t + l.
        let qh = [vld1q_u8(p.add(16)), vld1q_u8(p.add(32))];
        let mut q = [vdupq_n_s8(0); 16];
        for c in 0..4 {
            for half in 0..2 {
                // qs[32c + l]: low nibble element 64c + l, high nibble element 64c + 32 + l.
                let raw = vld1q_u8(p.add(qs_at + 32 * c + 16 * half));
                let mut lo = vandq_u8(raw, m4);
                let mut hi = vshrq_n_u8::<4>(raw);
                if HAS_QH {
                    let h = qh[half];
                    let bit_lo = vdupq_n_u8(1 << (2 * c));
                    let bit_hi = vdupq_n_u8(1 << (2 * c + 1));
                    let x10 = vdupq_n_u8(0x10);
                    lo = vorrq_u8(lo, vandq_u8(vtstq_u8(h, bit_lo), x10));
                    hi = vorrq_u8(hi, vandq_u8(vtstq_u8(h, bit_hi), x10));
                }
                q[4 * c + half] = vreinterpretq_s8_u8(lo);
                q[4 * c + 2 + half] = vreinterpretq_s8_u8(hi);
            }
        }
        let (scales, mins) = kquants::scales_mins_k4(&*(p.add(4) as *const [u8; 12]));
        UnpackedK4 {
            q,
            scales,
            mins,
            d: float::f16_to_f32(half_bits(p)),
            dmin: float::f16_to_f32(half_bits(p.add(2))),
        }
    }

    #[inline(always)]
    unsafe fn update(u: &UnpackedK4, a: &QuantizedActs, b: usize, st: &mut KState) {
        let aq = a.qs.as_ptr().add(b * QK_K);
        let mut acc = [vdupq_n_s32(0); 2];
        for s in 0..8 {
            // Four products per i16 lane: 4 * 31 * 128 < 2^15.
            let a0 = vld1q_s8(aq.add(32 * s));
            let a1 = vld1q_s8(aq.add(32 * s + 16));
            let (w0, w1) = (u.q[2 * s], u.q[2 * s + 1]);
            let mut p = vmull_s8(vget_low_s8(w0), vget_low_s8(a0));
            p = vmlal_high_s8(p, w0, a0);
            p = vmlal_s8(p, vget_low_s8(w1), vget_low_s8(a1));
            p = vmlal_high_s8(p, w1, a1);
            add_scaled(&mut acc, p, u.scales[s] as i16);
        }
        let summ = kquants::summ_k4(&u.mins, &a.bsums[b * 16..(b + 1) * 16]);
        fold_lanes(st, u.d * a.d[b], &acc);
        st.sum -= (u.dmin * a.d[b]) * summ as f32;
    }
}

/// One Q3_K / Q6_K super-block (16-element sub-blocks), unpacked.
struct Unpacked16 {
    /// Signed quants in element order: sub-block `s` is `w[s]`.
    w: [int8x16_t; 16],
    /// The signed sub-block scales.
    scales: [i16; 16],
    d: f32,
}

/// Folds one Q3_K / Q6_K super-block into the state (no minimum term).
#[inline(always)]
unsafe fn update16(u: &Unpacked16, a: &QuantizedActs, b: usize, st: &mut KState) {
    let aq = a.qs.as_ptr().add(b * QK_K);
    let mut acc = [vdupq_n_s32(0); 2];
    for (s, (&ws, &sc)) in u.w.iter().zip(&u.scales).enumerate() {
        // Two products per i16 lane: 2 * 32 * 128 <= 2^13.
        add_scaled(&mut acc, products16(ws, aq.add(16 * s)), sc);
    }
    fold_lanes(st, u.d * a.d[b], &acc);
}

struct Q6K;

impl KQuant for Q6K {
    const BB: usize = 210;
    type Unpacked = Unpacked16;

    #[inline(always)]
    unsafe fn unpack(p: *const u8) -> Unpacked16 {
        let m4 = vdupq_n_u8(0x0f);
        let m30 = vdupq_n_u8(0x30);
        let x32 = vdupq_n_s8(32);
        let mut w = [vdupq_n_s8(0); 16];
        // Element 128h + 32g + l: low 4 bits from ql[64h + 32(g & 1) + l] (low nibble for
        // g < 2), high 2 bits from bits 2g, 2g + 1 of qh[32h + l].
        for h in 0..2 {
            for half in 0..2 {
                let l0 = vld1q_u8(p.add(64 * h + 16 * half));
                let l1 = vld1q_u8(p.add(64 * h + 32 + 16 * half));
                let qh = vld1q_u8(p.add(128 + 32 * h + 16 * half));
                let groups = [
                    vorrq_u8(vandq_u8(l0, m4), vandq_u8(vshlq_n_u8::<4>(qh), m30)),
                    vorrq_u8(vandq_u8(l1, m4), vandq_u8(vshlq_n_u8::<2>(qh), m30)),
                    vorrq_u8(vshrq_n_u8::<4>(l0), vandq_u8(qh, m30)),
                    vorrq_u8(vshrq_n_u8::<4>(l1), vandq_u8(vshrq_n_u8::<2>(qh), m30)),
                ];
                for (g, ug) in groups.iter().enumerate() {
                    w[8 * h + 2 * g + half] = vsubq_s8(vreinterpretq_s8_u8(*ug), x32);
                }
            }
        }
        let mut scales = [0i16; 16];
        for (s, sc) in scales.iter_mut().enumerate() {
            *sc = *p.add(192 + s) as i8 as i16;
        }
        Unpacked16 {
            w,
            scales,
            d: float::f16_to_f32(half_bits(p.add(208))),
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
        let m3 = vdupq_n_u8(3);
        let x04 = vdupq_n_u8(4);
        let mut w = [vdupq_n_s8(0); 16];
        // Element 128h + 32s + l: low 2 bits (qs[32h + l] >> 2s) & 3, minus 4 unless bit
        // 4h + s of hmask[l] is set.
        for half in 0..2 {
            let hmask = vld1q_u8(p.add(16 * half));
            for h in 0..2 {
                let q = vld1q_u8(p.add(32 + 32 * h + 16 * half));
                let lows = [
                    vandq_u8(q, m3),
                    vandq_u8(vshrq_n_u8::<2>(q), m3),
                    vandq_u8(vshrq_n_u8::<4>(q), m3),
                    vshrq_n_u8::<6>(q),
                ];
                for (s, low) in lows.iter().enumerate() {
                    let bit = vdupq_n_u8(1 << (4 * h + s));
                    let set = vtstq_u8(hmask, bit);
                    // low - 4, plus 4 where the high bit is set.
                    let v = vsubq_u8(vorrq_u8(*low, vandq_u8(set, x04)), x04);
                    w[8 * h + 2 * s + half] = vreinterpretq_s8_u8(v);
                }
            }
        }
        let scales = kquants::scales_q3_k(&*(p.add(96) as *const [u8; 12])).map(|v| v as i16);
        Unpacked16 {
            w,
            scales,
            d: float::f16_to_f32(half_bits(p.add(108))),
        }
    }

    #[inline(always)]
    unsafe fn update(u: &Unpacked16, a: &QuantizedActs, b: usize, st: &mut KState) {
        update16(u, a, b, st)
    }
}

/// One Q2_K super-block, unpacked.
struct UnpackedQ2K {
    /// Quants (0..4) in element order: sub-block `s` is `q[s]`.
    q: [int8x16_t; 16],
    /// The 16 bytes of scales (low nibble) and mins (high nibble).
    scales: [u8; 16],
    d: f32,
    dmin: f32,
}

/// Q2_K: one integer sum per super-block, so `sdot` (`DOT`) applies.
struct Q2K<const DOT: bool>;

impl<const DOT: bool> KQuant for Q2K<DOT> {
    const BB: usize = 84;
    type Unpacked = UnpackedQ2K;

    #[inline(always)]
    unsafe fn unpack(p: *const u8) -> UnpackedQ2K {
        let m3 = vdupq_n_u8(3);
        let mut q = [vdupq_n_s8(0); 16];
        // Element 128h + 32s + l: (qs[32h + l] >> 2s) & 3.
        for h in 0..2 {
            for half in 0..2 {
                let raw = vld1q_u8(p.add(16 + 32 * h + 16 * half));
                let lows = [
                    vandq_u8(raw, m3),
                    vandq_u8(vshrq_n_u8::<2>(raw), m3),
                    vandq_u8(vshrq_n_u8::<4>(raw), m3),
                    vshrq_n_u8::<6>(raw),
                ];
                for (s, low) in lows.iter().enumerate() {
                    q[8 * h + 2 * s + half] = vreinterpretq_s8_u8(*low);
                }
            }
        }
        UnpackedQ2K {
            q,
            scales: *(p as *const [u8; 16]),
            d: float::f16_to_f32(half_bits(p.add(80))),
            dmin: float::f16_to_f32(half_bits(p.add(82))),
        }
    }

    #[inline(always)]
    unsafe fn update(u: &UnpackedQ2K, a: &QuantizedActs, b: usize, st: &mut KState) {
        let aq = a.qs.as_ptr().add(b * QK_K);
        let mut acc = [vdupq_n_s32(0); 2];
        for (s, (&qs, &sc)) in u.q.iter().zip(&u.scales).enumerate() {
            let scale = (sc & 0x0f) as i32;
            if DOT {
                let v = sdot(vdupq_n_s32(0), qs, vld1q_s8(aq.add(16 * s)));
                acc[0] = vmlaq_n_s32(acc[0], v, scale);
            } else {
                // Two products per i16 lane: 2 * 3 * 128 < 2^15.
                add_scaled(&mut acc, products16(qs, aq.add(16 * s)), scale as i16);
            }
        }
        let isum = vaddvq_s32(vaddq_s32(acc[0], acc[1]));
        let bsums = &a.bsums[b * 16..(b + 1) * 16];
        let summ: i32 = bsums
            .iter()
            .zip(&u.scales)
            .map(|(&bs, &sc)| bs as i32 * (sc >> 4) as i32)
            .sum();
        st.sum += kquants::q2_k_term(a.d[b], u.d, u.dmin, isum, summ);
    }
}

/// Defines a k-quant's single-dot and block entry points for one feature set.
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
}

kquant_entries!(q2_k_neon, q2_k_block_neon, Q2K<false>, "neon");
kquant_entries!(q2_k_sdot, q2_k_block_sdot, Q2K<true>, "neon,dotprod");
kquant_entries!(q3_k_neon, q3_k_block_neon, Q3K, "neon");
kquant_entries!(q4_k_neon, q4_k_block_neon, K4Like<false>, "neon");
kquant_entries!(q5_k_neon, q5_k_block_neon, K4Like<true>, "neon");
kquant_entries!(q6_k_neon, q6_k_block_neon, Q6K, "neon");

#[cfg(test)]
mod tests;
