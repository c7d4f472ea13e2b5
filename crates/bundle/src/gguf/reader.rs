use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use synaptix_core::{Blob, DType, Shape};

use super::error::{GgufError, GgufErrorKind as K};
use super::value::{Value, ValueType};

pub const GGUF_MAGIC: &[u8; 4] = b"GGUF";
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most four dimensions.
const MAX_RANK: u32 = 4;
/// Arrays of arrays are legal; deeper nesting than this is treated as hostile.
const MAX_ARRAY_DEPTH: usize = 8;

/// One entry of the tensor table.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    /// Outermost first (GGUF stores innermost first): a `[n_out, n_in]` matrix has rows of
    /// `n_in` contiguous elements.
    pub shape: Shape,
    pub dtype: DType,
    /// Absolute byte offset of the data in the file.
    pub file_offset: u64,
    pub n_bytes: u64,
    /// Offset of this entry in the tensor table, for error messages.
    pub info_offset: u64,
}

impl TensorInfo {
    pub fn elements(&self) -> u64 {
        self.shape.dims().iter().map(|&d| d as u64).product()
    }
}

/// A validated, memory-mapped LLM model file: GGUF, or a `.syn` bundle (`crate::syn`), which
/// carries the same typed metadata and tensor types. A model assembled from another layout (a
/// Hugging Face directory of safetensors) is held in the same shape through
/// [`GgufFile::assembled`], so that every LLM command reads it as it reads GGUF.
pub struct GgufFile {
    path: PathBuf,
    storage: Storage,
    pub version: u32,
    pub alignment: u64,
    /// Absolute offset of the tensor data section.
    pub data_offset: u64,
    metadata: Vec<(String, Value)>,
    metadata_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    /// A `.syn` bundle's per-tensor checksums (tensor order); `None` for GGUF.
    checksums: Option<Vec<u64>>,
    /// The layout an assembled model came from; `None` for GGUF and `.syn` files.
    label: Option<&'static str>,
}

