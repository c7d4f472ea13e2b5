//! Reader for Hugging Face's safetensors files.
//!
//! ```text
//! u64     header length N              little-endian
//! u8[N]   header                       UTF-8 JSON object:
//!           "NAME": {"dtype": "F32", "shape": [d0, d1, ...], "data_offsets": [begin, end]}
//!           "__metadata__": {"key": "value", ...}      (optional, strings only)
//! u8[..]  data                         offsets are relative to the first byte after the header
//! ```
//!
//! The file is memory-mapped and validated at open as strictly as the reference library does:
//! the header must fit in the file and be at most 100 MB, every tensor's byte range must equal
//! its shape times its dtype size, and the ranges, sorted, must tile the data region exactly
//! (no overlap, no hole, nothing after the last tensor). A truncated or hostile file is a
//! [`SafetensorsError`] naming the file, never a panic or an out-of-bounds read. Data is not
//! aligned, so values are copied and converted, never cast in place.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use serde_json::Value;
use synaptix_core::Blob;

/// The largest header accepted (the reference implementation's limit).
pub const MAX_HEADER_LEN: u64 = 100_000_000;

/// Element type of a stored tensor, by its safetensors name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StDType {
    Bool,
    U8,
    I8,
    F8E4M3,
    F8E5M2,
    I16,
    U16,
    F16,
    BF16,
    I32,
    U32,
    F32,
    F64,
    I64,
    U64,
}

impl StDType {
    pub fn from_name(name: &str) -> Option<StDType> {
        Some(match name {
            "BOOL" => StDType::Bool,
            "U8" => StDType::U8,
            "I8" => StDType::I8,
            "F8_E4M3" => StDType::F8E4M3,
            "F8_E5M2" => StDType::F8E5M2,
            "I16" => StDType::I16,
            "U16" => StDType::U16,
            "F16" => StDType::F16,
            "BF16" => StDType::BF16,
            "I32" => StDType::I32,
            "U32" => StDType::U32,
            "F32" => StDType::F32,
            "F64" => StDType::F64,
            "I64" => StDType::I64,
            "U64" => StDType::U64,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            StDType::Bool => "BOOL",
            StDType::U8 => "U8",
            StDType::I8 => "I8",
            StDType::F8E4M3 => "F8_E4M3",
            StDType::F8E5M2 => "F8_E5M2",
            StDType::I16 => "I16",
            StDType::U16 => "U16",
            StDType::F16 => "F16",
            StDType::BF16 => "BF16",
            StDType::I32 => "I32",
            StDType::U32 => "U32",
            StDType::F32 => "F32",
            StDType::F64 => "F64",
            StDType::I64 => "I64",
            StDType::U64 => "U64",
        }
    }

    pub fn size_bytes(self) -> usize {
        match self {
            StDType::Bool | StDType::U8 | StDType::I8 | StDType::F8E4M3 | StDType::F8E5M2 => 1,
            StDType::I16 | StDType::U16 | StDType::F16 | StDType::BF16 => 2,
            StDType::I32 | StDType::U32 | StDType::F32 => 4,
            StDType::F64 | StDType::I64 | StDType::U64 => 8,
        }
    }
}

impl std::fmt::Display for StDType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One entry of the header. Its bytes are read with [`SafetensorsFile::bytes`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StTensor {
    pub name: String,
    /// Outermost first; empty for a scalar.
    pub shape: Vec<usize>,
    pub dtype: StDType,
    /// Absolute offset of the data in the file (checked at open).
    offset: usize,
    /// Data length in bytes (== elements × dtype size, checked at open).
    len: usize,
}

impl StTensor {
    /// Number of elements (1 for a scalar; cannot overflow, checked at open).
    pub fn elements(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn byte_len(&self) -> usize {
        self.len
    }

    /// Absolute byte offset of the data in the file.
    pub fn file_offset(&self) -> usize {
        self.offset
    }
}

/// A safetensors file that could not be read, or a tensor that is missing or ill-shaped;
/// every message is one line and names the file.
#[derive(Debug, thiserror::Error)]
pub enum SafetensorsError {
    #[error("{}: cannot open: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: is a directory, not a safetensors file", path.display())]
    IsDirectory { path: PathBuf },
    #[error("{}: truncated: {len} bytes, too short for the 8-byte header length", path.display())]
    TooShort { path: PathBuf, len: u64 },
    #[error("{}: header length {header_len} {problem} (file is {file_len} bytes)", path.display())]
    BadHeaderLength {
        path: PathBuf,
        header_len: u64,
        file_len: u64,
        problem: String,
    },
    #[error("{}: bad header: {problem}", path.display())]
    BadHeader { path: PathBuf, problem: String },
    #[error("{}: tensor '{name}': unknown dtype '{dtype}'", path.display())]
    UnknownDType {
        path: PathBuf,
        name: String,
        dtype: String,
    },
    #[error("{}: tensor '{name}': {problem}", path.display())]
    BadTensor {
        path: PathBuf,
        name: String,
        problem: String,
    },
    #[error("{}: tensor '{name}': data_offsets [{begin}, {end}] {problem}", path.display())]
    BadOffsets {
        path: PathBuf,
        name: String,
        begin: u64,
        end: u64,
        problem: String,
    },
    #[error("{}: no tensor named '{name}'", path.display())]
    MissingTensor { path: PathBuf, name: String },
    #[error(
        "{}: tensor '{name}' has shape {actual:?} ({actual_elements} elements), expected {rows} × {cols}",
        path.display()
    )]
    ShapeMismatch {
        path: PathBuf,
        name: String,
        rows: usize,
        cols: usize,
        actual: Vec<usize>,
        actual_elements: usize,
    },
    #[error("{}: tensor '{name}' is {dtype}, expected {expected}", path.display())]
    WrongType {
        path: PathBuf,
        name: String,
        dtype: StDType,
        expected: String,
    },
}

impl SafetensorsError {
    /// The file the error is about.
    pub fn path(&self) -> &Path {
        match self {
            SafetensorsError::Io { path, .. }
            | SafetensorsError::IsDirectory { path }
            | SafetensorsError::TooShort { path, .. }
            | SafetensorsError::BadHeaderLength { path, .. }
            | SafetensorsError::BadHeader { path, .. }
            | SafetensorsError::UnknownDType { path, .. }
            | SafetensorsError::BadTensor { path, .. }
            | SafetensorsError::BadOffsets { path, .. }
            | SafetensorsError::MissingTensor { path, .. }
            | SafetensorsError::ShapeMismatch { path, .. }
            | SafetensorsError::WrongType { path, .. } => path,
        }
    }
}

/// A validated, memory-mapped safetensors file.
pub struct SafetensorsFile {
    path: PathBuf,
    map: Arc<Mmap>,
    header_len: u64,
    /// In header order (JSON object order).
    tensors: Vec<StTensor>,
    metadata: Vec<(String, String)>,
    index: HashMap<String, usize>,
}

impl std::fmt::Debug for SafetensorsFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafetensorsFile")
            .field("path", &self.path)
            .field("tensors", &self.tensors.len())
            .field("metadata", &self.metadata.len())
            .finish()
    }
}

