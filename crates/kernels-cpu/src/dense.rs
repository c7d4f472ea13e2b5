//! f32 ops over whole sequences for encoder-decoder models (Whisper): LayerNorm with bias, exact
//! GELU, f32 products with a bias, 1-D convolution and multi-head attention. Activations are
//! row-major `[rows, features]`; weights `[out, in]` as CTranslate2 and PyTorch store them.
//! Shapes are checked and mismatches are [`Error::ShapeMismatch`].

use rayon::prelude::*;
use synaptix_core::{Error, Result};

pub use crate::gemm::WeightRef;
use crate::gemm::{gemm_nt, gemv_nt};

fn mismatch(op: &'static str, detail: String) -> Error {
    Error::ShapeMismatch { op, detail }
}

/// From this many rows on, [`linear`] runs the register-tiled product (`gemm`): below it,
/// packing the weight would cost more than it saves.
const GEMM_MIN_ROWS: usize = 16;

/// `y[m×n] = x[m×k] · Wᵀ (+ bias)` for a weight `w: [n, k]` stored as f32 or f16 (converted
/// exactly: the same results as its f32 copy). From 16 rows on the register tiles of `gemm` run
/// on the rayon pool, below it one dot per output on the decode team.
pub fn linear(
    x: &[f32],
    m: usize,
    w: WeightRef,
    n: usize,
    k: usize,
    bias: Option<&[f32]>,
) -> Result<Vec<f32>> {
    const OP: &str = "linear";
    if w.len() != n * k {
        return Err(mismatch(
            OP,
            format!("weight has {} values, expected {n}×{k}", w.len()),
        ));
    }
    if let Some(b) = bias {
        if b.len() != n {
            return Err(mismatch(
                OP,
                format!("bias has {} values, expected {n}", b.len()),
            ));
        }
    }
    if x.len() != m * k {
        return Err(mismatch(
            OP,
            format!("x has {} values, expected {m}×{k}", x.len()),
        ));
    }
    let mut y = vec![0f32; m * n];
    if k == 0 {
        // Empty sums.
    } else if m >= GEMM_MIN_ROWS {
        gemm_nt(x, m, w, n, k, &mut y);
    } else {
        gemv_nt(x, m, w, n, k, &mut y);
    }
    if let Some(b) = bias {
        for row in y.chunks_exact_mut(n) {
            row.iter_mut().zip(b).for_each(|(v, &b)| *v += b);
        }
    }
    Ok(y)
}

/// [`linear`] of an f32 weight.
pub fn linear_f32(
    x: &[f32],
    m: usize,
    w: &[f32],
    n: usize,
    k: usize,
    bias: Option<&[f32]>,
) -> Result<Vec<f32>> {
    linear(x, m, WeightRef::F32(w), n, k, bias)
}

/// LayerNorm of each row of `gamma.len()` values in place: `(x - mean) / sqrt(var + eps) · gamma
/// + beta`, the mean and the (biased) variance summed in f64.
pub fn layer_norm_inplace(x: &mut [f32], gamma: &[f32], beta: &[f32], eps: f32) -> Result<()> {
    const OP: &str = "layer_norm";
    let dim = gamma.len();
    if dim == 0 || beta.len() != dim || !x.len().is_multiple_of(dim) {
        return Err(mismatch(
            OP,
            format!("{} values, gamma {dim}, beta {}", x.len(), beta.len()),
        ));
    }
    let norm = |row: &mut [f32]| {
        let mean = row.iter().map(|&v| v as f64).sum::<f64>() / dim as f64;
        let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / dim as f64;
        let inv = (1.0 / (var + eps as f64).sqrt()) as f32;
        let mean = mean as f32;
        for ((v, &g), &b) in row.iter_mut().zip(gamma).zip(beta) {
            *v = (*v - mean) * inv * g + b;
        }
    };
    if x.len() >= 64 * dim {
        x.par_chunks_mut(dim).for_each(norm);
    } else {
        x.chunks_mut(dim).for_each(norm);
    }
    Ok(())
}

/// LayerNorm into a new buffer (see [`layer_norm_inplace`]).
pub fn layer_norm(x: &[f32], gamma: &[f32], beta: &[f32], eps: f32) -> Result<Vec<f32>> {
    let mut y = x.to_vec();
    layer_norm_inplace(&mut y, gamma, beta, eps)?;
    Ok(y)
}

