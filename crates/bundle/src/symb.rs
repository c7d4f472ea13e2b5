//! The `.symb` directory format (SYNAXIM's; docs/symb.md): one file per tensor under a model
//! directory described by `config.symb.json`.
//!
//! Each `.symb` file holds one tensor in one of four encodings, which the file itself does not
//! name; [`read_tensor`] tells them apart by the header and the size the tensor's element count
//! implies:
//! - INT4: five little-endian u32 `num_groups, group_size, numel, dim0, dim1` (`dim1` = 1 for a
//!   vector), `num_groups` f32 scales, then `ceil(numel / 2)` bytes of 4-bit codes over the
//!   flattened tensor (the first of each pair in the high nibble; the tail group zero-padded);
//!   a value is `(code - 8) · scale` of its group;
//! - FP16 and FP32: the raw little-endian values;
//! - INT8: one f32 scale for the tensor, then `numel` signed bytes.
//!
//! Matrices keep transformers' orientation, `[out, in]` row-major.

use std::io::Write;
use std::path::{Path, PathBuf};

/// A `.symb` file that could not be read or written, with the file named.
#[derive(Debug, thiserror::Error)]
#[error("{}: {problem}", path.display())]
pub struct SymbError {
    pub path: PathBuf,
    pub problem: String,
}

impl SymbError {
    pub fn new(path: &Path, problem: impl Into<String>) -> SymbError {
        SymbError {
            path: path.to_path_buf(),
            problem: problem.into(),
        }
    }
}

/// Bytes of the INT4 header.
pub const INT4_HEADER_BYTES: usize = 20;

/// One tensor as a `.symb` file holds it.
#[derive(Debug, Clone, PartialEq)]
pub enum SymbTensor {
    Int4 {
        group_size: usize,
        /// `[dim0, dim1]` as the header gives them (`dim1` = 1 for a vector).
        dims: [usize; 2],
        numel: usize,
        /// One per group.
        scales: Vec<f32>,
        /// `ceil(numel / 2)` bytes, the first value of each pair in the high nibble.
        codes: Vec<u8>,
    },
    F16(Vec<u8>),
    F32(Vec<u8>),
    Int8 {
        scale: f32,
        values: Vec<u8>,
    },
}

impl SymbTensor {
    /// The encoding's name in `config.symb.json`'s `quantization.method` spelling.
    pub fn method(&self) -> &'static str {
        match self {
            SymbTensor::Int4 { .. } => "int4",
            SymbTensor::F16(_) => "fp16",
            SymbTensor::F32(_) => "fp32",
            SymbTensor::Int8 { .. } => "int8",
        }
    }

    /// The file's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        match self {
            SymbTensor::Int4 {
                group_size,
                dims,
                numel,
                scales,
                codes,
            } => {
                let mut out =
                    Vec::with_capacity(INT4_HEADER_BYTES + 4 * scales.len() + codes.len());
                for v in [scales.len(), *group_size, *numel, dims[0], dims[1]] {
                    out.extend_from_slice(&(v as u32).to_le_bytes());
                }
                scales
                    .iter()
                    .for_each(|s| out.extend_from_slice(&s.to_le_bytes()));
                out.extend_from_slice(codes);
                out
            }
            SymbTensor::F16(b) | SymbTensor::F32(b) => b.clone(),
            SymbTensor::Int8 { scale, values } => {
                let mut out = Vec::with_capacity(4 + values.len());
                out.extend_from_slice(&scale.to_le_bytes());
                out.extend_from_slice(values);
                out
            }
        }
    }

    /// The values, dequantized.
    pub fn to_f32(&self) -> Vec<f32> {
        match self {
            SymbTensor::Int4 {
                group_size,
                numel,
                scales,
                codes,
                ..
            } => (0..*numel)
                .map(|i| {
                    let byte = codes[i / 2];
                    let nibble = if i.is_multiple_of(2) {
                        byte >> 4
                    } else {
                        byte & 0x0f
                    };
                    (nibble as i32 - 8) as f32 * scales[i / group_size]
                })
                .collect(),
            SymbTensor::F16(b) => b
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            SymbTensor::F32(b) => b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            SymbTensor::Int8 { scale, values } => {
                values.iter().map(|&q| q as i8 as f32 * scale).collect()
            }
        }
    }
}

fn le_u32(b: &[u8], i: usize) -> usize {
    u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]) as usize
}

