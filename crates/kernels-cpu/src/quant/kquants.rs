//! ggml's k-quants (256-element super-blocks): Q2_K, Q3_K, Q4_K, Q5_K, Q6_K weights and the
//! Q8_K activation type.
//!
//! Super-block layouts (little-endian; `d`, `dmin` are IEEE half unless noted). Element `e` of
//! the 256 belongs to sub-block `e / 16` (Q2_K, Q3_K, Q6_K) or `e / 32` (Q4_K, Q5_K).
//! - Q2_K (84 B): `scales[16]` (low nibble: scale, high nibble: min), `qs[64]`, `d`, `dmin`.
//!   `q_e = (qs[32h + l] >> 2s) & 3` for `e = 128h + 32s + l`; value
//!   `(d * scale) * q - (dmin * min)`.
//! - Q3_K (110 B): `hmask[32]`, `qs[64]`, `scales[12]` (16 packed 6-bit values), `d`.
//!   Low bits as Q2_K; `q_e -= 4` unless bit `e / 32` of `hmask[e % 32]` is set; value
//!   `(d * (scale - 32)) * q`.
//! - Q4_K (144 B): `d`, `dmin`, `scales[12]` (8 scales + 8 mins, 6-bit), `qs[128]`;
//!   `q_e = (qs[32c + l] >> 4t) & 15` for `e = 64c + 32t + l`; value
//!   `(d * scale) * q - (dmin * min)`.
//! - Q5_K (176 B): `d`, `dmin`, `scales[12]`, `qh[32]`, `qs[128]`; Q4_K's `q_e` plus 16 when
//!   bit `e / 32` of `qh[e % 32]` is set.
//! - Q6_K (210 B): `ql[128]`, `qh[64]`, `scales: [i8; 16]`, `d`. For `e = 128h + 32g + l`:
//!   low 4 bits from `ql[64h + 32(g & 1) + l]` (low nibble for `g < 2`, high otherwise), high
//!   2 bits `(qh[32h + l] >> 2g) & 3`; value `(d * scale) * (q - 32)`.
//! - Q8_K (292 B): `d: f32`, `qs: [i8; 256]`, `bsums: [i16; 16]` (sums of 16 quants).
//!
//! Dot products follow ggml's portable `ggml_vec_dot_*_q8_K_generic`. Q2_K: one integer sum per
//! super-block, `sum += (d_a * d) * isum - (d_a * dmin) * summ`. Q3_K..Q6_K: eight integer lane
//! sums per super-block, lane `l` over the elements `e` with `e % 8 == l` (each weighted by its
//! sub-block scale), then `sums[l] += (d * d_a) * lane[l]` in eight f32 lanes (Q4_K / Q5_K also
//! `sum -= (dmin * d_a) * summ` per super-block), and finally `sum += sums[l]` for `l = 0..8`.
//! SIMD kernels compute the same integers and perform the same f32 operations.
//!
//! They read the activation quants in "pair order" too ([`QuantizedActs::pq`]): within each
//! 16-element group, element `i` and `i + 8` (same lane) side by side, so that one `maddubs`
//! pair holds a single lane.

use super::float::read_f16;
use super::QuantizedActs;

pub(crate) const QK_K: usize = 256;

// ---------------------------------------------------------------------------------------------
// Scale unpacking.

/// Q4_K / Q5_K: the 8 6-bit scales and 8 6-bit mins from the 12 packed bytes, as four words of
/// four bytes: scales 0..4, scales 4..8, mins 0..4, mins 4..8. Bytes 0..4 hold scales 0..3 in
/// their low 6 bits, bytes 4..8 mins 0..3; bytes 8..12 hold the low 4 bits of scales 4..7 (low
/// nibble) and mins 4..7 (high nibble), whose top 2 bits are the top 2 bits of bytes 0..4
/// (scales) and 4..8 (mins).
#[inline(always)]
pub(crate) fn scale_min_words_k4(s: &[u8]) -> [u32; 4] {
    let word = |i: usize| u32::from_le_bytes([s[i], s[i + 1], s[i + 2], s[i + 3]]);
    let (s0, s1, s2) = (word(0), word(4), word(8));
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    [
        s0 & LOW6,
        (s2 & LOW4) | (((s0 >> 6) & LOW2) << 4),
        s1 & LOW6,
        ((s2 >> 4) & LOW4) | (((s1 >> 6) & LOW2) << 4),
    ]
}