/// `erf(x)` in f32 arithmetic that vectorizes: Abramowitz and Stegun's 7.1.26 on `|x|` (absolute
/// error 1.5e-7 in exact arithmetic, 5.4e-7 in f32), the sign restored.
#[inline(always)]
pub fn erf_f32(x: f32) -> f32 {
    let a = x.abs();
    let t = 1.0 / (1.0 + 0.327_591_1 * a);
    let poly = t
        * (0.254_829_6
            + t * (-0.284_496_74 + t * (1.421_413_7 + t * (-1.453_152_1 + t * 1.061_405_4))));
    let y = 1.0 - poly * exp_f32(-a * a);
    if x < 0.0 {
        -y
    } else {
        y
    }
}

/// GELU with the error function: `0.5 x (1 + erf(x / √2))`, erf by [`erf_f32`].
#[inline(always)]
pub fn gelu_erf(x: f32) -> f32 {
    0.5 * x * (1.0 + erf_f32(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// `tanh(x)` in f32 arithmetic that vectorizes: `1 - 2/(e^{2|x|} + 1)` by [`exp_f32`] with the
/// sign restored, and below |x| = 1/16 (where that form cancels) its odd Taylor polynomial to
/// degree 7. Absolute error under 1.2e-7.
#[inline(always)]
pub fn tanh_f32(x: f32) -> f32 {
    let a = x.abs();
    let t = 1.0 - 2.0 / (exp_f32(2.0 * a) + 1.0);
    let a2 = a * a;
    let small = a * (1.0 + a2 * (-1.0 / 3.0 + a2 * (2.0 / 15.0 + a2 * (-17.0 / 315.0))));
    let y = if a < 0.0625 { small } else { t };
    if x < 0.0 {
        -y
    } else {
        y
    }
}

/// [`tanh_f32`] of every value, compiled for the CPU's vector width (lane-wise: the same bits on
/// every width), long slices split over the rayon pool.
pub fn tanh_inplace(x: &mut [f32]) {
    if x.len() >= 1 << 16 {
        x.par_chunks_mut(1 << 14).for_each(tanh_slice);
    } else {
        tanh_slice(x);
    }
}

fn tanh_slice(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    match crate::cpu::path() {
        crate::cpu::Path::Avx512 => {
            // SAFETY: the path is only chosen on CPUs with AVX-512F.
            return unsafe { tanh_slice_avx512(x) };
        }
        crate::cpu::Path::Avx2 => {
            // SAFETY: the path is only chosen on CPUs with AVX2.
            return unsafe { tanh_slice_avx2(x) };
        }
        _ => {}
    }
    x.iter_mut().for_each(|v| *v = tanh_f32(*v));
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn tanh_slice_avx512(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = tanh_f32(*v));
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn tanh_slice_avx2(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = tanh_f32(*v));
}

/// [`gelu_erf`] of every value, compiled for the CPU's vector width (lane-wise: the same bits on
/// every width).
pub fn gelu_erf_inplace(x: &mut [f32]) {
    if x.len() >= 1 << 16 {
        x.par_chunks_mut(1 << 14).for_each(gelu_slice);
    } else {
        gelu_slice(x);
    }
}

fn gelu_slice(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    match crate::cpu::path() {
        crate::cpu::Path::Avx512 => {
            // SAFETY: the path is only chosen on CPUs with AVX-512F.
            return unsafe { gelu_slice_avx512(x) };
        }
        crate::cpu::Path::Avx2 => {
            // SAFETY: the path is only chosen on CPUs with AVX2.
            return unsafe { gelu_slice_avx2(x) };
        }
        _ => {}
    }
    x.iter_mut().for_each(|v| *v = gelu_erf(*v));
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn gelu_slice_avx512(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = gelu_erf(*v));
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn gelu_slice_avx2(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = gelu_erf(*v));
}

/// 1-D convolution over time: `x: [t_in, c_in]` (time-major), `w: [c_out, c_in, kernel]`, zero
/// padding `pad` on both sides, `stride`; returns `[t_out, c_out]` with `t_out = (t_in + 2 pad -
/// kernel) / stride + 1`. Each output row is a dot of the weight row with the window unrolled
/// as `[c_in][kernel]` (im2col), so the product runs as [`linear`].
#[allow(clippy::too_many_arguments)]
pub fn conv1d(
    x: &[f32],
    t_in: usize,
    c_in: usize,
    w: WeightRef,
    c_out: usize,
    kernel: usize,
    bias: Option<&[f32]>,
    stride: usize,
    pad: usize,
) -> Result<(Vec<f32>, usize)> {
    const OP: &str = "conv1d";
    if x.len() != t_in * c_in || stride == 0 || kernel == 0 || t_in + 2 * pad < kernel {
        return Err(mismatch(
            OP,
            format!(
                "x has {} values for {t_in}×{c_in}, kernel {kernel}, stride {stride}",
                x.len()
            ),
        ));
    }
    let t_out = (t_in + 2 * pad - kernel) / stride + 1;
    let cols = c_in * kernel;
    let mut unrolled = vec![0f32; t_out * cols];
    unrolled
        .par_chunks_mut(cols)
        .enumerate()
        .for_each(|(t, row)| {
            for j in 0..kernel {
                // Input time of tap j: t·stride + j - pad (outside [0, t_in): zero padding).
                let at = (t * stride + j).checked_sub(pad).filter(|&s| s < t_in);
                if let Some(s) = at {
                    let src = &x[s * c_in..(s + 1) * c_in];
                    for (c, &v) in src.iter().enumerate() {
                        row[c * kernel + j] = v;
                    }
                }
            }
        });
    Ok((linear(&unrolled, t_out, w, c_out, cols, bias)?, t_out))
}

/// One head's rows `[rows, head_dim]` gathered from `x: [rows, stride]` at column `offset`.
pub fn head_of(x: &[f32], rows: usize, stride: usize, offset: usize, head_dim: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(rows * head_dim);
    for r in 0..rows {
        out.extend_from_slice(&x[r * stride + offset..r * stride + offset + head_dim]);
    }
    out
}

/// Keys and values split by head for [`attention_heads`]: per head K `[tk, head_dim]` and Vᵀ
/// `[head_dim, tk]` (the weights of the two products), made once where many queries attend the
/// same keys (a decoder's cross-attention).
pub struct HeadsKv {
    n_heads: usize,
    head_dim: usize,
    tk: usize,
    k: Vec<Vec<f32>>,
    vt: Vec<Vec<f32>>,
}

impl HeadsKv {
    /// From `k, v: [tk, n_heads · head_dim]` rows.
    pub fn from_rows(k: &[f32], v: &[f32], tk: usize, n_heads: usize) -> Result<HeadsKv> {
        let d = k.len().checked_div(tk).unwrap_or(0);
        if n_heads == 0
            || d == 0
            || !d.is_multiple_of(n_heads)
            || k.len() != tk * d
            || v.len() != tk * d
        {
            return Err(mismatch(
                "attention",
                format!(
                    "k {} values, v {} ({tk} rows), {n_heads} heads",
                    k.len(),
                    v.len()
                ),
            ));
        }
        let hd = d / n_heads;
        let (k, vt) = (0..n_heads)
            .into_par_iter()
            .map(|h| {
                let kh = head_of(k, tk, d, h * hd, hd);
                let mut vt = vec![0f32; hd * tk];
                for t in 0..tk {
                    for c in 0..hd {
                        vt[c * tk + t] = v[t * d + h * hd + c];
                    }
                }
                (kh, vt)
            })
            .unzip();
        Ok(HeadsKv {
            n_heads,
            head_dim: hd,
            tk,
            k,
            vt,
        })
    }
}

impl HeadsKv {
    /// Head `head`'s attention scores before the softmax, `(q_h / √head_dim) · k_hᵀ`:
    /// `[tq, tk]` for queries `q: [tq, n_heads · head_dim]`, as [`attention_heads`] computes
    /// them.
    pub fn scores(&self, q: &[f32], tq: usize, head: usize) -> Result<Vec<f32>> {
        let (hd, d) = (self.head_dim, self.n_heads * self.head_dim);
        if head >= self.n_heads || q.len() != tq * d {
            return Err(mismatch(
                "attention scores",
                format!(
                    "head {head} of {}, q has {} values for {tq}×{d}",
                    self.n_heads,
                    q.len()
                ),
            ));
        }
        let scale = 1.0 / (hd as f32).sqrt();
        let mut qh = head_of(q, tq, d, head * hd, hd);
        qh.iter_mut().for_each(|x| *x *= scale);
        linear_f32(&qh, tq, &self.k[head], self.tk, hd, None)
    }

    /// Frames (keys) per head.
    pub fn keys(&self) -> usize {
        self.tk
    }

    pub fn heads(&self) -> usize {
        self.n_heads
    }
}

/// Scaled dot-product attention of `n_heads` heads: `q: [tq, d]`, `k, v: [tk, d]` (d = n_heads ·
/// head_dim, head h in columns h·head_dim ..), output `[tq, d]`. `causal_past: Some(p)` lets
/// query row i attend keys 0 ..= p + i (its position in a sequence whose first p keys came from
/// earlier steps); `None` attends every key. The queries are scaled by `1/√head_dim` before the
/// product, softmax rows sum in f64.
pub fn attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    (tq, tk): (usize, usize),
    n_heads: usize,
    causal_past: Option<usize>,
) -> Result<Vec<f32>> {
    let kv = HeadsKv::from_rows(k, v, tk, n_heads)?;
    attention_heads(q, tq, &kv, causal_past)
}

/// `e^x` in f32 arithmetic that vectorizes (no calls, no branches): `x = n·ln2 + r` with
/// `|r| ≤ ln2/2` (ln2 split in two for an exact `n·ln2_hi`), `e^r` by its Taylor polynomial to
/// degree 7 (truncation under 1e-8 relative), `2^n` by exponent bits. Within 2 ulp of `expf` for
/// normal results; below the smallest normal result (`x < -87.33`, `-∞` included) it gives 0.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75; // ln 2 rounded to 16 significant bits: n · LN2_HI is exact
    const LN2_LO: f32 = 1.428_606_8e-6; // ln 2 − LN2_HI
    const ROUND: f32 = 12_582_912.0; // 1.5 · 2²³: adding and subtracting it rounds to an integer
    const MIN: f32 = -87.336_55; // ln of the smallest normal f32
    const MAX: f32 = 88.722_83; // ln of the largest finite f32
    let clamped = x.clamp(MIN, MAX);
    let n = (clamped * LOG2E + ROUND) - ROUND;
    let r = (clamped - n * LN2_HI) - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0
                    + r * (1.0 / 24.0
                        + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
    // 2^n for n in [-126, 128]: n = 128 only at the top of the range, where 2^127 · 2p is used.
    let ni = n as i32;
    let (ni, p) = if ni > 127 { (127, p * 2.0) } else { (ni, p) };
    let scale = f32::from_bits(((ni + 127) as u32) << 23);
    if x < MIN {
        0.0
    } else {
        scale * p
    }
}

/// Softmax of one attention row in place: `e^(x − max)` by [`exp_f32`], summed in 16 f32 lanes
/// (then in f64), times `1 / sum`. Keys masked with `-∞` get 0. The same code compiled for the
/// CPU's vector width (the arithmetic is lane-wise, so every width gives the same bits).
pub fn softmax_row(row: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    match crate::cpu::path() {
        crate::cpu::Path::Avx512 => {
            // SAFETY: the path is only chosen on CPUs with AVX-512F.
            return unsafe { softmax_row_avx512(row) };
        }
        crate::cpu::Path::Avx2 => {
            // SAFETY: the path is only chosen on CPUs with AVX2 and FMA.
            return unsafe { softmax_row_avx2(row) };
        }
        _ => {}
    }
    softmax_row_body(row)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn softmax_row_avx512(row: &mut [f32]) {
    softmax_row_body(row)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn softmax_row_avx2(row: &mut [f32]) {
    softmax_row_body(row)
}

#[inline(always)]
fn softmax_row_body(row: &mut [f32]) {
    const LANES: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let mut chunks = row.chunks_exact(LANES);
    for c in &mut chunks {
        for (m, &v) in lanes.iter_mut().zip(c) {
            *m = m.max(v);
        }
    }
    let max = chunks.remainder().iter().fold(
        lanes.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)),
        |a, &b| a.max(b),
    );
    let mut sums = [0f32; LANES];
    let mut chunks = row.chunks_exact_mut(LANES);
    for c in &mut chunks {
        for (s, v) in sums.iter_mut().zip(c.iter_mut()) {
            *v = exp_f32(*v - max);
            *s += *v;
        }
    }
    let mut sum: f64 = sums.iter().map(|&s| s as f64).sum();
    for v in chunks.into_remainder() {
        *v = exp_f32(*v - max);
        sum += *v as f64;
    }
    let inv = (1.0 / sum) as f32;
    row.iter_mut().for_each(|v| *v *= inv);
}

/// Query rows × keys from which [`attention_heads`] runs its heads in parallel.
const PARALLEL_HEADS_MIN_SCORES: usize = 1 << 16;

/// [`attention`] with keys and values already split by head.
pub fn attention_heads(
    q: &[f32],
    tq: usize,
    kv: &HeadsKv,
    causal_past: Option<usize>,
) -> Result<Vec<f32>> {
    let HeadsKv {
        n_heads,
        head_dim: hd,
        tk,
        ..
    } = *kv;
    let d = n_heads * hd;
    if q.len() != tq * d {
        return Err(mismatch(
            "attention",
            format!("q has {} values, expected {tq}×{d}", q.len()),
        ));
    }
    let scale = 1.0 / (hd as f32).sqrt();
    let head = |h: usize| {
        let mut qh = head_of(q, tq, d, h * hd, hd);
        qh.iter_mut().for_each(|x| *x *= scale);
        let mut scores = linear_f32(&qh, tq, &kv.k[h], tk, hd, None)?;
        for (i, row) in scores.chunks_exact_mut(tk).enumerate() {
            if let Some(p) = causal_past {
                row.iter_mut()
                    .skip(p + i + 1)
                    .for_each(|s| *s = f32::NEG_INFINITY);
            }
            softmax_row(row);
        }
        linear_f32(&scores, tq, &kv.vt[h], hd, tk, None)
    };
    // Heads in parallel only for whole sequences: a decode step's heads are a few hundred
    // thousand multiply-adds, and its products already run on the spinning team, which rayon
    // workers would compete with for the cores.
    let heads: Vec<Result<Vec<f32>>> = if tq * tk >= PARALLEL_HEADS_MIN_SCORES {
        (0..n_heads).into_par_iter().map(head).collect()
    } else {
        (0..n_heads).map(head).collect()
    };
    let mut out = vec![0f32; tq * d];
    for (h, head) in heads.into_iter().enumerate() {
        let head = head?;
        for r in 0..tq {
            out[r * d + h * hd..r * d + (h + 1) * hd].copy_from_slice(&head[r * hd..(r + 1) * hd]);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tanh_is_close_to_libm() {
        let mut worst = 0f32;
        let mut xs: Vec<f32> = (-40_000..=40_000).map(|i| i as f32 * 1e-3).collect();
        xs.extend([
            0.0,
            -0.0,
            1e-30,
            -1e-30,
            100.0,
            -100.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
        ]);
        let mut y = xs.clone();
        tanh_inplace(&mut y);
        for (&x, &t) in xs.iter().zip(&y) {
            worst = worst.max((t - x.tanh()).abs());
            assert_eq!(t, tanh_f32(x));
        }
        assert!(worst < 1.2e-7, "worst absolute error {worst}");
    }

    fn naive_linear(x: &[f32], m: usize, w: &[f32], n: usize, k: usize) -> Vec<f32> {
        let mut y = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                y[i * n + j] = (0..k)
                    .map(|c| x[i * k + c] as f64 * w[j * k + c] as f64)
                    .sum::<f64>() as f32;
            }
        }
        y
    }

    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s % 2001) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn linear_matches_naive_with_bias() {
        let (m, n, k) = (5, 7, 40);
        let (x, w, b) = (values(m * k, 1), values(n * k, 2), values(n, 3));
        let y = linear_f32(&x, m, &w, n, k, Some(&b)).unwrap();
        let want = naive_linear(&x, m, &w, n, k);
        for i in 0..m * n {
            assert!(
                (y[i] - want[i] - b[i % n]).abs() < 1e-4,
                "{i}: {} vs {}",
                y[i],
                want[i] + b[i % n]
            );
        }
        assert!(linear_f32(&x, m, &w, n, k, Some(&b[..3])).is_err());
    }

    #[test]
    fn layer_norm_has_zero_mean_unit_variance() {
        let x = values(3 * 16, 4);
        let y = layer_norm(&x, &[1.0; 16], &[0.0; 16], 1e-5).unwrap();
        for row in y.chunks(16) {
            let mean: f32 = row.iter().sum::<f32>() / 16.0;
            let var: f32 = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / 16.0;
            assert!(
                mean.abs() < 1e-5 && (var - 1.0).abs() < 1e-3,
                "{mean} {var}"
            );
        }
        let z = layer_norm(&x, &[2.0; 16], &[0.5; 16], 1e-5).unwrap();
        assert!(y
            .iter()
            .zip(&z)
            .all(|(a, b)| (2.0 * a + 0.5 - b).abs() < 1e-5));
        assert!(layer_norm(&x[..20], &[1.0; 16], &[0.0; 16], 1e-5).is_err());
    }

    #[test]
    fn exp_f32_is_within_two_ulp_of_expf() {
        let mut worst = 0u32;
        let mut x = -87.3f32;
        while x < 88.7 {
            let (got, want) = (exp_f32(x), x.exp());
            let ulp = (got.to_bits() as i64 - want.to_bits() as i64).unsigned_abs() as u32;
            worst = worst.max(ulp);
            x += 0.000_731;
        }
        println!("exp_f32: worst {worst} ulp");
        assert!(worst <= 2, "worst {worst} ulp");
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(-100.0), 0.0);
        assert_eq!(exp_f32(0.0), 1.0);
        assert!(exp_f32(88.72).is_finite() && exp_f32(88.72) > 3.3e38);
    }

    #[test]
    fn erf_f32_within_6e7_of_libm() {
        let worst = (-6000..=6000)
            .map(|i| i as f32 * 0.001)
            .map(|x| (erf_f32(x) as f64 - libm::erf(x as f64)).abs())
            .fold(0f64, f64::max);
        assert!(worst < 6e-7, "{worst}");
        assert!(erf_f32(0.0).abs() < 6e-7);
        assert_eq!(erf_f32(10.0), 1.0);
        assert_eq!(erf_f32(-10.0), -1.0);
        let mut v = vec![0.7f32; 37];
        gelu_erf_inplace(&mut v);
        assert!(v.iter().all(|&g| g == gelu_erf(0.7)));
    }

    #[test]
    fn gelu_erf_known_values() {
        // 0.5 x (1 + erf(x / √2)) at x = 1: 0.841344746; x = -2: -0.045500264.
        assert!((gelu_erf(1.0) - 0.841_344_7).abs() < 1e-6);
        assert!((gelu_erf(-2.0) + 0.045_500_26).abs() < 3e-7);
        assert_eq!(gelu_erf(0.0), 0.0);
    }

    #[test]
    fn conv1d_matches_direct_sum() {
        let (t_in, c_in, c_out, kernel) = (9, 3, 4, 3);
        let (x, w, b) = (
            values(t_in * c_in, 5),
            values(c_out * c_in * kernel, 6),
            values(c_out, 7),
        );
        for stride in [1, 2] {
            let (y, t_out) = conv1d(
                &x,
                t_in,
                c_in,
                WeightRef::F32(&w),
                c_out,
                kernel,
                Some(&b),
                stride,
                1,
            )
            .unwrap();
            assert_eq!(t_out, (t_in + 2 - kernel) / stride + 1);
            for t in 0..t_out {
                for o in 0..c_out {
                    let mut want = b[o] as f64;
                    for c in 0..c_in {
                        for j in 0..kernel {
                            let s = (t * stride + j) as isize - 1;
                            if s >= 0 && (s as usize) < t_in {
                                want += x[s as usize * c_in + c] as f64
                                    * w[(o * c_in + c) * kernel + j] as f64;
                            }
                        }
                    }
                    assert!((y[t * c_out + o] as f64 - want).abs() < 1e-4);
                }
            }
        }
    }

    #[test]
    fn attention_matches_naive_causal_and_full() {
        let (tq, tk, heads, hd) = (3, 5, 2, 4);
        let d = heads * hd;
        let (q, k, v) = (values(tq * d, 8), values(tk * d, 9), values(tk * d, 10));
        for past in [None, Some(2)] {
            let out = attention(&q, &k, &v, (tq, tk), heads, past).unwrap();
            for h in 0..heads {
                for i in 0..tq {
                    let last = past.map_or(tk - 1, |p| p + i);
                    let s: Vec<f64> = (0..=last)
                        .map(|t| {
                            (0..hd)
                                .map(|c| {
                                    q[i * d + h * hd + c] as f64 * k[t * d + h * hd + c] as f64
                                })
                                .sum::<f64>()
                                / (hd as f64).sqrt()
                        })
                        .collect();
                    let mx = s.iter().cloned().fold(f64::MIN, f64::max);
                    let z: f64 = s.iter().map(|x| (x - mx).exp()).sum();
                    for c in 0..hd {
                        let want: f64 = s
                            .iter()
                            .enumerate()
                            .map(|(t, x)| (x - mx).exp() / z * v[t * d + h * hd + c] as f64)
                            .sum();
                        assert!((out[i * d + h * hd + c] as f64 - want).abs() < 1e-5);
                    }
                }
            }
        }
        assert!(attention(&q, &k[..8], &v, (tq, tk), heads, None).is_err());
    }
}
