use crate::linear::loadable;
use crate::{Backend, NnError, Result, Weight};

/// Token embedding table `[vocab, dim]` in any executable format; rows are dequantized on
/// lookup, so a quantized table stays quantized in memory.
pub struct Embedding<B: Backend> {
    pub table: B::Matrix,
    pub vocab: usize,
    pub dim: usize,
}

impl<B: Backend> Embedding<B> {
    pub fn new(be: &B, weight: &Weight, vocab: usize, dim: usize) -> Result<Self> {
        weight.expect_shape(&[vocab, dim])?;
        if !loadable(weight.dtype) {
            return Err(NnError::UnsupportedWeight {
                name: weight.name.clone(),
                dtype: weight.dtype,
            });
        }
        Ok(Embedding {
            table: be.matrix(weight)?,
            vocab,
            dim,
        })
    }

    /// `ids: [n]` -> `[n, dim]`, times `scale`. Ids outside the vocabulary are an error.
    pub fn lookup(&self, be: &B, ids: &[u32], scale: Option<f32>) -> Result<B::Tensor> {
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= self.vocab) {
            return Err(NnError::Kernel(synaptix_core::Error::Invalid {
                op: "embedding",
                detail: format!("token id {bad} is outside the vocabulary of {}", self.vocab),
            }));
        }
        be.embed(&self.table, ids, scale)
    }
}