/// Q4_K / Q5_K: the 8 scales and the 8 mins (see [`scale_min_words_k4`]).
#[inline(always)]
pub(crate) fn scales_mins_k4(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let w = scale_min_words_k4(s);
    let join = |lo: u32, hi: u32| {
        let (a, b) = (lo.to_le_bytes(), hi.to_le_bytes());
        [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]]
    };
    (join(w[0], w[1]), join(w[2], w[3]))
}

/// Q3_K: the 16 unsigned 6-bit scales (stored value; the scale is this minus 32). Bytes 0..8
/// hold the low 4 bits (scale `i` in byte `i % 8`, nibble `i / 8`), bytes 8..12 the top 2 bits
/// (byte `8 + i % 4`, bit pair `i / 4`). Done four scales at a time in u32 lanes.
#[inline(always)]
pub(crate) fn scales_q3_k_u6(s: &[u8]) -> [u8; 16] {
    let word = |i: usize| u32::from_le_bytes([s[i], s[i + 1], s[i + 2], s[i + 3]]);
    let (w0, w1, w2) = (word(0), word(4), word(8));
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    let parts = [
        (w0 & LOW4) | ((w2 & LOW2) << 4),
        (w1 & LOW4) | (((w2 >> 2) & LOW2) << 4),
        ((w0 >> 4) & LOW4) | (((w2 >> 4) & LOW2) << 4),
        ((w1 >> 4) & LOW4) | (((w2 >> 6) & LOW2) << 4),
    ];
    let mut out = [0u8; 16];
    for (o, p) in out.chunks_exact_mut(4).zip(parts) {
        o.copy_from_slice(&p.to_le_bytes());
    }
    out
}

/// Q3_K: the 16 signed scales (`6-bit value - 32`).
#[inline(always)]
pub(crate) fn scales_q3_k(s: &[u8]) -> [i32; 16] {
    scales_q3_k_u6(s).map(|v| v as i32 - 32)
}

// ---------------------------------------------------------------------------------------------
// Quant unpacking: the 256 integer quants of one super-block, in element order.

#[inline(always)]
fn quants_q2_k(blk: &[u8]) -> [i8; QK_K] {
    let qs = &blk[16..80];
    let mut q = [0i8; QK_K];
    for (e, qe) in q.iter_mut().enumerate() {
        let (h, s, l) = (e / 128, (e / 32) % 4, e % 32);
        *qe = ((qs[32 * h + l] >> (2 * s)) & 3) as i8;
    }
    q
}

#[inline(always)]
fn quants_q3_k(blk: &[u8]) -> [i8; QK_K] {
    let hmask = &blk[0..32];
    let qs = &blk[32..96];
    let mut q = [0i8; QK_K];
    for (e, qe) in q.iter_mut().enumerate() {
        let (h, s, l) = (e / 128, (e / 32) % 4, e % 32);
        let low = ((qs[32 * h + l] >> (2 * s)) & 3) as i8;
        let high_set = (hmask[l] >> (e / 32)) & 1 != 0;
        *qe = if high_set { low } else { low - 4 };
    }
    q
}

#[inline(always)]
fn quants_q4_k(blk: &[u8]) -> [i8; QK_K] {
    let qs = &blk[16..144];
    let mut q = [0i8; QK_K];
    for (e, qe) in q.iter_mut().enumerate() {
        let (c, t, l) = (e / 64, (e / 32) % 2, e % 32);
        *qe = ((qs[32 * c + l] >> (4 * t)) & 0x0f) as i8;
    }
    q
}

#[inline(always)]
fn quants_q5_k(blk: &[u8]) -> [i8; QK_K] {
    let qh = &blk[16..48];
    let qs = &blk[48..176];
    let mut q = [0i8; QK_K];
    for (e, qe) in q.iter_mut().enumerate() {
        let (c, t, l) = (e / 64, (e / 32) % 2, e % 32);
        let low = (qs[32 * c + l] >> (4 * t)) & 0x0f;
        let high = ((qh[l] >> (e / 32)) & 1) << 4;
        *qe = (low | high) as i8;
    }
    q
}

