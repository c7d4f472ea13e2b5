//! f32 CPU layers for encoder-decoder models (Whisper, later BERT-style encoders), loaded from
//! CTranslate2 `model.bin` variables by prefix: a linear layer whose float16 weight is kept as
//! stored (converted exactly inside the products: the results of an f32 copy with half the bytes
//! to read), LayerNorm with bias, and the pre-norm GELU MLP with its residual. Activations are
//! row-major `[rows, features]`. These run on kernels-cpu's `dense` ops; they join the
//! [`crate::Backend`] trait when such models move to the GPU.

use synaptix_bundle::ct2::{Ct2DType, Ct2File};
use synaptix_kernels_cpu::dense::{gelu_erf_inplace, layer_norm, linear, WeightRef};

use crate::{NnError, Result};

/// A weight matrix `[rows, cols]` as the file stores it: float16 kept as half bits, any other
/// type converted to f32.
pub enum DenseWeight {
    F32(Vec<f32>),
    F16(Vec<u16>),
}

impl DenseWeight {
    /// Variable `name`, which must hold `rows × cols` values.
    pub fn load(file: &Ct2File, name: &str, rows: usize, cols: usize) -> Result<DenseWeight> {
        match file.get(name) {
            Some(v) if v.dtype == Ct2DType::F16 && v.elements() == rows * cols => {
                Ok(DenseWeight::F16(
                    file.bytes(v)
                        .chunks_exact(2)
                        .map(|b| u16::from_le_bytes([b[0], b[1]]))
                        .collect(),
                ))
            }
            // Any other case: f32_matrix converts, or names the missing variable or the shape.
            _ => Ok(DenseWeight::F32(file.f32_matrix(name, rows, cols)?)),
        }
    }

    pub fn weight(&self) -> WeightRef<'_> {
        match self {
            DenseWeight::F32(w) => WeightRef::F32(w),
            DenseWeight::F16(w) => WeightRef::F16(w),
        }
    }

    /// Row `j` of `cols` values as f32, appended to `out` (an embedding lookup).
    pub fn extend_row(&self, j: usize, cols: usize, out: &mut Vec<f32>) {
        match self {
            DenseWeight::F32(w) => out.extend_from_slice(&w[j * cols..(j + 1) * cols]),
            DenseWeight::F16(w) => out.extend(
                w[j * cols..(j + 1) * cols]
                    .iter()
                    .map(|&h| half::f16::from_bits(h).to_f32()),
            ),
        }
    }
}

/// `y = x · Wᵀ (+ b)` with `W: [out, inp]` (`{prefix}/weight`, `{prefix}/bias`).
pub struct DenseLinear {
    w: DenseWeight,
    b: Option<Vec<f32>>,
    out: usize,
    inp: usize,
}

impl DenseLinear {
    pub fn load(
        file: &Ct2File,
        prefix: &str,
        out: usize,
        inp: usize,
        bias: bool,
    ) -> Result<DenseLinear> {
        let w = DenseWeight::load(file, &format!("{prefix}/weight"), out, inp)?;
        let b = if bias {
            Some(file.f32_matrix(&format!("{prefix}/bias"), 1, out)?)
        } else {
            None
        };
        Ok(DenseLinear { w, b, out, inp })
    }

    pub fn out_features(&self) -> usize {
        self.out
    }

    /// `x: [rows, inp]` → `[rows, out]`.
    pub fn forward(&self, x: &[f32], rows: usize) -> Result<Vec<f32>> {
        Ok(linear(
            x,
            rows,
            self.w.weight(),
            self.out,
            self.inp,
            self.b.as_deref(),
        )?)
    }
}

/// LayerNorm with bias over the last dimension (`{prefix}/gamma`, `{prefix}/beta`).
pub struct LayerNorm {
    gamma: Vec<f32>,
    beta: Vec<f32>,
    eps: f32,
}

impl LayerNorm {
    pub fn load(file: &Ct2File, prefix: &str, dim: usize, eps: f32) -> Result<LayerNorm> {
        Ok(LayerNorm {
            gamma: file.f32_matrix(&format!("{prefix}/gamma"), 1, dim)?,
            beta: file.f32_matrix(&format!("{prefix}/beta"), 1, dim)?,
            eps,
        })
    }

    pub fn forward(&self, x: &[f32]) -> Result<Vec<f32>> {
        Ok(layer_norm(x, &self.gamma, &self.beta, self.eps)?)
    }
}

/// The pre-norm MLP with exact GELU, added to the residual stream: `x += fc2(gelu(fc1(norm(x))))`
/// (`{prefix}/layer_norm`, `{prefix}/linear_0`, `{prefix}/linear_1`; the hidden size is read
/// from `linear_0`).
pub struct PreNormGeluMlp {
    norm: LayerNorm,
    fc1: DenseLinear,
    fc2: DenseLinear,
}

impl PreNormGeluMlp {
    pub fn load(file: &Ct2File, prefix: &str, d: usize, eps: f32) -> Result<PreNormGeluMlp> {
        let name = format!("{prefix}/linear_0/weight");
        let hidden = file
            .get(&name)
            .and_then(|v| v.shape.first().copied())
            .unwrap_or(0);
        if hidden == 0 {
            return Err(NnError::MissingTensor {
                source_name: file.path().display().to_string(),
                name,
            });
        }
        Ok(PreNormGeluMlp {
            norm: LayerNorm::load(file, &format!("{prefix}/layer_norm"), d, eps)?,
            fc1: DenseLinear::load(file, &format!("{prefix}/linear_0"), hidden, d, true)?,
            fc2: DenseLinear::load(file, &format!("{prefix}/linear_1"), d, hidden, true)?,
        })
    }

    /// `x: [rows, d]`, updated in place.
    pub fn add_to(&self, x: &mut [f32], rows: usize) -> Result<()> {
        let h = self.norm.forward(x)?;
        let mut h = self.fc1.forward(&h, rows)?;
        gelu_erf_inplace(&mut h);
        let h = self.fc2.forward(&h, rows)?;
        x.iter_mut().zip(&h).for_each(|(a, b)| *a += b);
        Ok(())
    }
}

/// The `P` equal column blocks of `x: [rows, P · d]` as `P` matrices `[rows, d]` (a fused Q/K/V
/// or K/V product's outputs).
pub fn split_columns<const P: usize>(x: &[f32], rows: usize, d: usize) -> [Vec<f32>; P] {
    let mut out: [Vec<f32>; P] = std::array::from_fn(|_| Vec::with_capacity(rows * d));
    for r in x.chunks_exact(P * d) {
        for (p, o) in out.iter_mut().enumerate() {
            o.extend_from_slice(&r[p * d..(p + 1) * d]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::split_columns;

    #[test]
    fn split_columns_takes_equal_blocks() {
        let x: Vec<f32> = (0..12).map(|v| v as f32).collect();
        let parts = split_columns::<3>(&x, 2, 2);
        assert_eq!(
            parts,
            [
                vec![0.0, 1.0, 6.0, 7.0],
                vec![2.0, 3.0, 8.0, 9.0],
                vec![4.0, 5.0, 10.0, 11.0]
            ]
        );
    }
}
