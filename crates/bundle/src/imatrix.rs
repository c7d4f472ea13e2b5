//! Importance matrices in llama.cpp's GGUF layout (`llama-imatrix`'s output since 2025): for
//! each weight matrix `NAME`, the F32 tensors `NAME.in_sum2` (`[n_mat, n_cols]`: per expert
//! matrix, the sum over the activation rows that met it of each column's square) and
//! `NAME.counts` (`[n_mat, 1]`: how many rows), and the keys `general.type` = `imatrix`,
//! `imatrix.datasets`, `imatrix.chunk_count`, `imatrix.chunk_size`. The importance of a
//! column is its mean square, `in_sum2 / count` (1 for an expert no row reached), as
//! llama-quantize computes it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use synaptix_core::DType;

use crate::gguf::{GgufWriter, Value, ValueType};
use crate::GgufFile;

/// An importance matrix that could not be read or written, with the file named.
#[derive(Debug, thiserror::Error)]
#[error("{}: {problem}", path.display())]
pub struct ImatrixError {
    pub path: PathBuf,
    pub problem: String,
}

/// One matrix's statistics.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ImatrixEntry {
    /// `n_mat × n_cols` sums of squares, matrix by matrix.
    pub sums: Vec<f32>,
    /// Rows seen, one per matrix (experts; 1 for a dense matrix).
    pub counts: Vec<f32>,
}

impl ImatrixEntry {
    /// Columns per matrix.
    pub fn cols(&self) -> usize {
        self.sums.len().checked_div(self.counts.len()).unwrap_or(0)
    }

    /// Each column's mean square, matrix by matrix (`1` for a matrix no row reached).
    pub fn importance(&self) -> Vec<f32> {
        let cols = self.cols();
        let mut out = Vec::with_capacity(self.sums.len());
        for (m, &count) in self.counts.iter().enumerate() {
            let sums = &self.sums[m * cols..(m + 1) * cols];
            if count > 0.0 {
                out.extend(sums.iter().map(|s| s / count));
            } else {
                out.extend(std::iter::repeat_n(1.0, cols));
            }
        }
        out
    }
}

/// An importance matrix file.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Imatrix {
    /// By weight name (`blk.0.attn_q.weight`).
    pub entries: BTreeMap<String, ImatrixEntry>,
    /// The text files the statistics came from.
    pub datasets: Vec<String>,
    /// Chunks of `chunk_size` tokens evaluated.
    pub chunk_count: u32,
    pub chunk_size: u32,
}

impl Imatrix {
    pub fn read(path: &Path) -> Result<Imatrix, ImatrixError> {
        let bad = |problem: String| ImatrixError {
            path: path.to_path_buf(),
            problem,
        };
        let file = GgufFile::open(path).map_err(|e| bad(e.kind.to_string()))?;
        if file.get_str("general.type").ok().flatten() != Some("imatrix") {
            return Err(bad(
                "not an importance matrix (no general.type = imatrix; the legacy imatrix.dat \
                 layout is not read: convert it with llama-imatrix --in-file)"
                    .into(),
            ));
        }
        let mut out = Imatrix {
            datasets: file
                .get_str_array("imatrix.datasets")
                .ok()
                .flatten()
                .unwrap_or_default()
                .into_iter()
                .map(str::to_string)
                .collect(),
            chunk_count: file
                .get_u64("imatrix.chunk_count")
                .ok()
                .flatten()
                .unwrap_or(0) as u32,
            chunk_size: file
                .get_u64("imatrix.chunk_size")
                .ok()
                .flatten()
                .unwrap_or(0) as u32,
            ..Imatrix::default()
        };
        let f32s = |name: &str| -> Result<Vec<f32>, ImatrixError> {
            let t = file
                .tensor_info(name)
                .ok_or_else(|| bad(format!("{name} is missing")))?;
            if t.dtype != DType::F32 {
                return Err(bad(format!("{name} is {}, not f32", t.dtype)));
            }
            Ok(file
                .tensor_bytes(t)
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect())
        };
        for t in file.tensors() {
            let Some(name) = t.name.strip_suffix(".in_sum2") else {
                continue;
            };
            let sums = f32s(&t.name)?;
            let counts = f32s(&format!("{name}.counts"))?;
            if counts.is_empty() || !sums.len().is_multiple_of(counts.len()) {
                return Err(bad(format!(
                    "{name}: {} sums do not split into {} matrices",
                    sums.len(),
                    counts.len()
                )));
            }
            if sums.iter().chain(&counts).any(|v| !v.is_finite()) {
                return Err(bad(format!("{name} holds a value that is not finite")));
            }
            out.entries
                .insert(name.to_string(), ImatrixEntry { sums, counts });
        }
        if out.entries.is_empty() {
            return Err(bad("holds no *.in_sum2 statistics".into()));
        }
        Ok(out)
    }

    /// The file as llama-imatrix writes it: the keys, then each entry's `in_sum2` and `counts`
    /// in name order.
    pub fn to_gguf(&self) -> GgufWriter {
        let mut w = GgufWriter::new();
        w.add_metadata("general.type", Value::String("imatrix".into()));
        w.add_metadata(
            "imatrix.datasets",
            Value::Array(
                ValueType::String,
                self.datasets.iter().cloned().map(Value::String).collect(),
            ),
        );
        w.add_metadata("imatrix.chunk_count", Value::U32(self.chunk_count));
        w.add_metadata("imatrix.chunk_size", Value::U32(self.chunk_size));
        for (name, e) in &self.entries {
            let n_mat = e.counts.len() as u64;
            w.add_f32(
                format!("{name}.in_sum2"),
                &[n_mat, e.cols() as u64],
                &e.sums,
            );
            w.add_f32(format!("{name}.counts"), &[n_mat, 1], &e.counts);
        }
        w
    }

    pub fn write(&self, path: &Path) -> Result<(), ImatrixError> {
        std::fs::write(path, self.to_gguf().to_bytes()).map_err(|e| ImatrixError {
            path: path.to_path_buf(),
            problem: format!("cannot write: {e}"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_and_reads_back_with_means_per_expert() {
        let mut m = Imatrix {
            datasets: vec!["wiki.txt".into()],
            chunk_count: 3,
            chunk_size: 512,
            ..Imatrix::default()
        };
        m.entries.insert(
            "blk.0.ffn_up_exps.weight".into(),
            ImatrixEntry {
                sums: vec![2.0, 4.0, 9.0, 9.0],
                counts: vec![2.0, 0.0],
            },
        );
        let path = std::env::temp_dir().join(format!("imatrix-unit-{}.gguf", std::process::id()));
        m.write(&path).unwrap();
        let back = Imatrix::read(&path).unwrap();
        assert_eq!(back, m);
        assert_eq!(
            back.entries["blk.0.ffn_up_exps.weight"].importance(),
            vec![1.0, 2.0, 1.0, 1.0]
        );
        std::fs::write(&path, GgufWriter::new().to_bytes()).unwrap();
        assert!(Imatrix::read(&path)
            .unwrap_err()
            .to_string()
            .contains("not an importance matrix"));
        std::fs::remove_file(&path).unwrap();
    }
}