impl SafetensorsFile {
    /// Opens, maps and validates a `.safetensors` file.
    pub fn open(path: &Path) -> Result<SafetensorsFile, SafetensorsError> {
        let p = || path.to_path_buf();
        let io = |source| SafetensorsError::Io { path: p(), source };
        let meta = std::fs::metadata(path).map_err(io)?;
        if meta.is_dir() {
            return Err(SafetensorsError::IsDirectory { path: p() });
        }
        let file = File::open(path).map_err(io)?;
        let map = if meta.len() == 0 {
            None
        } else {
            // SAFETY: the map is read-only; a model file modified while mapped is a user error
            // that at worst yields wrong values (the GGUF reader maps models the same way).
            Some(unsafe { Mmap::map(&file) }.map_err(io)?)
        };
        let bytes: &[u8] = map.as_deref().unwrap_or(&[]);
        let file_len = bytes.len() as u64;
        if bytes.len() < 8 {
            return Err(SafetensorsError::TooShort {
                path: p(),
                len: file_len,
            });
        }
        let header_len = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
        let bad_len = |problem: &str| SafetensorsError::BadHeaderLength {
            path: p(),
            header_len,
            file_len,
            problem: problem.to_string(),
        };
        if header_len > MAX_HEADER_LEN {
            return Err(bad_len("exceeds the 100 MB limit"));
        }
        if header_len > file_len - 8 {
            return Err(bad_len("runs past the end of the file"));
        }
        let data_start = 8 + header_len as usize;
        let header = &bytes[8..data_start];
        let data_len = (bytes.len() - data_start) as u64;
        let parsed = parse_header(header, data_start, data_len).map_err(|f| f.into_error(path))?;
        let map = map.expect("non-empty file is mapped");
        Ok(SafetensorsFile {
            path: p(),
            map: Arc::new(map),
            header_len,
            index: parsed
                .tensors
                .iter()
                .enumerate()
                .map(|(i, t)| (t.name.clone(), i))
                .collect(),
            tensors: parsed.tensors,
            metadata: parsed.metadata,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn file_len(&self) -> u64 {
        self.map.len() as u64
    }

    pub fn header_len(&self) -> u64 {
        self.header_len
    }

    /// The tensors in header order.
    pub fn tensors(&self) -> &[StTensor] {
        &self.tensors
    }

    /// `__metadata__` as (key, value) pairs in header order.
    pub fn metadata(&self) -> &[(String, String)] {
        &self.metadata
    }

    pub fn get(&self, name: &str) -> Option<&StTensor> {
        self.index.get(name).map(|&i| &self.tensors[i])
    }

    /// Like [`SafetensorsFile::get`], with [`SafetensorsError::MissingTensor`] when absent.
    pub fn require(&self, name: &str) -> Result<&StTensor, SafetensorsError> {
        self.get(name)
            .ok_or_else(|| SafetensorsError::MissingTensor {
                path: self.path.clone(),
                name: name.to_string(),
            })
    }

    /// The tensor's raw little-endian bytes, borrowed from the mapping.
    ///
    /// # Panics
    /// If `t` does not come from this file and lies outside it.
    pub fn bytes(&self, t: &StTensor) -> &[u8] {
        &self.map[t.offset..t.offset + t.len]
    }

    /// The tensor's bytes as a shareable [`Blob`] that keeps the mapping alive (zero-copy).
    ///
    /// # Panics
    /// If `t` does not come from this file and lies outside it.
    pub fn blob(&self, t: &StTensor) -> Blob {
        let owner: Arc<dyn AsRef<[u8]> + Send + Sync> = self.map.clone();
        Blob::window(owner, t.offset..t.offset + t.len).expect("tensor bounds checked at open")
    }

    /// All elements as f32 (F32, F16, BF16 exactly; F64 rounded); other types are an error.
    pub fn f32_values(&self, name: &str) -> Result<Vec<f32>, SafetensorsError> {
        let t = self.require(name)?;
        self.convert(t)
    }

    /// All elements as f32 after checking that there are exactly `rows × cols` of them.
    pub fn f32_matrix(
        &self,
        name: &str,
        rows: usize,
        cols: usize,
    ) -> Result<Vec<f32>, SafetensorsError> {
        let t = self.require(name)?;
        if rows.checked_mul(cols) != Some(t.elements()) {
            return Err(SafetensorsError::ShapeMismatch {
                path: self.path.clone(),
                name: name.to_string(),
                rows,
                cols,
                actual: t.shape.clone(),
                actual_elements: t.elements(),
            });
        }
        self.convert(t)
    }

    fn convert(&self, t: &StTensor) -> Result<Vec<f32>, SafetensorsError> {
        let b = self.bytes(t);
        Ok(match t.dtype {
            StDType::F32 => b
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            StDType::F16 => b
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            StDType::BF16 => b
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            StDType::F64 => b
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")) as f32)
                .collect(),
            dtype => {
                return Err(SafetensorsError::WrongType {
                    path: self.path.clone(),
                    name: t.name.clone(),
                    dtype,
                    expected: "a float type (F32, F16, BF16, F64)".into(),
                })
            }
        })
    }
}

struct Parsed {
    tensors: Vec<StTensor>,
    metadata: Vec<(String, String)>,
}

/// A parse failure before the path is attached.
enum Fail {
    Header(String),
    UnknownDType {
        name: String,
        dtype: String,
    },
    Tensor {
        name: String,
        problem: String,
    },
    Offsets {
        name: String,
        begin: u64,
        end: u64,
        problem: String,
    },
}

impl Fail {
    fn into_error(self, path: &Path) -> SafetensorsError {
        let path = path.to_path_buf();
        match self {
            Fail::Header(problem) => SafetensorsError::BadHeader { path, problem },
            Fail::UnknownDType { name, dtype } => {
                SafetensorsError::UnknownDType { path, name, dtype }
            }
            Fail::Tensor { name, problem } => SafetensorsError::BadTensor {
                path,
                name,
                problem,
            },
            Fail::Offsets {
                name,
                begin,
                end,
                problem,
            } => SafetensorsError::BadOffsets {
                path,
                name,
                begin,
                end,
                problem,
            },
        }
    }
}

fn parse_header(header: &[u8], data_start: usize, data_len: u64) -> Result<Parsed, Fail> {
    let text = std::str::from_utf8(header).map_err(|e| Fail::Header(format!("not UTF-8 ({e})")))?;
    let value: Value =
        serde_json::from_str(text).map_err(|e| Fail::Header(format!("invalid JSON ({e})")))?;
    let Value::Object(entries) = value else {
        return Err(Fail::Header("not a JSON object".into()));
    };
    let mut tensors = Vec::with_capacity(entries.len());
    let mut metadata = Vec::new();
    // (begin, end, index into tensors)
    let mut ranges: Vec<(u64, u64, usize)> = Vec::with_capacity(entries.len());
    for (name, entry) in entries {
        if name == "__metadata__" {
            let Value::Object(m) = entry else {
                return Err(Fail::Header("__metadata__ is not an object".into()));
            };
            for (k, v) in m {
                let Value::String(s) = v else {
                    return Err(Fail::Header(format!(
                        "__metadata__ value of '{k}' is not a string"
                    )));
                };
                metadata.push((k, s));
            }
            continue;
        }
        let bad = |problem: &str| Fail::Tensor {
            name: name.clone(),
            problem: problem.to_string(),
        };
        let Value::Object(info) = &entry else {
            return Err(bad("entry is not an object"));
        };
        if let Some(k) = info
            .keys()
            .find(|k| !matches!(k.as_str(), "dtype" | "shape" | "data_offsets"))
        {
            return Err(bad(&format!("unexpected field '{k}'")));
        }
        let dtype_name = match info.get("dtype") {
            Some(Value::String(s)) => s,
            Some(_) => return Err(bad("dtype is not a string")),
            None => return Err(bad("no dtype")),
        };
        let dtype = StDType::from_name(dtype_name).ok_or_else(|| Fail::UnknownDType {
            name: name.clone(),
            dtype: dtype_name.clone(),
        })?;
        let shape = match info.get("shape") {
            Some(Value::Array(dims)) => dims
                .iter()
                .map(|d| {
                    d.as_u64()
                        .and_then(|d| usize::try_from(d).ok())
                        .ok_or_else(|| bad(&format!("shape dimension {d} is not a size")))
                })
                .collect::<Result<Vec<usize>, Fail>>()?,
            Some(_) => return Err(bad("shape is not an array")),
            None => return Err(bad("no shape")),
        };
        let (begin, end) = match info.get("data_offsets") {
            Some(Value::Array(o)) if o.len() == 2 => match (o[0].as_u64(), o[1].as_u64()) {
                (Some(b), Some(e)) => (b, e),
                _ => return Err(bad("data_offsets are not two byte offsets")),
            },
            Some(_) => return Err(bad("data_offsets is not an array of two offsets")),
            None => return Err(bad("no data_offsets")),
        };
        let offsets = |problem: String| Fail::Offsets {
            name: name.clone(),
            begin,
            end,
            problem,
        };
        if end < begin {
            return Err(offsets("end before begin".into()));
        }
        if end > data_len {
            return Err(offsets(format!(
                "run past the data ({data_len} bytes after the header)"
            )));
        }
        let bytes = shape
            .iter()
            .try_fold(dtype.size_bytes(), |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| bad(&format!("shape {shape:?} overflows")))?;
        if bytes as u64 != end - begin {
            return Err(offsets(format!(
                "hold {} bytes, but shape {shape:?} of {dtype} needs {bytes}",
                end - begin
            )));
        }
        ranges.push((begin, end, tensors.len()));
        tensors.push(StTensor {
            name,
            shape,
            dtype,
            offset: data_start + begin as usize,
            len: bytes,
        });
    }
    // The ranges, in order, must tile the data region: no overlap, no hole, no tail.
    ranges.sort_unstable();
    let mut at = 0u64;
    for &(begin, end, i) in &ranges {
        if begin != at {
            let problem = if begin < at {
                format!("overlap the previous tensor, which ends at {at}")
            } else {
                format!("leave a hole after byte {at}")
            };
            return Err(Fail::Offsets {
                name: tensors[i].name.clone(),
                begin,
                end,
                problem,
            });
        }
        at = end;
    }
    if at != data_len {
        return Err(Fail::Header(format!(
            "tensors cover {at} bytes of data, the file holds {data_len} after the header"
        )));
    }
    Ok(Parsed { tensors, metadata })
}
