use std::sync::Arc;

use synaptix_bundle::GgufFile;
use synaptix_core::{Blob, DType, Shape};

use crate::{NnError, Result};

/// One stored tensor: its format, shape (outermost first) and bytes.
#[derive(Debug, Clone)]
pub struct Weight {
    pub name: String,
    pub dtype: DType,
    pub shape: Shape,
    pub data: Blob,
}

impl Weight {
    /// Checks the shape, naming the tensor on mismatch.
    pub fn expect_shape(&self, dims: &[usize]) -> Result<()> {
        if self.shape.dims() == dims {
            Ok(())
        } else {
            Err(NnError::BadShape {
                name: self.name.clone(),
                shape: self.shape.clone(),
                expected: Shape::new(dims.to_vec()).to_string(),
            })
        }
    }

    /// Matrix `e` of a stack of experts' matrices `[n_expert, rows, cols]`: `[rows, cols]`,
    /// sharing the bytes.
    pub fn expert(&self, e: usize) -> Result<Weight> {
        let bad = |expected: String| NnError::BadShape {
            name: self.name.clone(),
            shape: self.shape.clone(),
            expected,
        };
        let &[n, rows, cols] = self.shape.dims() else {
            return Err(bad("[experts, rows, cols]".into()));
        };
        if e >= n || !cols.is_multiple_of(self.dtype.block_len()) {
            return Err(bad(format!("expert {e} of whole {} rows", self.dtype)));
        }
        let bytes = rows * (cols / self.dtype.block_len()) * self.dtype.block_bytes();
        let data = self
            .data
            .slice(e * bytes..(e + 1) * bytes)
            .ok_or_else(|| bad(format!("{n} experts of {bytes} bytes")))?;
        Ok(Weight {
            name: format!("{}[{e}]", self.name),
            dtype: self.dtype,
            shape: Shape::new(vec![rows, cols]),
            data,
        })
    }

    /// All values as f32 (for small tensors: norms, biases).
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        let n = self.shape.elements().ok_or_else(|| NnError::BadShape {
            name: self.name.clone(),
            shape: self.shape.clone(),
            expected: "a shape whose element count fits in memory".into(),
        })?;
        let mut out = vec![0f32; n];
        synaptix_kernels_cpu::dequantize(self.dtype, self.data.as_bytes(), &mut out).map_err(
            |_| NnError::UnsupportedWeight {
                name: self.name.clone(),
                dtype: self.dtype,
            },
        )?;
        Ok(out)
    }
}

/// Anything that hands out named tensors: a GGUF file, a safetensors set, a `.syn` bundle.
pub trait TensorSource: Send + Sync {
    fn tensor(&self, name: &str) -> Result<Option<Weight>>;
    /// The source's name for error messages (usually its path).
    fn describe(&self) -> String;
}

impl TensorSource for GgufFile {
    fn tensor(&self, name: &str) -> Result<Option<Weight>> {
        if self.tensor_info(name).is_none() {
            return Ok(None);
        }
        let (info, data) = self.tensor_blob(name)?;
        Ok(Some(Weight {
            name: info.name,
            dtype: info.dtype,
            shape: info.shape,
            data,
        }))
    }

    fn describe(&self) -> String {
        self.path().display().to_string()
    }
}

/// Hands out weights by dotted prefix: `vb.pp("blk").pp(3).get("attn_q.weight")` reads
/// `blk.3.attn_q.weight`.
#[derive(Clone)]
pub struct VarBuilder {
    source: Arc<dyn TensorSource>,
    prefix: String,
}

impl VarBuilder {
    pub fn new(source: Arc<dyn TensorSource>) -> Self {
        VarBuilder {
            source,
            prefix: String::new(),
        }
    }

    /// A builder whose names start with `part`.
    pub fn pp(&self, part: impl std::fmt::Display) -> VarBuilder {
        let prefix = if self.prefix.is_empty() {
            part.to_string()
        } else {
            format!("{}.{part}", self.prefix)
        };
        VarBuilder {
            source: self.source.clone(),
            prefix,
        }
    }

    fn full_name(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}.{name}", self.prefix)
        }
    }

    pub fn get_opt(&self, name: &str) -> Result<Option<Weight>> {
        self.source.tensor(&self.full_name(name))
    }

    pub fn get(&self, name: &str) -> Result<Weight> {
        let full = self.full_name(name);
        self.source
            .tensor(&full)?
            .ok_or_else(|| NnError::MissingTensor {
                source_name: self.source.describe(),
                name: full,
            })
    }

    pub fn contains(&self, name: &str) -> bool {
        matches!(self.get_opt(name), Ok(Some(_)))
    }
}
