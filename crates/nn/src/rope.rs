/// How rotary dimensions are paired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// GPT-J / original Llama: pairs `(x[2i], x[2i+1])`.
    Normal,
    /// GPT-NeoX: pairs `(x[i], x[i + n_rot/2])` (Qwen, Gemma).
    Neox,
}

/// Rotary position embedding over the first `n_rot` dimensions of each head.
///
/// Angles follow ggml: `theta_i = pos * freq_scale * base^(-2i/n_rot)` with the power built by
/// repeated f32 multiplication, so positions far into the context get the same angles as
/// llama.cpp's.
#[derive(Debug, Clone)]
pub struct Rope {
    pub n_rot: usize,
    pub base: f32,
    pub freq_scale: f32,
    pub style: RopeStyle,
    /// Per-pair divisors of the angle (`rope_freqs.weight`, Llama 3.1 long-context scaling).
    pub freq_factors: Option<Vec<f32>>,
}

impl Rope {
    /// `(cos, sin)` for each of the `n_rot / 2` pairs at `pos`.
    pub fn angles(&self, pos: usize, cos: &mut [f32], sin: &mut [f32]) {
        let theta_scale = self.base.powf(-2.0 / self.n_rot as f32);
        let mut theta = pos as f32;
        for (i, (c, s)) in cos.iter_mut().zip(sin.iter_mut()).enumerate() {
            let factor = self.freq_factors.as_ref().map_or(1.0, |f| f[i]);
            let t = self.freq_scale * (theta / factor);
            *c = t.cos();
            *s = t.sin();
            theta *= theta_scale;
        }
    }

    /// Rotates `x: [rows, n_heads * head_dim]`, row `r` at `positions[r]`.
    pub fn apply(&self, x: &mut [f32], n_heads: usize, head_dim: usize, positions: &[usize]) {
        let half = self.n_rot / 2;
        let mut cos = vec![0f32; half];
        let mut sin = vec![0f32; half];
        for (row, &pos) in x.chunks_exact_mut(n_heads * head_dim).zip(positions) {
            self.angles(pos, &mut cos, &mut sin);
            for head in row.chunks_exact_mut(head_dim) {
                for i in 0..half {
                    let (a, b) = match self.style {
                        RopeStyle::Normal => (2 * i, 2 * i + 1),
                        RopeStyle::Neox => (i, i + half),
                    };
                    let (x0, x1) = (head[a], head[b]);
                    head[a] = x0 * cos[i] - x1 * sin[i];
                    head[b] = x0 * sin[i] + x1 * cos[i];
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_preserves_norm_and_position_zero_is_identity() {
        for style in [RopeStyle::Normal, RopeStyle::Neox] {
            let rope = Rope {
                n_rot: 8,
                base: 10000.0,
                freq_scale: 1.0,
                style,
                freq_factors: None,
            };
            let orig: Vec<f32> = (0..16).map(|i| i as f32 * 0.3 - 2.0).collect();
            let mut x = orig.clone();
            rope.apply(&mut x, 2, 8, &[0]);
            assert_eq!(x, orig);
            rope.apply(&mut x, 2, 8, &[37]);
            for (h, o) in x.chunks(8).zip(orig.chunks(8)) {
                let n1: f32 = h.iter().map(|v| v * v).sum();
                let n0: f32 = o.iter().map(|v| v * v).sum();
                assert!((n1 - n0).abs() < 1e-3);
            }
            assert_ne!(x, orig);
        }
    }

    #[test]
    fn neox_pairs_first_with_half() {
        let rope = Rope {
            n_rot: 4,
            base: 10000.0,
            freq_scale: 1.0,
            style: RopeStyle::Neox,
            freq_factors: None,
        };
        // Only x[0] set: rotation at pos 1 moves it into x[2] (its pair), not x[1].
        let mut x = vec![1.0, 0.0, 0.0, 0.0];
        rope.apply(&mut x, 1, 4, &[1]);
        assert!((x[0] - 1f32.cos()).abs() < 1e-6 && (x[2] - 1f32.sin()).abs() < 1e-6);
        assert_eq!(x[1], 0.0);
    }
}
