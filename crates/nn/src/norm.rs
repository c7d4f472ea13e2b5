use crate::{Backend, Result, VarBuilder};

/// RMSNorm: `y = x / sqrt(mean(x²) + eps) * w`, per piece of `w.len()` values (a whole row,
/// or one attention head).
///
/// GGUF files store Gemma's `(1 + w)` already folded into `w`, so one convention serves all.
pub struct RmsNorm<B: Backend> {
    pub weight: B::Vector,
    pub eps: f32,
}

impl<B: Backend> RmsNorm<B> {
    pub fn load(be: &B, vb: &VarBuilder, name: &str, dim: usize, eps: f32) -> Result<Self> {
        let w = vb.get(&format!("{name}.weight"))?;
        w.expect_shape(&[dim])?;
        Ok(RmsNorm {
            weight: be.vector(w.to_f32()?)?,
            eps,
        })
    }

    pub fn forward(&self, be: &B, x: &B::Tensor) -> Result<B::Tensor> {
        be.rms_norm(x, &self.weight, self.eps)
    }

    /// [`RmsNorm::forward`] for an output that feeds the linear layers `consumers` (the backend
    /// may prepare their input in the same step).
    pub fn forward_for(
        &self,
        be: &B,
        x: &B::Tensor,
        consumers: &[&crate::Linear<B>],
    ) -> Result<B::Tensor> {
        let ws: Vec<&B::Matrix> = consumers.iter().map(|l| &l.weight).collect();
        be.rms_norm_for(x, &self.weight, self.eps, &ws)
    }

    /// Every layer of `layers` applied to the normalised `x`, when nothing else needs the
    /// normalised rows (the backend may normalise inside the products).
    pub fn forward_linear_many<const N: usize>(
        &self,
        be: &B,
        x: &B::Tensor,
        layers: [&crate::Linear<B>; N],
    ) -> Result<[B::Tensor; N]> {
        let ws = layers.map(|l| (&l.weight, l.bias.as_ref()));
        let out = be.rms_norm_linear_many(x, &self.weight, self.eps, &ws)?;
        out.try_into().map_err(|v: Vec<B::Tensor>| {
            crate::NnError::Kernel(synaptix_core::Error::ShapeMismatch {
                op: "rms_norm_linear_many",
                detail: format!("{} outputs for {N} weights", v.len()),
            })
        })
    }
}

/// One row in place, as ggml computes it: the sum of squares in f64, `1/sqrtf(mean + eps)`,
/// the scale, then the weight.
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
        let mut x = [1.0, -2.0, 3.0, -4.0, 2.0, 2.0, 2.0, 2.0];
        for row in x.chunks_mut(4) {
            rms_norm_row(row, &[1.0; 4], 0.0);
            let ms: f32 = row.iter().map(|v| v * v).sum::<f32>() / 4.0;
            assert!((ms - 1.0).abs() < 1e-6, "{ms}");
        }
        assert!((x[4] - 1.0).abs() < 1e-6);
    }
}