/// Where the tensor bytes live.
enum Storage {
    /// One mapped file; `TensorInfo::file_offset` is absolute within it.
    Mapped(Arc<Mmap>),
    /// One blob per tensor, in table order (windows into other files' mappings, or owned bytes).
    Assembled(Vec<Blob>),
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Opens, maps and validates a GGUF file or a `.syn` bundle (told apart by the magic).
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let err = |kind| GgufError::new(path, kind);
        let meta = std::fs::metadata(path).map_err(|e| err(K::Io(e)))?;
        if meta.is_dir() {
            return Err(err(K::IsDirectory));
        }
        if meta.len() == 0 {
            return Err(err(K::Empty));
        }
        let file = File::open(path).map_err(|e| err(K::Io(e)))?;
        // SAFETY: the map is read-only; a model file modified while mapped is a user error
        // that at worst yields wrong values (llama.cpp and candle map models the same way).
        let map = unsafe { Mmap::map(&file) }.map_err(|e| err(K::Io(e)))?;
        Self::parse(path.to_path_buf(), Arc::new(map))
    }

    fn parse(path: PathBuf, map: Arc<Mmap>) -> Result<GgufFile, GgufError> {
        let parsed = if map.starts_with(crate::syn::SYN_MAGIC) {
            crate::syn::parse_header(&map[..])
        } else {
            parse_header(&map[..])
        };
        match parsed {
            Ok(h) => {
                let metadata_index = h
                    .metadata
                    .iter()
                    .enumerate()
                    .map(|(i, (k, _))| (k.clone(), i))
                    .collect();
                let tensor_index = h
                    .tensors
                    .iter()
                    .enumerate()
                    .map(|(i, t)| (t.name.clone(), i))
                    .collect();
                Ok(GgufFile {
                    path,
                    storage: Storage::Mapped(map),
                    version: h.version,
                    alignment: h.alignment,
                    data_offset: h.data_offset,
                    metadata: h.metadata,
                    metadata_index,
                    tensors: h.tensors,
                    tensor_index,
                    checksums: h.checksums,
                    label: None,
                })
            }
            Err(kind) => Err(GgufError::new(path, kind)),
        }
    }

    /// A model held in GGUF's shape whose tensors come from elsewhere: `metadata` with GGUF's
    /// keys, and each tensor's description with its bytes. `label` names the layout in reports
    /// ("safetensors"). Errors: a tensor whose byte count disagrees with its type and shape, or
    /// a name given twice.
    pub fn assembled(
        path: PathBuf,
        label: &'static str,
        metadata: Vec<(String, Value)>,
        tensors: Vec<(String, DType, Shape, Blob)>,
    ) -> Result<GgufFile, GgufError> {
        let mut infos = Vec::with_capacity(tensors.len());
        let mut blobs = Vec::with_capacity(tensors.len());
        let mut tensor_index = HashMap::with_capacity(tensors.len());
        let mut offset = 0u64;
        for (i, (name, dtype, shape, blob)) in tensors.into_iter().enumerate() {
            let elements: u64 = shape.dims().iter().map(|&d| d as u64).product();
            if dtype.bytes_for(elements) != Some(blob.len() as u64) {
                return Err(GgufError::new(
                    &path,
                    K::BadDims {
                        problem: format!(
                            "do not match the {} bytes given as {}",
                            blob.len(),
                            dtype.name()
                        ),
                        name,
                        dims: shape.dims().iter().map(|&d| d as u64).collect(),
                        offset: 0,
                    },
                ));
            }
            if tensor_index.insert(name.clone(), i).is_some() {
                return Err(GgufError::new(
                    &path,
                    K::DuplicateTensor { name, offset: 0 },
                ));
            }
            infos.push(TensorInfo {
                name,
                shape,
                dtype,
                file_offset: offset,
                n_bytes: blob.len() as u64,
                info_offset: 0,
            });
            offset += blob.len() as u64;
            blobs.push(blob);
        }
        let metadata_index = metadata
            .iter()
            .enumerate()
            .map(|(i, (k, _))| (k.clone(), i))
            .collect();
        Ok(GgufFile {
            path,
            storage: Storage::Assembled(blobs),
            version: 0,
            alignment: 1,
            data_offset: 0,
            metadata,
            metadata_index,
            tensors: infos,
            tensor_index,
            checksums: None,
            label: Some(label),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether this is a `.syn` bundle (else GGUF).
    pub fn is_syn(&self) -> bool {
        self.checksums.is_some()
    }

    /// The container's name and version for reports: "GGUF v3", ".syn v1".
    pub fn format_label(&self) -> String {
        if let Some(label) = self.label {
            label.to_string()
        } else if self.is_syn() {
            format!(".syn v{}", self.version)
        } else {
            format!("GGUF v{}", self.version)
        }
    }

    /// Checks every tensor's bytes against a `.syn` bundle's checksums, calling
    /// `progress(bytes done, bytes in all)` as it goes; `Ok(false)` for GGUF, which has none.
    pub fn verify_checksums(&self, mut progress: impl FnMut(u64, u64)) -> Result<bool, GgufError> {
        let Some(sums) = &self.checksums else {
            return Ok(false);
        };
        let total: u64 = self.tensors.iter().map(|t| t.n_bytes).sum();
        let mut done = 0u64;
        for (t, &expected) in self.tensors.iter().zip(sums) {
            let found = crate::syn::checksum_with_progress(self.tensor_bytes(t), 64 << 20, |d| {
                progress(done + d, total)
            });
            done += t.n_bytes;
            if found != expected {
                return Err(GgufError::new(
                    &self.path,
                    K::SynChecksum {
                        what: format!("tensor '{}'", t.name),
                        expected,
                        found,
                    },
                ));
            }
        }
        Ok(true)
    }

    /// The mapped file's length; for an assembled model, its tensors' bytes.
    pub fn file_len(&self) -> u64 {
        match &self.storage {
            Storage::Mapped(map) => map.len() as u64,
            Storage::Assembled(blobs) => blobs.iter().map(|b| b.len() as u64).sum(),
        }
    }

    /// Whether the tensors come from another layout ([`GgufFile::assembled`]).
    pub fn is_assembled(&self) -> bool {
        matches!(self.storage, Storage::Assembled(_))
    }

    /// Metadata in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// The tensor table in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The tensor's bytes, borrowed from the mapping (bounds were checked at open).
    pub fn tensor_bytes(&self, info: &TensorInfo) -> &[u8] {
        match &self.storage {
            Storage::Mapped(map) => {
                let start = info.file_offset as usize;
                &map[start..start + info.n_bytes as usize]
            }
            Storage::Assembled(blobs) => self
                .tensor_index
                .get(&info.name)
                .map_or(&[][..], |&i| blobs[i].as_bytes()),
        }
    }

    /// The tensor's bytes as a shareable [`Blob`] that keeps the mapping alive.
    pub fn tensor_blob(&self, name: &str) -> Result<(TensorInfo, Blob), GgufError> {
        let info = self
            .tensor_info(name)
            .ok_or_else(|| GgufError::new(&self.path, K::MissingTensor(name.to_string())))?;
        let map = match &self.storage {
            Storage::Mapped(map) => map,
            Storage::Assembled(blobs) => {
                let i = self.tensor_index[&info.name];
                return Ok((info.clone(), blobs[i].clone()));
            }
        };
        let start = info.file_offset as usize;
        let owner: Arc<dyn AsRef<[u8]> + Send + Sync> = map.clone();
        let blob = Blob::window(owner, start..start + info.n_bytes as usize).ok_or_else(|| {
            GgufError::new(
                &self.path,
                K::DataOutOfBounds {
                    name: name.to_string(),
                    start: info.file_offset,
                    end: info.file_offset + info.n_bytes,
                    file_len: self.file_len(),
                },
            )
        })?;
        Ok((info.clone(), blob))
    }

    // Typed metadata accessors: `Ok(None)` when absent, an error when present with the wrong type.

    pub fn get_str(&self, key: &str) -> Result<Option<&str>, GgufError> {
        self.typed(key, "a string", Value::as_str)
    }

    pub fn get_u64(&self, key: &str) -> Result<Option<u64>, GgufError> {
        self.typed(key, "a non-negative integer", Value::as_u64)
    }

    pub fn get_f64(&self, key: &str) -> Result<Option<f64>, GgufError> {
        self.typed(key, "a number", Value::as_f64)
    }

    pub fn get_bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        self.typed(key, "a bool", Value::as_bool)
    }

    pub fn get_array(&self, key: &str) -> Result<Option<&[Value]>, GgufError> {
        self.typed(key, "an array", Value::as_array)
    }

    /// An array of strings (e.g. `tokenizer.ggml.tokens`).
    pub fn get_str_array(&self, key: &str) -> Result<Option<Vec<&str>>, GgufError> {
        let Some(items) = self.get_array(key)? else {
            return Ok(None);
        };
        items
            .iter()
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| self.bad_meta(key, "expected an array of strings"))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// An array of numbers as f64 (scores, token types, per-layer hyper-parameters).
    pub fn get_f64_array(&self, key: &str) -> Result<Option<Vec<f64>>, GgufError> {
        let Some(items) = self.get_array(key)? else {
            return Ok(None);
        };
        items
            .iter()
            .map(|v| {
                v.as_f64()
                    .ok_or_else(|| self.bad_meta(key, "expected an array of numbers"))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// A metadata error naming this file, for callers that validate values.
    pub fn bad_meta(&self, key: &str, problem: impl Into<String>) -> GgufError {
        GgufError::new(
            &self.path,
            K::BadMetadata {
                key: key.to_string(),
                problem: problem.into(),
            },
        )
    }

    fn typed<'a, T>(
        &'a self,
        key: &str,
        expected: &str,
        f: impl Fn(&'a Value) -> Option<T>,
    ) -> Result<Option<T>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => f(v).map(Some).ok_or_else(|| {
                self.bad_meta(
                    key,
                    format!("expected {expected}, found {}", v.value_type().name()),
                )
            }),
        }
    }
}

/// A parsed, validated header: GGUF's, or a `.syn` bundle's (`crate::syn`).
pub(crate) struct Header {
    pub(crate) version: u32,
    pub(crate) alignment: u64,
    pub(crate) data_offset: u64,
    pub(crate) metadata: Vec<(String, Value)>,
    pub(crate) tensors: Vec<TensorInfo>,
    /// A `.syn` bundle's per-tensor XXH3-64 checksums, in tensor order; `None` for GGUF.
    pub(crate) checksums: Option<Vec<u64>>,
}

/// A bounds-checked little-endian reader that knows its offset.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], K> {
        if n > self.remaining() {
            return Err(K::Truncated {
                offset: self.pos as u64,
                what: what.to_string(),
                needed: n,
                available: self.remaining(),
            });
        }
        let start = self.pos;
        self.pos += n as usize;
        Ok(&self.buf[start..self.pos])
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], K> {
        let bytes = self.take(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> Result<u32, K> {
        self.array::<4>(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64, K> {
        self.array::<8>(what).map(u64::from_le_bytes)
    }

    fn string(&mut self, what: &str) -> Result<String, K> {
        let offset = self.pos as u64;
        let len = self.u64(what)?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| K::BadUtf8 {
            offset,
            what: what.to_string(),
        })
    }

    /// Checks that `count` items of at least `min_item_bytes` each can still fit.
    fn plausible(&self, count: u64, min_item_bytes: u64, what: &str, offset: u64) -> Result<(), K> {
        let fits = count
            .checked_mul(min_item_bytes)
            .is_some_and(|total| total <= self.remaining());
        if fits {
            Ok(())
        } else {
            Err(K::ImplausibleCount {
                what: what.to_string(),
                count,
                offset,
            })
        }
    }

    fn value(&mut self, ty: ValueType, key: &str, depth: usize) -> Result<Value, K> {
        let what = || format!("value of '{key}'");
        Ok(match ty {
            ValueType::U8 => Value::U8(self.array::<1>(&what())?[0]),
            ValueType::I8 => Value::I8(self.array::<1>(&what())?[0] as i8),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(&what())?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(&what())?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(self.array(&what())?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(&what())?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(&what())?)),
            ValueType::U64 => Value::U64(u64::from_le_bytes(self.array(&what())?)),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(&what())?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(&what())?)),
            ValueType::Bool => {
                let offset = self.pos as u64;
                match self.array::<1>(&what())?[0] {
                    0 => Value::Bool(false),
                    1 => Value::Bool(true),
                    b => {
                        return Err(K::BadMetadata {
                            key: key.to_string(),
                            problem: format!("bool byte {b} at offset {offset} is neither 0 nor 1"),
                        })
                    }
                }
            }
            ValueType::String => Value::String(self.string(&what())?),
            ValueType::Array => {
                let offset = self.pos as u64;
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(K::NestingTooDeep {
                        key: key.to_string(),
                        offset,
                        max_depth: MAX_ARRAY_DEPTH,
                    });
                }
                let type_id = self.u32(&what())?;
                let item_ty = ValueType::from_id(type_id).ok_or_else(|| K::UnknownValueType {
                    key: key.to_string(),
                    type_id,
                    offset,
                })?;
                let count_offset = self.pos as u64;
                let count = self.u64(&what())?;
                // Strings and arrays carry at least an 8-byte length / 12-byte header.
                let min_item = match item_ty {
                    ValueType::String => 8,
                    ValueType::Array => 12,
                    t => t.fixed_size().unwrap_or(1) as u64,
                };
                self.plausible(
                    count,
                    min_item,
                    &format!("array length of '{key}'"),
                    count_offset,
                )?;
                let mut items = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    items.push(self.value(item_ty, key, depth + 1)?);
                }
                Value::Array(item_ty, items)
            }
        })
    }
}

