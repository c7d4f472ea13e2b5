use synaptix_core::DType;

use crate::{Backend, NnError, Result, VarBuilder, Weight};

/// Weight formats the kernels of both backends execute.
pub(crate) fn executable(dtype: DType) -> bool {
    use DType::*;
    matches!(
        dtype,
        F32 | F16
            | BF16
            | Q4_0
            | Q4_1
            | Q5_0
            | Q5_1
            | Q8_0
            | Q2K
            | Q3K
            | Q4K
            | Q5K
            | Q6K
            | IQ4NL
            | IQ4XS
    )
}

/// Weight formats only the CPU kernels execute so far (synaptix's own MXFP8, NVFP4, SQ1 .. SQ8,
/// SYMB4).
pub fn cpu_only(dtype: DType) -> bool {
    matches!(dtype, DType::MXFP8 | DType::NVFP4 | DType::SYMB4) || dtype.sq_bits().is_some()
}

/// Formats some backend executes: the loaders check these, each backend's `matrix` its own.
pub(crate) fn loadable(dtype: DType) -> bool {
    executable(dtype) || cpu_only(dtype)
}

/// `y = x · Wᵀ (+ b)` with `W: [out, in]` in any executable format.
pub struct Linear<B: Backend> {
    pub weight: B::Matrix,
    /// `[out]`
    pub bias: Option<B::Vector>,
    pub out_dim: usize,
    pub in_dim: usize,
}

impl<B: Backend> Linear<B> {
    /// Loads `{name}.weight` (and `{name}.bias` when present), checking `[out, in]`.
    pub fn load(
        be: &B,
        vb: &VarBuilder,
        name: &str,
        out_dim: usize,
        in_dim: usize,
    ) -> Result<Self> {
        let weight = vb.get(&format!("{name}.weight"))?;
        let bias = match vb.get_opt(&format!("{name}.bias"))? {
            Some(b) => {
                b.expect_shape(&[out_dim])?;
                Some(b.to_f32()?)
            }
            None => None,
        };
        Linear::from_weight(be, &weight, bias, out_dim, in_dim)
    }

    pub fn from_weight(
        be: &B,
        weight: &Weight,
        bias: Option<Vec<f32>>,
        out_dim: usize,
        in_dim: usize,
    ) -> Result<Self> {
        weight.expect_shape(&[out_dim, in_dim])?;
        if !loadable(weight.dtype) {
            return Err(NnError::UnsupportedWeight {
                name: weight.name.clone(),
                dtype: weight.dtype,
            });
        }
        Ok(Linear {
            weight: be.matrix(weight)?,
            bias: bias.map(|b| be.vector(b)).transpose()?,
            out_dim,
            in_dim,
        })
    }

    /// `x: [rows, in]` -> `[rows, out]`.
    pub fn forward(&self, be: &B, x: &B::Tensor) -> Result<B::Tensor> {
        be.linear(x, &self.weight, self.bias.as_ref())
    }

    /// `residual += self(x)`.
    pub fn forward_add(&self, be: &B, x: &B::Tensor, residual: &mut B::Tensor) -> Result<()> {
        match &self.bias {
            None => be.linear_add(x, &self.weight, residual),
            Some(_) => {
                let y = self.forward(be, x)?;
                be.add(residual, &y)
            }
        }
    }

    /// Every layer of `layers` applied to the same `x`.
    pub fn forward_many<const N: usize>(
        be: &B,
        x: &B::Tensor,
        layers: [&Linear<B>; N],
    ) -> Result<[B::Tensor; N]> {
        let ws = layers.map(|l| (&l.weight, l.bias.as_ref()));
        let out = be.linear_many(x, &ws)?;
        out.try_into().map_err(|v: Vec<B::Tensor>| {
            NnError::Kernel(synaptix_core::Error::ShapeMismatch {
                op: "linear_many",
                detail: format!("{} outputs for {N} weights", v.len()),
            })
        })
    }
}
