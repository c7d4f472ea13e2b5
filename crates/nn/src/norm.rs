use crate::{Result, VarBuilder};

/// RMSNorm: `y = x / sqrt(mean(x²) + eps) * w`, per row of `w.len()` values.
///
/// GGUF files store Gemma's `(1 + w)` already folded into `w`, so one convention serves all.
#[derive(Debug, Clone)]
pub struct RmsNorm {
    pub weight: Vec<f32>,
    pub eps: f32,
}

impl RmsNorm {
    pub fn load(vb: &VarBuilder, name: &str, dim: usize, eps: f32) -> Result<RmsNorm> {
        let w = vb.get(&format!("{name}.weight"))?;
        w.expect_shape(&[dim])?;
        Ok(RmsNorm {
            weight: w.to_f32()?,
            eps,
        })
    }

    /// Normalizes every `weight.len()`-long row of `x` in place (rows may be attention heads).
    pub fn forward_inplace(&self, x: &mut [f32]) {
        let dim = self.weight.len();
        for row in x.chunks_exact_mut(dim) {
            rms_norm_row(row, &self.weight, self.eps);
        }
    }

    pub fn forward(&self, x: &[f32]) -> Vec<f32> {
        let mut y = x.to_vec();
        self.forward_inplace(&mut y);
        y
    }
}

/// One row in place. The sum of squares accumulates in f64, as ggml does, so long rows keep
/// full f32 precision.
pub fn rms_norm_row(row: &mut [f32], weight: &[f32], eps: f32) {
    let sum: f64 = row.iter().map(|&v| (v * v) as f64).sum();
    let mean = (sum / row.len() as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    for (v, w) in row.iter_mut().zip(weight) {
        *v = *v * scale * w;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_rms_after_norm() {
        let norm = RmsNorm {
            weight: vec![1.0; 4],
            eps: 0.0,
        };
        let y = norm.forward(&[1.0, -2.0, 3.0, -4.0, 2.0, 2.0, 2.0, 2.0]);
        for row in y.chunks(4) {
            let ms: f32 = row.iter().map(|v| v * v).sum::<f32>() / 4.0;
            assert!((ms - 1.0).abs() < 1e-6, "{ms}");
        }
        assert!((y[4] - 1.0).abs() < 1e-6);
    }
}
