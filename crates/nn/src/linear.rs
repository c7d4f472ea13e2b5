use synaptix_core::DType;
use synaptix_kernels_cpu::{matmul, WeightView};

use crate::{NnError, Result, VarBuilder, Weight};

/// Weight formats the CPU kernels execute.
pub(crate) fn executable(dtype: DType) -> bool {
    use DType::*;
    matches!(
        dtype,
        F32 | F16 | BF16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q2K | Q3K | Q4K | Q5K | Q6K
    )
}

/// `y = x · Wᵀ (+ b)` with `W: [out, in]` in any executable format.
#[derive(Debug, Clone)]
pub struct Linear {
    pub weight: Weight,
    /// `[out]`
    pub bias: Option<Vec<f32>>,
}

impl Linear {
    /// Loads `{name}.weight` (and `{name}.bias` when present), checking `[out, in]`.
    pub fn load(vb: &VarBuilder, name: &str, out_dim: usize, in_dim: usize) -> Result<Linear> {
        let weight = vb.get(&format!("{name}.weight"))?;
        let bias = match vb.get_opt(&format!("{name}.bias"))? {
            Some(b) => {
                b.expect_shape(&[out_dim])?;
                Some(b.to_f32()?)
            }
            None => None,
        };
        Linear::from_weight(weight, bias, out_dim, in_dim)
    }

    pub fn from_weight(
        weight: Weight,
        bias: Option<Vec<f32>>,
        out_dim: usize,
        in_dim: usize,
    ) -> Result<Linear> {
        weight.expect_shape(&[out_dim, in_dim])?;
        if !executable(weight.dtype) {
            return Err(NnError::UnsupportedWeight {
                name: weight.name.clone(),
                dtype: weight.dtype,
            });
        }
        Ok(Linear { weight, bias })
    }

    pub fn out_dim(&self) -> usize {
        self.weight.shape.dims()[0]
    }

    pub fn in_dim(&self) -> usize {
        self.weight.shape.dims()[1]
    }

    /// `x: [rows, in]` -> `y: [rows, out]`.
    pub fn forward(&self, x: &[f32], rows: usize) -> Result<Vec<f32>> {
        let mut y = vec![0f32; rows * self.out_dim()];
        self.forward_into(x, rows, &mut y)?;
        Ok(y)
    }

    pub fn forward_into(&self, x: &[f32], rows: usize, y: &mut [f32]) -> Result<()> {
        let view = WeightView {
            dtype: self.weight.dtype,
            data: self.weight.data.as_bytes(),
            rows: self.out_dim(),
            cols: self.in_dim(),
        };
        matmul(view, x, rows, y)?;
        if let Some(bias) = &self.bias {
            for row in y.chunks_exact_mut(bias.len()) {
                for (v, b) in row.iter_mut().zip(bias) {
                    *v += b;
                }
            }
        }
        Ok(())
    }
}