/// Q6_K quants with the -32 offset applied (range -32..=31).
#[inline(always)]
fn quants_q6_k(blk: &[u8]) -> [i8; QK_K] {
    let ql = &blk[0..128];
    let qh = &blk[128..192];
    let mut q = [0i8; QK_K];
    for (e, qe) in q.iter_mut().enumerate() {
        let (h, g, l) = (e / 128, (e / 32) % 4, e % 32);
        let byte = ql[64 * h + 32 * (g & 1) + l];
        let low = if g < 2 { byte & 0x0f } else { byte >> 4 };
        let high = (qh[32 * h + l] >> (2 * g)) & 3;
        *qe = (low | (high << 4)) as i8 - 32;
    }
    q
}

// ---------------------------------------------------------------------------------------------
// Dequantization (bit-exact with gguf-py).

pub(crate) fn dequantize_q2_k(src: &[u8], dst: &mut [f32]) {
    for (blk, y) in src.chunks_exact(84).zip(dst.chunks_exact_mut(QK_K)) {
        let d = read_f16(blk, 80);
        let dmin = read_f16(blk, 82);
        let q = quants_q2_k(blk);
        for (sub, (ys, qs)) in y.chunks_exact_mut(16).zip(q.chunks_exact(16)).enumerate() {
            let sc = blk[sub];
            let dl = d * (sc & 0x0f) as f32;
            let ml = dmin * (sc >> 4) as f32;
            for (yv, &qv) in ys.iter_mut().zip(qs) {
                *yv = dl * qv as f32 - ml;
            }
        }
    }
}

pub(crate) fn dequantize_q3_k(src: &[u8], dst: &mut [f32]) {
    for (blk, y) in src.chunks_exact(110).zip(dst.chunks_exact_mut(QK_K)) {
        let d = read_f16(blk, 108);
        let scales = scales_q3_k(&blk[96..108]);
        let q = quants_q3_k(blk);
        for (sub, (ys, qs)) in y.chunks_exact_mut(16).zip(q.chunks_exact(16)).enumerate() {
            let dl = d * scales[sub] as f32;
            for (yv, &qv) in ys.iter_mut().zip(qs) {
                *yv = dl * qv as f32;
            }
        }
    }
}

/// Shared by Q4_K and Q5_K: `(d * scale) * q - (dmin * min)` per 32-element sub-block.
#[inline(always)]
fn dequantize_k4_like(blk: &[u8], q: &[i8; QK_K], y: &mut [f32]) {
    let d = read_f16(blk, 0);
    let dmin = read_f16(blk, 2);
    let (sc, mn) = scales_mins_k4(&blk[4..16]);
    for (sub, (ys, qs)) in y.chunks_exact_mut(32).zip(q.chunks_exact(32)).enumerate() {
        let dl = d * sc[sub] as f32;
        let ml = dmin * mn[sub] as f32;
        for (yv, &qv) in ys.iter_mut().zip(qs) {
            *yv = dl * qv as f32 - ml;
        }
    }
}

pub(crate) fn dequantize_q4_k(src: &[u8], dst: &mut [f32]) {
    for (blk, y) in src.chunks_exact(144).zip(dst.chunks_exact_mut(QK_K)) {
        dequantize_k4_like(blk, &quants_q4_k(blk), y);
    }
}

pub(crate) fn dequantize_q5_k(src: &[u8], dst: &mut [f32]) {
    for (blk, y) in src.chunks_exact(176).zip(dst.chunks_exact_mut(QK_K)) {
        dequantize_k4_like(blk, &quants_q5_k(blk), y);
    }
}

pub(crate) fn dequantize_q6_k(src: &[u8], dst: &mut [f32]) {
    for (blk, y) in src.chunks_exact(210).zip(dst.chunks_exact_mut(QK_K)) {
        let d = read_f16(blk, 208);
        let q = quants_q6_k(blk);
        for (sub, (ys, qs)) in y.chunks_exact_mut(16).zip(q.chunks_exact(16)).enumerate() {
            let dl = d * (blk[192 + sub] as i8) as f32;
            for (yv, &qv) in ys.iter_mut().zip(qs) {
                *yv = dl * qv as f32;
            }
        }
    }
}

