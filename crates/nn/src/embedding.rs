use synaptix_kernels_cpu::dequantize;

use crate::linear::executable;
use crate::{NnError, Result, Weight};

/// Token embedding table `[vocab, dim]` in any executable format; rows are dequantized on
/// lookup, so a quantized table stays quantized in memory.
#[derive(Debug, Clone)]
pub struct Embedding {
    pub weight: Weight,
    vocab: usize,
    dim: usize,
}

impl Embedding {
    pub fn new(weight: Weight, vocab: usize, dim: usize) -> Result<Embedding> {
        weight.expect_shape(&[vocab, dim])?;
        if !executable(weight.dtype) {
            return Err(NnError::UnsupportedWeight {
                name: weight.name.clone(),
                dtype: weight.dtype,
            });
        }
        Ok(Embedding { weight, vocab, dim })
    }

    pub fn vocab(&self) -> usize {
        self.vocab
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    /// `ids: [n]` -> `[n, dim]`. Ids outside the vocabulary are an error.
    pub fn lookup(&self, ids: &[u32]) -> Result<Vec<f32>> {
        let row_bytes = self.weight.data.len() / self.vocab;
        let mut out = vec![0f32; ids.len() * self.dim];
        for (&id, dst) in ids.iter().zip(out.chunks_exact_mut(self.dim)) {
            let id = id as usize;
            if id >= self.vocab {
                return Err(NnError::Kernel(synaptix_core::Error::Invalid {
                    op: "embedding",
                    detail: format!("token id {id} is outside the vocabulary of {}", self.vocab),
                }));
            }
            let src = &self.weight.data.as_bytes()[id * row_bytes..(id + 1) * row_bytes];
            dequantize(self.weight.dtype, src, dst)?;
        }
        Ok(out)
    }
}
