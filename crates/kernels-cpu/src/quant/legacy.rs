//! ggml's 32-element block types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (weights) and the Q8_0 / Q8_1
//! activation quantizers.
//!
//! Block layouts (little-endian, `d`/`m`/`s` are IEEE half):
//! - Q4_0 (18 B): `d`, `qs[16]`; element `j < 16` is `qs[j] & 15`, `j >= 16` is
//!   `qs[j-16] >> 4`; value `d * (q - 8)`.
//! - Q4_1 (20 B): `d`, `m`, `qs[16]` as Q4_0; value `d * q + m`.
//! - Q5_0 (22 B): `d`, `qh: u32`, `qs[16]`; the 5th bit of element `j` is bit `j` of `qh`;
//!   value `d * (q - 16)`.
//! - Q5_1 (24 B): `d`, `m`, `qh`, `qs[16]`; value `d * q + m`.
//! - Q8_0 (34 B): `d`, `qs: [i8; 32]`; value `d * q`.
//! - Q8_1 (36 B): `d`, `s = d * Σq`, `qs: [i8; 32]` (activations only).
//!
//! Dot products follow ggml's portable `ggml_vec_dot_*_generic`: one exact integer sum per
//! block, turned into a float term with the block's half scales in the same operation order as
//! ggml (it differs between types, see [`block_term`]), and added to one f32 sum in block order.

use synaptix_core::DType;

use super::float::{f16_to_f32, f32_to_f16, read_f16};
use super::QuantizedActs;

pub(crate) const QK: usize = 32;