pub(crate) fn dequantize_q8_k(src: &[u8], dst: &mut [f32]) {
    for (blk, y) in src.chunks_exact(292).zip(dst.chunks_exact_mut(QK_K)) {
        let d = f32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]]);
        for (yv, &q) in y.iter_mut().zip(&blk[4..260]) {
            *yv = d * (q as i8) as f32;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Q8_K activation quantization (ggml's quantize_row_q8_K_ref).

/// ggml's `nearest_int`: adds 1.5 * 2^23 so that the float addition rounds to an integer (half
/// to even) in the low mantissa bits, and reads those back. Equal to round-half-even for
/// |v| < 2^22; for infinities and NaN it gives what the bit pattern gives.
#[inline(always)]
pub(crate) fn nearest_int(v: f32) -> i32 {
    let biased = v + 12582912.0;
    (biased.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// Quantizes super-block `b` of `acts` from the 256 values `xb` like
/// `quantize_row_q8_K_ref`: the value of largest magnitude (first one on ties) maps to -127,
/// `d = 1 / iscale`, `bsums` are sums of 16. (ggml leaves `bsums` unset for an all-zero block;
/// they are zero here.)
#[inline(always)]
pub(crate) fn quantize_q8_k_block(xb: &[f32], acts: &mut QuantizedActs, b: usize) {
    let q = &mut acts.qs[b * QK_K..(b + 1) * QK_K];
    // ggml scans for the first element with the largest |x|; the largest |x| (NaN never
    // compares greater) and then its first occurrence is the same element.
    let amax = xb
        .iter()
        .fold(0f32, |m, v| if v.abs() > m { v.abs() } else { m });
    if amax == 0.0 {
        q.fill(0);
        acts.d[b] = 0.0;
        acts.bsums[b * 16..(b + 1) * 16].fill(0);
        return;
    }
    let max = xb.iter().copied().find(|v| v.abs() == amax).unwrap_or(amax);
    let iscale = -127.0 / max;
    for (qv, &v) in q.iter_mut().zip(xb) {
        // C stores MIN(127, v) into an int8_t: the low byte.
        *qv = nearest_int(iscale * v).min(127) as i8;
    }
    for (j, bs) in acts.bsums[b * 16..(b + 1) * 16].iter_mut().enumerate() {
        *bs = q[16 * j..16 * (j + 1)].iter().map(|&v| v as i16).sum();
    }
    acts.d[b] = 1.0 / iscale;
}

/// Fills `acts` (already sized) with the Q8_K quantization of `x` (see
/// [`quantize_q8_k_block`]), plus the pair-order copies.
#[inline(always)]
pub(crate) fn quantize_q8_k(x: &[f32], acts: &mut QuantizedActs) {
    for (b, xb) in x.chunks_exact(QK_K).enumerate() {
        quantize_q8_k_block(xb, acts, b);
    }
    fill_pair_order(acts);
}

/// Position of element `i` (0..16) of a 16-element group in pair order: `2i` for `i < 8`,
/// `2(i - 8) + 1` otherwise.
#[inline(always)]
pub(crate) const fn pair_pos(i: usize) -> usize {
    if i < 8 {
        2 * i
    } else {
        2 * (i - 8) + 1
    }
}

/// Fills `acts.pq` / `acts.pq_abs` from `acts.qs` (Q8_K).
#[inline(always)]
pub(crate) fn fill_pair_order(acts: &mut QuantizedActs) {
    for (src, (dst, dst_abs)) in acts.qs.chunks_exact(16).zip(
        acts.pq
            .chunks_exact_mut(16)
            .zip(acts.pq_abs.chunks_exact_mut(16)),
    ) {
        for (i, &v) in src.iter().enumerate() {
            dst[pair_pos(i)] = v;
            dst_abs[pair_pos(i)] = v.unsigned_abs();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Scalar dot products with Q8_K activations (the float order of ggml's `_generic` kernels).

/// `sums[l] += d * lane[l]` for the eight lanes of one super-block.
#[inline(always)]
pub(crate) fn fold_lanes(sums: &mut [f32; 8], d: f32, lanes: &[i32; 8]) {
    for (s, &v) in sums.iter_mut().zip(lanes) {
        *s += d * v as f32;
    }
}

/// The result: `sum + sums[0] + sums[1] + ... + sums[7]`, left to right.
#[inline(always)]
pub(crate) fn finish_lanes(sum: f32, sums: &[f32; 8]) -> f32 {
    sums.iter().fold(sum, |acc, &v| acc + v)
}

/// Lane sums of one super-block: `lanes[e % 8] += scale(e) * q[e] * a[e]`.
#[inline(always)]
fn lanes_of(q: &[i8; QK_K], a: &[i8], scale: impl Fn(usize) -> i32) -> [i32; 8] {
    let mut lanes = [0i32; 8];
    for (e, (&qe, &ae)) in q.iter().zip(a).enumerate() {
        lanes[e % 8] += scale(e) * (qe as i32 * ae as i32);
    }
    lanes
}

/// Q2_K super-block term: `(d_a * d) * isum - (d_a * dmin) * summ`.
#[inline(always)]
pub(crate) fn q2_k_term(da: f32, dw: f32, dminw: f32, isum: i32, summ: i32) -> f32 {
    let dall = da * dw;
    let dmin = da * dminw;
    dall * isum as f32 - dmin * summ as f32
}

#[inline(always)]
pub(crate) fn dot_q2_k(w: &[u8], acts: &QuantizedActs) -> f32 {
    let mut sum = 0f32;
    for (b, blk) in w.chunks_exact(84).enumerate() {
        let a = &acts.qs[b * QK_K..(b + 1) * QK_K];
        let bsums = &acts.bsums[b * 16..(b + 1) * 16];
        let sc = &blk[0..16];
        let summ: i32 = (0..16).map(|j| bsums[j] as i32 * (sc[j] >> 4) as i32).sum();
        let q = quants_q2_k(blk);
        let isum: i32 = (0..QK_K)
            .map(|e| (sc[e / 16] & 0x0f) as i32 * q[e] as i32 * a[e] as i32)
            .sum();
        sum += q2_k_term(acts.d[b], read_f16(blk, 80), read_f16(blk, 82), isum, summ);
    }
    sum
}

#[inline(always)]
pub(crate) fn dot_q3_k(w: &[u8], acts: &QuantizedActs) -> f32 {
    let mut sums = [0f32; 8];
    for (b, blk) in w.chunks_exact(110).enumerate() {
        let a = &acts.qs[b * QK_K..(b + 1) * QK_K];
        let scales = scales_q3_k(&blk[96..108]);
        let lanes = lanes_of(&quants_q3_k(blk), a, |e| scales[e / 16]);
        fold_lanes(&mut sums, read_f16(blk, 108) * acts.d[b], &lanes);
    }
    finish_lanes(0.0, &sums)
}

/// Σ min_j × (bsum_{2j} + bsum_{2j+1}) for Q4_K / Q5_K.
#[inline(always)]
pub(crate) fn summ_k4(mins: &[u8; 8], bsums: &[i16]) -> i32 {
    (0..8)
        .map(|j| mins[j] as i32 * (bsums[2 * j] as i32 + bsums[2 * j + 1] as i32))
        .sum()
}

#[inline(always)]
fn dot_k4_like<const BB: usize>(w: &[u8], acts: &QuantizedActs) -> f32 {
    let mut sums = [0f32; 8];
    let mut sum = 0f32;
    for (b, blk) in w.chunks_exact(BB).enumerate() {
        let a = &acts.qs[b * QK_K..(b + 1) * QK_K];
        let (sc, mn) = scales_mins_k4(&blk[4..16]);
        let summ = summ_k4(&mn, &acts.bsums[b * 16..(b + 1) * 16]);
        let q = if BB == 176 {
            quants_q5_k(blk)
        } else {
            quants_q4_k(blk)
        };
        let lanes = lanes_of(&q, a, |e| sc[e / 32] as i32);
        fold_lanes(&mut sums, read_f16(blk, 0) * acts.d[b], &lanes);
        sum -= (read_f16(blk, 2) * acts.d[b]) * summ as f32;
    }
    finish_lanes(sum, &sums)
}

#[inline(always)]
pub(crate) fn dot_q4_k(w: &[u8], acts: &QuantizedActs) -> f32 {
    dot_k4_like::<144>(w, acts)
}

#[inline(always)]
pub(crate) fn dot_q5_k(w: &[u8], acts: &QuantizedActs) -> f32 {
    dot_k4_like::<176>(w, acts)
}

#[inline(always)]
pub(crate) fn dot_q6_k(w: &[u8], acts: &QuantizedActs) -> f32 {
    let mut sums = [0f32; 8];
    for (b, blk) in w.chunks_exact(210).enumerate() {
        let a = &acts.qs[b * QK_K..(b + 1) * QK_K];
        let scales = &blk[192..208];
        let lanes = lanes_of(&quants_q6_k(blk), a, |e| scales[e / 16] as i8 as i32);
        fold_lanes(&mut sums, read_f16(blk, 208) * acts.d[b], &lanes);
    }
    finish_lanes(0.0, &sums)
}
