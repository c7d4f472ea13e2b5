use half::f16;
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

use crate::{ggml_math, NnError, Result};

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
    k: Vec<f16>,
    v: Vec<f16>,
    n_kv_heads: usize,
    head_dim: usize,
    capacity: usize,
}

impl LayerKv {
    /// A zeroed cache; an allocation the machine cannot satisfy is an error, not an abort.
    pub fn new(n_kv_heads: usize, head_dim: usize, capacity: usize) -> Result<LayerKv> {
        let n = n_kv_heads
            .checked_mul(capacity)
            .and_then(|v| v.checked_mul(head_dim))
            .ok_or(NnError::OutOfMemory { bytes: usize::MAX })?;
        let zeroed = || -> Result<Vec<f16>> {
            let mut v = Vec::new();
            v.try_reserve_exact(n).map_err(|_| NnError::OutOfMemory {
                bytes: n.saturating_mul(4),
            })?;
            v.resize(n, f16::ZERO);
            Ok(v)
        };
        Ok(LayerKv {
            k: zeroed()?,
            v: zeroed()?,
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

    fn head_values(&self, h: usize) -> &[f16] {
        let len = self.capacity * self.head_dim;
        &self.v[h * len..(h + 1) * len]
    }

    pub fn bytes(&self) -> usize {
        (self.k.len() + self.v.len()) * 2
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
            let rows = chunk * ROWS_PER_TASK..((chunk + 1) * ROWS_PER_TASK).min(positions.len());
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
                // Scores for positions first..=pos side by side, each an f64 sum over dimensions
                // in order (the order of ggml's f16 dot product): vectorises across positions.
                let n = pos + 1 - first;
                let mut dots = vec![0f64; n];
                for (d, &qd) in qh.iter().enumerate() {
                    let kd = &keys[d * span + (first - lo)..][..n];
                    for (acc, &k) in dots.iter_mut().zip(kd) {
                        *acc += (k * qd) as f64;
                    }
                }
                // At their absolute positions, padded to whole groups of four with masked
                // entries, as ggml lays out its (256-padded) KV rows: the softmax groups by index.
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

#[cfg(test)]
mod tests {
    use super::*;

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