/// C's `MAX(a, b)` = `a > b ? a : b` (keeps a NaN `b`, unlike `f32::max`).
#[inline(always)]
fn c_max(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// C's float to `int8_t` conversion as x86 compilers emit it (the portable ggml build stores
/// quants this way): truncate to i32 with `cvttss2si`, whose result for NaN and out-of-range
/// values is `i32::MIN`, then keep the low byte.
#[inline(always)]
pub(crate) fn c_f32_to_i8(v: f32) -> i8 {
    const LIMIT: f32 = 2147483648.0; // 2^31
    if v.is_nan() || !(-LIMIT..LIMIT).contains(&v) {
        0 // low byte of i32::MIN
    } else {
        v as i32 as i8
    }
}

/// The Q8_0 (or Q8_1) quantization of one 32-element block as ggml's `quantize_row_q8_0_ref` /
/// `_q8_1_ref` compute it (what its portable build runs for activations): `d = amax / 127`,
/// `q = roundf(x * (1 / d))` (Rust's `round` is C's `roundf`: half away from zero). Returns
/// the unrounded `d` and writes `q`. Quants stay within [-127, 127] except in degenerate
/// blocks (values so small that `1 / d` overflows, infinities, NaN), which follow C's
/// conversion ([`c_f32_to_i8`]).
#[inline(always)]
fn quantize_block_q8(x: &[f32], q: &mut [i8]) -> f32 {
    let amax = x.iter().fold(0f32, |m, v| c_max(m, v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (qj, &xj) in q.iter_mut().zip(x) {
        *qj = c_f32_to_i8((xj * id).round());
    }
    d
}

/// `x * y`, with x86's result for an invalid product (0 × ∞): the negative default NaN, where
/// aarch64 gives the positive one. ggml's reference build that the golden bytes come from ran
/// on x86 (as [`c_f32_to_i8`] follows x86's conversion); other NaN results propagate an
/// operand's NaN alike on both.
#[inline(always)]
pub(crate) fn mul_x86_nan(x: f32, y: f32) -> f32 {
    let p = x * y;
    if p.is_nan() && !x.is_nan() && !y.is_nan() {
        f32::from_bits(0xffc0_0000)
    } else {
        p
    }
}

/// Quantizes block `b` of `acts` (Q8_0, or Q8_1 with `s = fp16(Σq * d)` using the unrounded
/// `d`, as ggml does) from the 32 values `xb`.
#[inline(always)]
pub(crate) fn quantize_q8_block(xb: &[f32], acts: &mut QuantizedActs, b: usize) {
    let q = &mut acts.qs[b * QK..(b + 1) * QK];
    let d = quantize_block_q8(xb, q);
    let sum: i32 = q.iter().map(|&v| v as i32).sum();
    set_q8_block_scales(acts, b, d, sum);
}

/// Stores block `b`'s scales from the unrounded `d` and the quants' sum: `d` as half, `Σq`, and
/// for Q8_1 `s = fp16(Σq * d)`.
#[inline(always)]
pub(crate) fn set_q8_block_scales(acts: &mut QuantizedActs, b: usize, d: f32, sum: i32) {
    acts.d[b] = f16_to_f32(f32_to_f16(d));
    acts.isum[b] = sum;
    if acts.dtype == DType::Q8_1 {
        acts.s[b] = f16_to_f32(f32_to_f16(mul_x86_nan(sum as f32, d)));
    }
}

/// Fills `acts` (Q8_0 or Q8_1, already sized for `x.len()` elements) with the quantization of
/// `x`.
#[inline(always)]
pub(crate) fn quantize_q8(x: &[f32], acts: &mut QuantizedActs) {
    for (b, xb) in x.chunks_exact(QK).enumerate() {
        quantize_q8_block(xb, acts, b);
    }
}

// ---------------------------------------------------------------------------------------------
// Dequantization (bit-exact with gguf-py: same f32 operations in the same order).

/// Unpacks the 4-bit quants of a Q4/Q5 block: element `j` of the 32.
#[inline(always)]
fn nibble(qs: &[u8], j: usize) -> u8 {
    if j < 16 {
        qs[j] & 0x0f
    } else {
        qs[j - 16] >> 4
    }
}

pub(crate) fn dequantize_q4_0(src: &[u8], dst: &mut [f32]) {
    for (blk, y) in src.chunks_exact(18).zip(dst.chunks_exact_mut(QK)) {
        let d = read_f16(blk, 0);
        let qs = &blk[2..18];
        for (j, yj) in y.iter_mut().enumerate() {
            *yj = d * (nibble(qs, j) as i32 - 8) as f32;
        }
    }
}

pub(crate) fn dequantize_q4_1(src: &[u8], dst: &mut [f32]) {
    for (blk, y) in src.chunks_exact(20).zip(dst.chunks_exact_mut(QK)) {
        let d = read_f16(blk, 0);
        let m = read_f16(blk, 2);
        let qs = &blk[4..20];
        for (j, yj) in y.iter_mut().enumerate() {
            *yj = d * nibble(qs, j) as f32 + m;
        }
    }
}

#[inline(always)]
fn read_qh(blk: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([blk[at], blk[at + 1], blk[at + 2], blk[at + 3]])
}

pub(crate) fn dequantize_q5_0(src: &[u8], dst: &mut [f32]) {
    for (blk, y) in src.chunks_exact(22).zip(dst.chunks_exact_mut(QK)) {
        let d = read_f16(blk, 0);
        let qh = read_qh(blk, 2);
        let qs = &blk[6..22];
        for (j, yj) in y.iter_mut().enumerate() {
            let q = nibble(qs, j) as i32 | (((qh >> j) & 1) << 4) as i32;
            *yj = d * (q - 16) as f32;
        }
    }
}

pub(crate) fn dequantize_q5_1(src: &[u8], dst: &mut [f32]) {
    for (blk, y) in src.chunks_exact(24).zip(dst.chunks_exact_mut(QK)) {
        let d = read_f16(blk, 0);
        let m = read_f16(blk, 2);
        let qh = read_qh(blk, 4);
        let qs = &blk[8..24];
        for (j, yj) in y.iter_mut().enumerate() {
            let q = nibble(qs, j) as u32 | (((qh >> j) & 1) << 4);
            *yj = d * q as f32 + m;
        }
    }
}

pub(crate) fn dequantize_q8_0(src: &[u8], dst: &mut [f32]) {
    for (blk, y) in src.chunks_exact(34).zip(dst.chunks_exact_mut(QK)) {
        let d = read_f16(blk, 0);
        for (yj, &q) in y.iter_mut().zip(&blk[2..34]) {
            *yj = q as i8 as f32 * d;
        }
    }
}

/// Q8_1 (activations only; gguf-py has no reference): `d * q`, the `s` field unused.
pub(crate) fn dequantize_q8_1(src: &[u8], dst: &mut [f32]) {
    for (blk, y) in src.chunks_exact(36).zip(dst.chunks_exact_mut(QK)) {
        let d = read_f16(blk, 0);
        for (yj, &q) in y.iter_mut().zip(&blk[4..36]) {
            *yj = q as i8 as f32 * d;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Integer block sums: Σ q_w * q_a over one block (exact; SIMD paths compute the same values).

/// Σ (u_j - off) * a_j over one block whose unsigned quants are nibble `j` of `qs` (low
/// nibbles: elements 0..16, high: 16..32) plus `high(j) << 4`. Written as two 16-wide loops so
/// it vectorizes.
#[inline(always)]
fn isum_nibbles(qs: &[u8], a: &[i8], off: i32, high: impl Fn(usize) -> i32) -> i32 {
    let (a0, a1) = a.split_at(16);
    let mut s = 0i32;
    for (j, ((&q, &x0), &x1)) in qs.iter().zip(a0).zip(a1).enumerate().take(16) {
        let u0 = (q & 0x0f) as i32 | high(j);
        let u1 = (q >> 4) as i32 | high(j + 16);
        s += (u0 - off) * x0 as i32 + (u1 - off) * x1 as i32;
    }
    s
}

/// The 0x10 bit of element `j` from a Q5 block's `qh`.
#[inline(always)]
fn bit4(qh: u32, j: usize) -> i32 {
    (((qh >> j) & 1) << 4) as i32
}

#[inline(always)]
pub(crate) fn isum_q4_0(blk: &[u8], a: &[i8]) -> i32 {
    isum_nibbles(&blk[2..18], a, 8, |_| 0)
}

#[inline(always)]
pub(crate) fn isum_q4_1(blk: &[u8], a: &[i8]) -> i32 {
    isum_nibbles(&blk[4..20], a, 0, |_| 0)
}

#[inline(always)]
pub(crate) fn isum_q5_0(blk: &[u8], a: &[i8]) -> i32 {
    let qh = read_qh(blk, 2);
    isum_nibbles(&blk[6..22], a, 16, |j| bit4(qh, j))
}

#[inline(always)]
pub(crate) fn isum_q5_1(blk: &[u8], a: &[i8]) -> i32 {
    let qh = read_qh(blk, 4);
    isum_nibbles(&blk[8..24], a, 0, |j| bit4(qh, j))
}

#[inline(always)]
pub(crate) fn isum_q8_0(blk: &[u8], a: &[i8]) -> i32 {
    blk[2..34]
        .iter()
        .zip(a)
        .map(|(&w, &x)| w as i8 as i32 * x as i32)
        .sum()
}

/// Weight block kinds of the dot products (they differ in the float formula).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Q4_0,
    Q5_0,
    Q8_0,
    Q4_1,
    Q5_1,
}

impl Kind {
    /// Bytes per block.
    pub(crate) const fn block_bytes(self) -> usize {
        match self {
            Kind::Q4_0 => 18,
            Kind::Q4_1 => 20,
            Kind::Q5_0 => 22,
            Kind::Q5_1 => 24,
            Kind::Q8_0 => 34,
        }
    }

    /// Whether blocks carry a minimum `m` (paired with Q8_1 activations).
    pub(crate) const fn has_min(self) -> bool {
        matches!(self, Kind::Q4_1 | Kind::Q5_1)
    }
}

/// One block's float term, in ggml's operation order for each type (`isum` = Σ q_w q_a; `dw`,
/// `mw` the weight block's half scale and minimum, `da`, `sa` the activation block's):
/// - Q4_0: `(isum * dw) * da`
/// - Q5_0: `(dw * da) * isum`
/// - Q8_0: `isum * (dw * da)`
/// - Q4_1, Q5_1: `(dw * da) * isum + mw * sa`
#[inline(always)]
pub(crate) fn block_term(kind: Kind, isum: i32, w: (f32, f32), a: (f32, f32)) -> f32 {
    let ((dw, mw), (da, sa)) = (w, a);
    let s = isum as f32;
    match kind {
        Kind::Q4_0 => s * dw * da,
        Kind::Q5_0 => (dw * da) * s,
        Kind::Q8_0 => s * (dw * da),
        Kind::Q4_1 | Kind::Q5_1 => (dw * da) * s + mw * sa,
    }
}

/// The weight block's `(d, m)` (`m` = 0 for types without a minimum).
#[inline(always)]
pub(crate) fn block_scales(kind: Kind, blk: &[u8]) -> (f32, f32) {
    if kind.has_min() {
        (read_f16(blk, 0), read_f16(blk, 2))
    } else {
        (read_f16(blk, 0), 0.0)
    }
}

/// The activation block's `(d, s)` (`s` = 0 for Q8_0).
#[inline(always)]
pub(crate) fn act_scales(kind: Kind, acts: &QuantizedActs, b: usize) -> (f32, f32) {
    if kind.has_min() {
        (acts.d[b], acts.s[b])
    } else {
        (acts.d[b], 0.0)
    }
}

/// Scalar dot of a row of `kind` blocks with Q8_0 / Q8_1 activations.
#[inline(always)]
fn dot_blocks(
    kind: Kind,
    w: &[u8],
    acts: &QuantizedActs,
    isum: impl Fn(&[u8], &[i8]) -> i32,
) -> f32 {
    let mut sum = 0f32;
    for (b, blk) in w.chunks_exact(kind.block_bytes()).enumerate() {
        let i = isum(blk, &acts.qs[b * QK..(b + 1) * QK]);
        sum += block_term(kind, i, block_scales(kind, blk), act_scales(kind, acts, b));
    }
    sum
}

#[inline(always)]
pub(crate) fn dot_q4_0(w: &[u8], acts: &QuantizedActs) -> f32 {
    dot_blocks(Kind::Q4_0, w, acts, isum_q4_0)
}

#[inline(always)]
pub(crate) fn dot_q5_0(w: &[u8], acts: &QuantizedActs) -> f32 {
    dot_blocks(Kind::Q5_0, w, acts, isum_q5_0)
}

#[inline(always)]
pub(crate) fn dot_q8_0(w: &[u8], acts: &QuantizedActs) -> f32 {
    dot_blocks(Kind::Q8_0, w, acts, isum_q8_0)
}

#[inline(always)]
pub(crate) fn dot_q4_1(w: &[u8], acts: &QuantizedActs) -> f32 {
    dot_blocks(Kind::Q4_1, w, acts, isum_q4_1)
}

#[inline(always)]
pub(crate) fn dot_q5_1(w: &[u8], acts: &QuantizedActs) -> f32 {
    dot_blocks(Kind::Q5_1, w, acts, isum_q5_1)
}
