use half::f16;
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

use crate::attention_kernels as kernels;
use crate::{NnError, Result};

/// The shape of one attention layer.
#[derive(Debug, Clone, Copy)]
pub struct AttentionSpec {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Multiplies `q·k` before the softmax (models that pre-scale `q` pass 1).
    pub scale: f32,
    /// Sliding window: a query at `p` sees keys at `p - window < k <= p`. `None`: all of `0..=p`.
    pub window: Option<usize>,
}

/// One layer's keys and values in f16 (llama.cpp's default cache type). Keys are stored
/// transposed, `[n_kv_heads, head_dim, capacity]`, so that scores for many positions are computed
/// side by side (each still summed over `head_dim` in order); values are
/// `[n_kv_heads, capacity, head_dim]`.
#[derive(Debug, Clone)]
pub struct LayerKv {
    k: ZeroedF16,
    v: ZeroedF16,
    n_kv_heads: usize,
    head_dim: usize,
    capacity: usize,
}

/// f16 values zeroed by the system allocator (calloc), whatever the global allocator is: a
/// large allocation then comes from fresh zero pages of the OS, so the pages of positions never
/// written are never touched and a large context costs memory only as it fills. (mimalloc, the
/// binary's allocator, zeroes such blocks itself.)
struct ZeroedF16 {
    ptr: std::ptr::NonNull<f16>,
    len: usize,
}

// SAFETY: ZeroedF16 owns its buffer exclusively, like a Vec<f16>.
unsafe impl Send for ZeroedF16 {}
unsafe impl Sync for ZeroedF16 {}

impl ZeroedF16 {
    /// `len` zeros; an allocation the machine cannot satisfy is an error, not an abort.
    fn new(len: usize) -> Result<ZeroedF16> {
        use std::alloc::GlobalAlloc;
        let oom = NnError::OutOfMemory {
            bytes: len.saturating_mul(2),
        };
        if len == 0 {
            return Ok(ZeroedF16 {
                ptr: std::ptr::NonNull::dangling(),
                len: 0,
            });
        }
        let layout = std::alloc::Layout::array::<f16>(len).map_err(|_| oom)?;
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::System.alloc_zeroed(layout) }.cast::<f16>();
        let ptr = std::ptr::NonNull::new(p).ok_or(NnError::OutOfMemory {
            bytes: len.saturating_mul(2),
        })?;
        Ok(ZeroedF16 { ptr, len })
    }
}

impl std::fmt::Debug for ZeroedF16 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ZeroedF16({} values)", self.len)
    }
}

impl Clone for ZeroedF16 {
    /// A copy (of every value, so every page is touched). Panics, like `Vec::clone`, if the
    /// memory cannot be had.
    fn clone(&self) -> ZeroedF16 {
        let Ok(mut copy) = ZeroedF16::new(self.len) else {
            std::alloc::handle_alloc_error(
                std::alloc::Layout::array::<f16>(self.len)
                    .unwrap_or(std::alloc::Layout::new::<f16>()),
            );
        };
        copy.copy_from_slice(self);
        copy
    }
}

impl Drop for ZeroedF16 {
    fn drop(&mut self) {
        use std::alloc::GlobalAlloc;
        if self.len > 0 {
            // SAFETY: allocated by `System` with exactly this layout (it was valid then).
            unsafe {
                let layout = std::alloc::Layout::array::<f16>(self.len).unwrap_unchecked();
                std::alloc::System.dealloc(self.ptr.as_ptr().cast(), layout);
            }
        }
    }
}