/// The INT4 reading of `bytes`, if its header is consistent with `numel` values of `dims` and
/// the file is exactly as long as the header says.
fn as_int4(bytes: &[u8], dims: [usize; 2]) -> Option<SymbTensor> {
    if bytes.len() < INT4_HEADER_BYTES {
        return None;
    }
    let numel = dims[0].checked_mul(dims[1])?;
    let (groups, group_size, n, d0, d1) = (
        le_u32(bytes, 0),
        le_u32(bytes, 1),
        le_u32(bytes, 2),
        le_u32(bytes, 3),
        le_u32(bytes, 4),
    );
    if n != numel || [d0, d1] != dims || group_size == 0 || groups != numel.div_ceil(group_size) {
        return None;
    }
    let scales_end = INT4_HEADER_BYTES.checked_add(groups.checked_mul(4)?)?;
    if bytes.len() != scales_end.checked_add(numel.div_ceil(2))? {
        return None;
    }
    let scales = bytes[INT4_HEADER_BYTES..scales_end]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    Some(SymbTensor::Int4 {
        group_size,
        dims,
        numel,
        scales,
        codes: bytes[scales_end..].to_vec(),
    })
}

/// Reads one `.symb` file that should hold a tensor of `dims` (`[n, 1]` for a vector of `n`).
pub fn read_tensor(path: &Path, dims: [usize; 2]) -> Result<SymbTensor, SymbError> {
    let bytes =
        std::fs::read(path).map_err(|e| SymbError::new(path, format!("cannot read: {e}")))?;
    let numel = dims[0]
        .checked_mul(dims[1])
        .ok_or_else(|| SymbError::new(path, "implausible shape"))?;
    if let Some(t) = as_int4(&bytes, dims) {
        return Ok(t);
    }
    let len = bytes.len();
    if len == 2 * numel {
        Ok(SymbTensor::F16(bytes))
    } else if len == 4 * numel {
        Ok(SymbTensor::F32(bytes))
    } else if len == 4 + numel {
        let scale = f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        Ok(SymbTensor::Int8 {
            scale,
            values: bytes[4..].to_vec(),
        })
    } else {
        let int4 = INT4_HEADER_BYTES + 4 * numel.div_ceil(128) + numel.div_ceil(2);
        Err(SymbError::new(
            path,
            format!(
                "{len} bytes fit no .symb encoding of a {}x{} tensor (INT4 with groups of 128: \
                 {int4}, FP16: {}, FP32: {}, INT8: {}); the file is truncated or belongs to \
                 another model",
                dims[0],
                dims[1],
                2 * numel,
                4 * numel,
                4 + numel
            ),
        ))
    }
}

/// Writes one tensor's file, creating its directory.
pub fn write_tensor(path: &Path, tensor: &SymbTensor) -> Result<(), SymbError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| SymbError::new(dir, format!("cannot create: {e}")))?;
    }
    let mut file = std::fs::File::create(path)
        .map_err(|e| SymbError::new(path, format!("cannot create: {e}")))?;
    file.write_all(&tensor.to_bytes())
        .map_err(|e| SymbError::new(path, format!("cannot write: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings_are_told_apart_by_header_and_size() {
        let dir = std::env::temp_dir().join(format!("symb-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let int4 = SymbTensor::Int4 {
            group_size: 128,
            dims: [3, 100],
            numel: 300,
            scales: vec![0.5, 0.25, 2.0],
            codes: (0..150).map(|i| i as u8).collect(),
        };
        let f16 = SymbTensor::F16(vec![0x3c; 600]);
        let f32v = SymbTensor::F32(vec![0; 1200]);
        let int8 = SymbTensor::Int8 {
            scale: 0.1,
            values: vec![0x81; 300],
        };
        for (i, t) in [&int4, &f16, &f32v, &int8].into_iter().enumerate() {
            let p = dir.join(format!("t{i}.symb"));
            write_tensor(&p, t).unwrap();
            assert_eq!(&read_tensor(&p, [3, 100]).unwrap(), t);
        }
        // Values: code 0x00 -> -8 · 0.5 for the first pair; int8 0x81 = -127.
        assert_eq!(&int4.to_f32()[..3], &[-4.0, -4.0, -4.0]);
        assert!((int8.to_f32()[0] + 12.7).abs() < 1e-5);
        // A truncated INT4 file fits nothing.
        let p = dir.join("short.symb");
        std::fs::write(&p, &int4.to_bytes()[..150]).unwrap();
        let e = read_tensor(&p, [3, 100]).unwrap_err().to_string();
        assert!(e.contains("150 bytes fit no .symb encoding"), "{e}");
        // The same bytes read for another shape: not INT4 (header), and no raw size fits.
        let p = dir.join("t0.symb");
        assert!(read_tensor(&p, [4, 100]).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