fn align_up(offset: u64, alignment: u64) -> Option<u64> {
    offset
        .checked_add(alignment - 1)
        .map(|v| v / alignment * alignment)
}

fn parse_header(buf: &[u8]) -> Result<Header, K> {
    let mut c = Cursor { buf, pos: 0 };
    if buf.len() < 4 || &buf[..4] != GGUF_MAGIC {
        return Err(K::BadMagic {
            found: buf[..buf.len().min(4)].to_vec(),
        });
    }
    c.pos = 4;
    let version = c.u32("version")?;
    if version != 2 && version != 3 {
        return Err(K::UnsupportedVersion(version));
    }
    let count_offset = c.pos as u64;
    let n_tensors = c.u64("tensor count")?;
    let n_kv = c.u64("metadata count")?;
    // A metadata entry is at least key length (8) + 1 byte key + type (4) + 1 byte value;
    // a tensor info at least name length (8) + rank (4) + type (4) + offset (8).
    c.plausible(n_kv, 14, "metadata count", count_offset + 8)?;
    c.plausible(n_tensors, 24, "tensor count", count_offset)?;

    let mut metadata: Vec<(String, Value)> = Vec::with_capacity(n_kv as usize);
    let mut seen_keys: HashMap<String, ()> = HashMap::with_capacity(n_kv as usize);
    for _ in 0..n_kv {
        let offset = c.pos as u64;
        let key = c.string("metadata key")?;
        let type_offset = c.pos as u64;
        let type_id = c.u32("metadata value type")?;
        let ty = ValueType::from_id(type_id).ok_or_else(|| K::UnknownValueType {
            key: key.clone(),
            type_id,
            offset: type_offset,
        })?;
        let value = c.value(ty, &key, 0)?;
        if seen_keys.insert(key.clone(), ()).is_some() {
            return Err(K::DuplicateKey { key, offset });
        }
        metadata.push((key, value));
    }

    let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some((_, v)) => {
            let a = v.as_u64().ok_or_else(|| K::BadMetadata {
                key: "general.alignment".into(),
                problem: format!("expected an integer, found {}", v.value_type().name()),
            })?;
            if a == 0 || !a.is_power_of_two() || a > 65536 {
                return Err(K::BadAlignment(a));
            }
            a
        }
    };

    struct Raw {
        name: String,
        dims: Vec<u64>,
        dtype: DType,
        rel_offset: u64,
        n_bytes: u64,
        info_offset: u64,
    }
    let mut raws: Vec<Raw> = Vec::with_capacity(n_tensors as usize);
    let mut seen_names: HashMap<String, ()> = HashMap::with_capacity(n_tensors as usize);
    for _ in 0..n_tensors {
        let info_offset = c.pos as u64;
        let name = c.string("tensor name")?;
        let rank = c.u32("tensor rank")?;
        if rank > MAX_RANK {
            return Err(K::BadRank {
                name,
                rank,
                offset: info_offset,
            });
        }
        let mut dims = Vec::with_capacity(rank as usize);
        for _ in 0..rank {
            dims.push(c.u64("tensor dimension")?);
        }
        let type_offset = c.pos as u64;
        let type_id = c.u32("tensor type")?;
        let dtype = DType::from_gguf_id(type_id).ok_or_else(|| K::UnknownTensorType {
            name: name.clone(),
            type_id,
            offset: type_offset,
        })?;
        let rel_offset = c.u64("tensor data offset")?;
        let bad_dims = |problem: &str| K::BadDims {
            name: name.clone(),
            dims: dims.clone(),
            offset: info_offset,
            problem: problem.to_string(),
        };
        let elements = dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| bad_dims("overflow the element count"))?;
        if usize::try_from(elements).is_err() || dims.iter().any(|&d| usize::try_from(d).is_err()) {
            return Err(bad_dims("exceed this machine's address space"));
        }
        let inner = dims.first().copied().unwrap_or(1);
        if inner % dtype.block_len() as u64 != 0 {
            return Err(bad_dims(&format!(
                "have a row length that is not a multiple of the {dtype} block size {}",
                dtype.block_len()
            )));
        }
        let n_bytes = dtype
            .bytes_for(elements)
            .ok_or_else(|| bad_dims("overflow the byte size"))?;
        if rel_offset % alignment != 0 {
            return Err(K::Misaligned {
                name,
                data_offset: rel_offset,
                alignment,
            });
        }
        if seen_names.insert(name.clone(), ()).is_some() {
            return Err(K::DuplicateTensor {
                name,
                offset: info_offset,
            });
        }
        raws.push(Raw {
            name,
            dims,
            dtype,
            rel_offset,
            n_bytes,
            info_offset,
        });
    }

    let file_len = buf.len() as u64;
    let data_offset = align_up(c.pos as u64, alignment).ok_or(K::BadAlignment(alignment))?;
    let mut tensors = Vec::with_capacity(raws.len());
    for r in raws {
        let out_of_bounds = |start: u64, end: u64| K::DataOutOfBounds {
            name: r.name.clone(),
            start,
            end,
            file_len,
        };
        let start = data_offset
            .checked_add(r.rel_offset)
            .ok_or_else(|| out_of_bounds(u64::MAX, u64::MAX))?;
        let end = start
            .checked_add(r.n_bytes)
            .ok_or_else(|| out_of_bounds(start, u64::MAX))?;
        if end > file_len {
            return Err(out_of_bounds(start, end));
        }
        let shape = Shape::new(r.dims.iter().rev().map(|&d| d as usize).collect::<Vec<_>>());
        tensors.push(TensorInfo {
            name: r.name,
            shape,
            dtype: r.dtype,
            file_offset: start,
            n_bytes: r.n_bytes,
            info_offset: r.info_offset,
        });
    }

    check_no_overlap(&tensors)?;
    Ok(Header {
        version,
        alignment,
        data_offset,
        metadata,
        tensors,
        checksums: None,
    })
}

/// Overlapping tensor data means a corrupt or hostile table (GGUF's and `.syn`'s).
pub(crate) fn check_no_overlap(tensors: &[TensorInfo]) -> Result<(), K> {
    let mut by_offset: Vec<&TensorInfo> = tensors.iter().filter(|t| t.n_bytes > 0).collect();
    by_offset.sort_by_key(|t| t.file_offset);
    for pair in by_offset.windows(2) {
        if pair[0].file_offset + pair[0].n_bytes > pair[1].file_offset {
            return Err(K::Overlap {
                first: pair[0].name.clone(),
                second: pair[1].name.clone(),
            });
        }
    }
    Ok(())
}