impl std::ops::Deref for ZeroedF16 {
    type Target = [f16];
    fn deref(&self) -> &[f16] {
        // SAFETY: `len` initialised f16s (all-zero bits are +0.0), owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for ZeroedF16 {
    fn deref_mut(&mut self) -> &mut [f16] {
        // SAFETY: as `deref`, borrowed mutably through self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl LayerKv {
    /// A zeroed cache; an allocation the machine cannot satisfy is an error, not an abort. The
    /// keys are followed by [`kernels::KEY_PAD`] zeros, which the SIMD kernel may read past the
    /// last position (into lanes it discards).
    pub fn new(n_kv_heads: usize, head_dim: usize, capacity: usize) -> Result<LayerKv> {
        let n = n_kv_heads
            .checked_mul(capacity)
            .and_then(|v| v.checked_mul(head_dim))
            .ok_or(NnError::OutOfMemory { bytes: usize::MAX })?;
        Ok(LayerKv {
            k: ZeroedF16::new(n + kernels::KEY_PAD)?,
            v: ZeroedF16::new(n)?,
            n_kv_heads,
            head_dim,
            capacity,
        })
    }

    /// Stores `k, v: [rows, n_kv_heads * head_dim]` at `positions`.
    pub fn write(&mut self, k: &[f32], v: &[f32], positions: &[usize]) -> Result<()> {
        let width = self.n_kv_heads * self.head_dim;
        for ((krow, vrow), &pos) in k
            .chunks_exact(width)
            .zip(v.chunks_exact(width))
            .zip(positions)
        {
            if pos >= self.capacity {
                return Err(NnError::ContextFull {
                    pos,
                    capacity: self.capacity,
                });
            }
            for h in 0..self.n_kv_heads {
                let v_dst = (h * self.capacity + pos) * self.head_dim;
                let src = h * self.head_dim;
                for d in 0..self.head_dim {
                    self.k[(src + d) * self.capacity + pos] = f16::from_f32(krow[src + d]);
                    self.v[v_dst + d] = f16::from_f32(vrow[src + d]);
                }
            }
        }
        Ok(())
    }

    /// Keys of head `h`, dimension `d`, for every position.
    fn key_dim(&self, h: usize, d: usize) -> &[f16] {
        let start = (h * self.head_dim + d) * self.capacity;
        &self.k[start..start + self.capacity]
    }

    /// Keys of head `h` from dimension 0 to the end of the cache (with the padding):
    /// dimension `d` of position `p` at `d * capacity + p`.
    fn head_keys(&self, h: usize) -> &[f16] {
        &self.k[h * self.head_dim * self.capacity..]
    }

    fn head_values(&self, h: usize) -> &[f16] {
        let len = self.capacity * self.head_dim;
        &self.v[h * len..(h + 1) * len]
    }

    pub fn bytes(&self) -> usize {
        (self.k.len() - kernels::KEY_PAD + self.v.len()) * 2
    }
}

/// Causal attention of `q: [rows, n_heads * head_dim]` (row `r` at `positions[r]`) over the
/// cache. Returns `[rows, n_heads * head_dim]`.
///
/// The arithmetic is exactly that of llama.cpp's portable CPU path (flash attention off):
/// `q` rounded to f16; each score an f64 sum of exact f16×f16 products, rounded to f32, times
/// `scale`; softmax with f32 `exp` and an f64 normaliser; probabilities rounded to f16 and
/// each output an f64 sum of exact f16×f16 products.
pub fn attend(spec: &AttentionSpec, q: &[f32], kv: &LayerKv, positions: &[usize]) -> Vec<f32> {
    attend_with(spec, q, kv, positions, true)
}

/// Below this many (head × attended position × head dimension) products, a single query row's
/// attention runs on the calling thread.
const SERIAL_ATTENTION_WORK: usize = 1 << 20;

/// [`attend`], with the SIMD kernels allowed (`simd`, where the CPU has them) or not: both give
/// identical bits.
fn attend_with(
    spec: &AttentionSpec,
    q: &[f32],
    kv: &LayerKv,
    positions: &[usize],
    simd: bool,
) -> Vec<f32> {
    /// Query rows of one task.
    const ROWS_PER_TASK: usize = 32;
    /// Query rows whose scores and outputs are computed together (each key and value loaded
    /// once for all of them).
    const ROWS_PER_BLOCK: usize = 8;
    let hd = spec.head_dim;
    let width = spec.n_heads * hd;
    let group = spec.n_heads / spec.n_kv_heads;
    let first_of = |pos: usize| spec.window.map_or(0, |w| (pos + 1).saturating_sub(w));
    let chunks = positions.len().div_ceil(ROWS_PER_TASK);
    let use_simd = simd && kernels::simd_available() && hd.is_multiple_of(8);
    // Small jobs (a decode step over a short context) stay on the calling thread: waking the
    // pool costs more than the work.
    let span_max = positions.iter().max().map_or(0, |&p| p + 1);
    let parallel = positions.len() > 1 || spec.n_heads * span_max * hd >= SERIAL_ATTENTION_WORK;
    // Task (head, chunk of rows) -> [rows in chunk, hd] outputs.
    let task = |task: usize| {
        let (h, chunk) = (task / chunks, task % chunks);
        let rows = chunk * ROWS_PER_TASK..((chunk + 1) * ROWS_PER_TASK).min(positions.len());
        let kvh = h / group;
        let lo = rows
            .clone()
            .map(|r| first_of(positions[r]))
            .min()
            .unwrap_or(0);
        let hi = rows.clone().map(|r| positions[r]).max().unwrap_or(0);
        let span = hi + 1 - lo;
        let values16 = &kv.head_values(kvh)[lo * hd..(hi + 1) * hd];
        // (f16 infinities and NaNs have all exponent bits set; no short cut, so this
        // vectorises.)
        let values_finite = values16
            .iter()
            .fold(true, |ok, v| ok & (v.to_bits() & 0x7c00 != 0x7c00));
        // The SIMD kernels read the f16 cache. The scalar ones take keys dimension-major and
        // values position-major as exact f32 copies of the f16s (prefill converts each
        // cached value once per chunk instead of once per row).
        let (mut keys, mut values) = (Vec::new(), Vec::new());
        if !use_simd {
            keys = vec![0f32; hd * span];
            for (d, dst) in keys.chunks_exact_mut(span).enumerate() {
                kv.key_dim(kvh, d)[lo..=hi].convert_to_f32_slice(dst);
            }
            values = vec![0f32; span * hd];
            values16.convert_to_f32_slice(&mut values);
        }
        // Queries rounded to f16 (exact in f64).
        let mut q16 = vec![f16::ZERO; rows.len() * hd];
        for (row, dst) in rows.clone().zip(q16.chunks_exact_mut(hd)) {
            dst.convert_from_f32_slice(&q[row * width + h * hd..][..hd]);
        }
        let mut q32 = vec![0f32; q16.len()];
        q16.convert_to_f32_slice(&mut q32);
        let qh: Vec<f64> = q32.iter().map(|&v| v as f64).collect();
        let mut out = Vec::with_capacity(rows.len() * hd);
        let (mut dots, mut weights, mut probs, mut acc) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut probs16, mut rounded) = (Vec::new(), Vec::new());
        for block_start in rows.clone().step_by(ROWS_PER_BLOCK) {
            let block = block_start..(block_start + ROWS_PER_BLOCK).min(rows.end);
            let nb = block.len();
            let blo = block
                .clone()
                .map(|r| first_of(positions[r]))
                .min()
                .unwrap_or(0);
            let bhi = block.clone().map(|r| positions[r]).max().unwrap_or(0);
            let n = bhi + 1 - blo;
            // Scores for positions blo..=bhi of every row in the block, each an f64 sum over
            // dimensions in order (the order of ggml's f16 dot product).
            let stride = kernels::padded_positions(n, nb);
            dots.clear();
            dots.resize(nb * stride, 0f64);
            let qb = &qh[(block.start - rows.start) * hd..(block.end - rows.start) * hd];
            if use_simd {
                let keys = kv.head_keys(kvh);
                kernels::scores_simd(qb, hd, keys, kv.capacity, blo, n, &mut dots);
            } else {
                kernels::scores_scalar(qb, hd, &keys, span, blo - lo, n, &mut dots);
            }
            // Probabilities rounded to f16, position-major: weights[j * nb + i] for position
            // blo + j of row i (zero outside the row's range).
            weights.clear();
            weights.resize(n * nb, 0f64);
            for (i, row) in block.clone().enumerate() {
                let pos = positions[row];
                let first = first_of(pos);
                // At their absolute positions, padded to whole groups of four with masked
                // entries, as ggml lays out its (256-padded) KV rows: the softmax groups by
                // index.
                // Groups wholly before `first` (all masked) add exactly zero to the softmax
                // total and get probability zero, so the row starts at `first`'s group.
                let base = first / 4 * 4;
                probs.clear();
                probs.resize((pos + 1).next_multiple_of(4) - base, f32::NEG_INFINITY);
                let dr = &dots[i * stride + (first - blo)..][..pos + 1 - first];
                for (score, dot) in probs[first - base..=pos - base].iter_mut().zip(dr) {
                    *score = *dot as f32 * spec.scale;
                }
                kernels::softmax(use_simd, &mut probs);
                let m = pos + 1 - first;
                probs16.clear();
                probs16.resize(m, f16::ZERO);
                probs16.convert_from_f32_slice(&probs[first - base..=pos - base]);
                rounded.clear();
                rounded.resize(m, 0f32);
                probs16.convert_to_f32_slice(&mut rounded);
                for (j, &w) in rounded.iter().enumerate() {
                    weights[(first - blo + j) * nb + i] = w as f64;
                }
            }
            // Outputs, each an f64 sum over positions in order.
            acc.clear();
            acc.resize(nb * hd, 0f64);
            let (w, vb) = (&weights, (blo - lo) * hd);
            match (use_simd, values_finite) {
                (true, true) => kernels::outputs_simd(w, nb, n, &values16[vb..], hd, &mut acc),
                (true, false) => kernels::outputs_scalar(w, nb, n, &values16[vb..], hd, &mut acc),
                (false, _) => kernels::outputs_scalar(w, nb, n, &values[vb..], hd, &mut acc),
            }
            out.extend(acc.iter().map(|&a| a as f32));
        }
        out
    };
    let results: Vec<Vec<f32>> = if parallel {
        (0..spec.n_heads * chunks)
            .into_par_iter()
            .map(task)
            .collect()
    } else {
        (0..spec.n_heads * chunks).map(task).collect()
    };
    let mut out = vec![0f32; positions.len() * width];
    for (task, block) in results.iter().enumerate() {
        let (h, chunk) = (task / chunks, task % chunks);
        for (i, row_out) in block.chunks_exact(hd).enumerate() {
            let row = chunk * ROWS_PER_TASK + i;
            out[row * width + h * hd..][..hd].copy_from_slice(row_out);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ggml_math;

    /// Reference attention in f64 without any f16 rounding.
    fn naive(
        spec: &AttentionSpec,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        positions: &[usize],
    ) -> Vec<f32> {
        let hd = spec.head_dim;
        let kvw = spec.n_kv_heads * hd;
        let mut out = vec![0f32; positions.len() * spec.n_heads * hd];
        for (r, &pos) in positions.iter().enumerate() {
            for h in 0..spec.n_heads {
                let kvh = h / (spec.n_heads / spec.n_kv_heads);
                let first = spec.window.map_or(0, |w| (pos + 1).saturating_sub(w));
                let qh = &q[(r * spec.n_heads + h) * hd..][..hd];
                let s: Vec<f64> = (first..=pos)
                    .map(|p| {
                        (0..hd)
                            .map(|d| qh[d] as f64 * k[p * kvw + kvh * hd + d] as f64)
                            .sum::<f64>()
                            * spec.scale as f64
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for d in 0..hd {
                    let acc: f64 = (first..=pos)
                        .zip(&e)
                        .map(|(p, w)| w / z * v[p * kvw + kvh * hd + d] as f64)
                        .sum();
                    out[(r * spec.n_heads + h) * hd + d] = acc as f32;
                }
            }
        }
        out
    }

    /// `attend` as it was before the SIMD kernels (one row at a time, f32 products widened to
    /// f64): the new code must reproduce it bit for bit.
    fn original(spec: &AttentionSpec, q: &[f32], kv: &LayerKv, positions: &[usize]) -> Vec<f32> {
        /// Query rows sharing one f32 copy of their keys and values (prefill converts each cached
        /// f16 value once per chunk instead of once per row).
        const ROWS_PER_TASK: usize = 32;
        let hd = spec.head_dim;
        let width = spec.n_heads * hd;
        let group = spec.n_heads / spec.n_kv_heads;
        let first_of = |pos: usize| spec.window.map_or(0, |w| (pos + 1).saturating_sub(w));
        let chunks = positions.len().div_ceil(ROWS_PER_TASK);
        // Task (head, chunk of rows) -> [rows in chunk, hd] outputs.
        let results: Vec<Vec<f32>> = (0..spec.n_heads * chunks)
            .into_par_iter()
            .map(|task| {
                let (h, chunk) = (task / chunks, task % chunks);
                let rows =
                    chunk * ROWS_PER_TASK..((chunk + 1) * ROWS_PER_TASK).min(positions.len());
                let kvh = h / group;
                let lo = rows
                    .clone()
                    .map(|r| first_of(positions[r]))
                    .min()
                    .unwrap_or(0);
                let hi = rows.clone().map(|r| positions[r]).max().unwrap_or(0);
                let span = hi + 1 - lo;
                // Keys dimension-major and values position-major, as exact f32 copies of the f16s.
                let mut keys = vec![0f32; hd * span];
                for (d, dst) in keys.chunks_exact_mut(span).enumerate() {
                    kv.key_dim(kvh, d)[lo..=hi].convert_to_f32_slice(dst);
                }
                let mut values = vec![0f32; span * hd];
                kv.head_values(kvh)[lo * hd..(hi + 1) * hd].convert_to_f32_slice(&mut values);
                let mut out = Vec::with_capacity(rows.len() * hd);
                for row in rows {
                    let pos = positions[row];
                    let first = first_of(pos);
                    let qh: Vec<f32> = q[row * width + h * hd..row * width + (h + 1) * hd]
                        .iter()
                        .map(|&v| f16::from_f32(v).to_f32())
                        .collect();
                    // Scores for positions first..=pos side by side, each an f64 sum over
                    // dimensions in order.
                    let n = pos + 1 - first;
                    let mut dots = vec![0f64; n];
                    for (d, &qd) in qh.iter().enumerate() {
                        let kd = &keys[d * span + (first - lo)..][..n];
                        for (acc, &k) in dots.iter_mut().zip(kd) {
                            *acc += (k * qd) as f64;
                        }
                    }
                    // At their absolute positions, padded to whole groups of four with masked
                    // entries: the softmax groups by index.
                    let mut probs = vec![f32::NEG_INFINITY; (pos + 1).next_multiple_of(4)];
                    for (score, dot) in probs[first..=pos].iter_mut().zip(&dots) {
                        *score = *dot as f32 * spec.scale;
                    }
                    ggml_math::softmax_inplace(&mut probs);
                    let mut acc = vec![0f64; hd];
                    for p in first..=pos {
                        let w = f16::from_f32(probs[p]).to_f32();
                        if w == 0.0 {
                            // Adds exactly nothing in the reference either.
                            continue;
                        }
                        let v = &values[(p - lo) * hd..][..hd];
                        for (a, &vv) in acc.iter_mut().zip(v) {
                            *a += (vv * w) as f64;
                        }
                    }
                    out.extend(acc.iter().map(|&a| a as f32));
                }
                out
            })
            .collect();
        let mut out = vec![0f32; positions.len() * width];
        for (task, block) in results.iter().enumerate() {
            let (h, chunk) = (task / chunks, task % chunks);
            for (i, row_out) in block.chunks_exact(hd).enumerate() {
                let row = chunk * ROWS_PER_TASK + i;
                out[row * width + h * hd..][..hd].copy_from_slice(row_out);
            }
        }
        out
    }

    fn pseudo_random(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1664525).wrapping_add(1013904223);
                (s >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn matches_naive_with_gqa_and_window() {
        for window in [None, Some(3)] {
            let spec = AttentionSpec {
                n_heads: 4,
                n_kv_heads: 2,
                head_dim: 8,
                scale: 0.35,
                window,
            };
            let n = 7;
            let k = pseudo_random(n * 16, 1);
            let v = pseudo_random(n * 16, 2);
            let q = pseudo_random(n * 32, 3);
            let positions: Vec<usize> = (0..n).collect();
            let mut kv = LayerKv::new(2, 8, 16).unwrap();
            kv.write(&k, &v, &positions).unwrap();
            let got = attend(&spec, &q, &kv, &positions);
            let want = naive(&spec, &q, &k, &v, &positions);
            let err: f32 = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            assert!(err < 5e-3, "max error {err} (window {window:?})");
        }
    }

    /// The SIMD and scalar kernels give the bits of the original code, for prefill chunks,
    /// single decode rows, GQA, sliding windows, head sizes that are not multiples of 16 or 8,
    /// large magnitudes and a non-finite value.
    #[test]
    fn kernels_match_the_original_bit_for_bit() {
        let cases: [(usize, usize, usize, Option<usize>, usize); 7] = [
            (4, 1, 256, None, 70),
            (4, 2, 64, Some(5), 45),
            (2, 2, 24, None, 37),
            (3, 1, 8, Some(40), 33),
            (2, 1, 12, None, 19),
            (2, 1, 48, Some(17), 50),
            (1, 1, 32, None, 1),
        ];
        for (seed, &(n_heads, n_kv_heads, hd, window, n)) in cases.iter().enumerate() {
            let spec = AttentionSpec {
                n_heads,
                n_kv_heads,
                head_dim: hd,
                scale: 0.125,
                window,
            };
            let seed = seed as u32 * 10;
            let big = |x: f32| x * 40.0;
            let k: Vec<f32> = pseudo_random(n * n_kv_heads * hd, seed + 1)
                .into_iter()
                .map(big)
                .collect();
            let mut v = pseudo_random(n * n_kv_heads * hd, seed + 2);
            if seed == 50 {
                // An f16 overflow in a value: the SIMD output kernel must step aside.
                v[3 * n_kv_heads * hd + 1] = 1e6;
            }
            let q = pseudo_random(n * n_heads * hd, seed + 3);
            let mut kv = LayerKv::new(n_kv_heads, hd, n + 8).unwrap();
            let all: Vec<usize> = (0..n).collect();
            kv.write(&k, &v, &all).unwrap();
            // Prefill of everything, a continuation chunk, and a single decode row.
            let split = n / 3;
            for rows in [0..n, split..n, n - 1..n] {
                let positions: Vec<usize> = rows.clone().collect();
                let qr = &q[rows.start * n_heads * hd..rows.end * n_heads * hd];
                let want = original(&spec, qr, &kv, &positions);
                for simd in [true, false] {
                    let got = attend_with(&spec, qr, &kv, &positions, simd);
                    let same = got
                        .iter()
                        .zip(&want)
                        .all(|(x, y)| x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()));
                    assert!(
                        same,
                        "case {n_heads}/{n_kv_heads}/{hd}/{window:?}, rows {rows:?}, simd {simd}"
                    );
                }
            }
        }
    }

    #[test]
    fn writing_past_capacity_is_an_error() {
        let mut kv = LayerKv::new(1, 2, 4).unwrap();
        let r = kv.write(&[0.0; 2], &[0.0; 2], &[4]);
        assert!(matches!(
            r,
            Err(NnError::ContextFull {
                pos: 4,
                capacity: 4
            })
        ));
    }
}
