//! f32 CPU layers for encoder and encoder-decoder models (Whisper, BERT), loaded by full tensor
//! name from any [`DenseSource`]: CTranslate2's `model.bin` ([`Ct2File`], names like
//! `encoder/layer_0/ffn/linear_0/weight`) or a safetensors file ([`SafetensorsFile`], names like
//! `encoder.layer.0.intermediate.dense.weight`). Layers: a linear layer whose float16 weight is
//! kept as stored (converted exactly inside the products: the results of an f32 copy with half
//! the bytes to read), LayerNorm with bias, and the pre-norm GELU MLP with its residual.
//! Activations are row-major `[rows, features]`. These run on kernels-cpu's `dense` ops; they
//! join the [`crate::Backend`] trait when such models move to the GPU.

use synaptix_bundle::ct2::{Ct2DType, Ct2File};
use synaptix_bundle::safetensors::{SafetensorsFile, StDType};
use synaptix_kernels_cpu::dense::{gelu_erf_inplace, layer_norm, linear, WeightRef};

use crate::{NnError, Result};

/// A file the dense layers load from, by full tensor name.
pub trait DenseSource {
    /// The file, for messages.
    fn source_name(&self) -> String;
    /// The tensor's shape (outermost first), `None` when absent.
    fn tensor_shape(&self, name: &str) -> Option<Vec<usize>>;
    /// All values as f32 after checking there are `rows × cols` of them (a missing tensor, a
    /// count mismatch or a non-float type is an error naming the file).
    fn f32_matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Vec<f32>>;
    /// The raw half bits when the tensor is stored as float16 with `len` elements, else `None`.
    fn f16_bits(&self, name: &str, len: usize) -> Option<Vec<u16>>;
}

fn half_bits(bytes: &[u8]) -> Vec<u16> {
    bytes
        .chunks_exact(2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .collect()
}

impl DenseSource for Ct2File {
    fn source_name(&self) -> String {
        self.path().display().to_string()
    }
    fn tensor_shape(&self, name: &str) -> Option<Vec<usize>> {
        self.get(name).map(|v| v.shape.clone())
    }
    fn f32_matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Vec<f32>> {
        Ok(Ct2File::f32_matrix(self, name, rows, cols)?)
    }
    fn f16_bits(&self, name: &str, len: usize) -> Option<Vec<u16>> {
        match self.get(name) {
            Some(v) if v.dtype == Ct2DType::F16 && v.elements() == len => {
                Some(half_bits(self.bytes(v)))
            }
            _ => None,
        }
    }
}

impl DenseSource for SafetensorsFile {
    fn source_name(&self) -> String {
        self.path().display().to_string()
    }
    fn tensor_shape(&self, name: &str) -> Option<Vec<usize>> {
        self.get(name).map(|t| t.shape.clone())
    }
    fn f32_matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Vec<f32>> {
        Ok(SafetensorsFile::f32_matrix(self, name, rows, cols)?)
    }
    fn f16_bits(&self, name: &str, len: usize) -> Option<Vec<u16>> {
        match self.get(name) {
            Some(t) if t.dtype == StDType::F16 && t.elements() == len => {
                Some(half_bits(self.bytes(t)))
            }
            _ => None,
        }
    }
}

/// A weight matrix `[rows, cols]` as the file stores it: float16 kept as half bits, any other
/// type converted to f32.
pub enum DenseWeight {
    F32(Vec<f32>),
    F16(Vec<u16>),
}

impl DenseWeight {
    /// Variable `name`, which must hold `rows × cols` values.
    pub fn load<S: DenseSource + ?Sized>(
        file: &S,
        name: &str,
        rows: usize,
        cols: usize,
    ) -> Result<DenseWeight> {
        match rows.checked_mul(cols).and_then(|n| file.f16_bits(name, n)) {
            Some(bits) => Ok(DenseWeight::F16(bits)),
            // Any other case: f32_matrix converts, or names the missing variable or the shape.
            None => Ok(DenseWeight::F32(file.f32_matrix(name, rows, cols)?)),
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

/// `y = x · Wᵀ (+ b)` with `W: [out, inp]`.
pub struct DenseLinear {
    w: DenseWeight,
    b: Option<Vec<f32>>,
    out: usize,
    inp: usize,
}

impl DenseLinear {
    /// CTranslate2's names: `{prefix}/weight`, `{prefix}/bias`.
    pub fn load<S: DenseSource + ?Sized>(
        file: &S,
        prefix: &str,
        out: usize,
        inp: usize,
        bias: bool,
    ) -> Result<DenseLinear> {
        let b = bias.then(|| format!("{prefix}/bias"));
        DenseLinear::load_named(file, &format!("{prefix}/weight"), b.as_deref(), out, inp)
    }

    /// The weight and (optional) bias by full name.
    pub fn load_named<S: DenseSource + ?Sized>(
        file: &S,
        weight: &str,
        bias: Option<&str>,
        out: usize,
        inp: usize,
    ) -> Result<DenseLinear> {
        let w = DenseWeight::load(file, weight, out, inp)?;
        let b = match bias {
            Some(name) => Some(file.f32_matrix(name, 1, out)?),
            None => None,
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

/// LayerNorm with bias over the last dimension.
pub struct LayerNorm {
    gamma: Vec<f32>,
    beta: Vec<f32>,
    eps: f32,
}

impl LayerNorm {
    /// CTranslate2's names: `{prefix}/gamma`, `{prefix}/beta`.
    pub fn load<S: DenseSource + ?Sized>(
        file: &S,
        prefix: &str,
        dim: usize,
        eps: f32,
    ) -> Result<LayerNorm> {
        let (w, b) = (format!("{prefix}/gamma"), format!("{prefix}/beta"));
        LayerNorm::load_named(file, &w, &b, dim, eps)
    }

    /// The scale and shift by full name (Hugging Face: `{prefix}.weight`, `{prefix}.bias`).
    pub fn load_named<S: DenseSource + ?Sized>(
        file: &S,
        weight: &str,
        bias: &str,
        dim: usize,
        eps: f32,
    ) -> Result<LayerNorm> {
        Ok(LayerNorm {
            gamma: file.f32_matrix(weight, 1, dim)?,
            beta: file.f32_matrix(bias, 1, dim)?,
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
    /// CTranslate2's names (see the type).
    pub fn load<S: DenseSource + ?Sized>(
        file: &S,
        prefix: &str,
        d: usize,
        eps: f32,
    ) -> Result<PreNormGeluMlp> {
        let name = format!("{prefix}/linear_0/weight");
        let hidden = file
            .tensor_shape(&name)
            .and_then(|s| s.first().copied())
            .unwrap_or(0);
        if hidden == 0 {
            return Err(NnError::MissingTensor {
                source_name: file.source_name(),
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
