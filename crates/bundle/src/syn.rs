//! `.syn`: synaptix's single-file model bundle (format: `docs/syn.md`).
//!
//! A 64-byte header, the tensors (each aligned to 64 bytes or more), then a JSON directory that
//! holds the architecture, the typed metadata (GGUF's keys: hyper-parameters, tokenizer, chat
//! template) and the tensor table with one XXH3-64 checksum per tensor. [`GgufFile::open`]
//! reads `.syn` files too (it looks at the magic), so every LLM command takes either format;
//! [`write_syn`] writes one.

use std::collections::HashMap;
use std::io::{self, Seek, SeekFrom, Write};

use serde_json::{json, Map, Value as Json};
use synaptix_core::{DType, Shape};
use xxhash_rust::xxh3::{xxh3_64, Xxh3};

use crate::gguf::reader::{check_no_overlap, Header};
use crate::gguf::{GgufErrorKind as K, TensorInfo, Value, ValueType};

pub const SYN_MAGIC: &[u8; 8] = b"SYNAPTIX";
pub const SYN_VERSION: u32 = 1;
/// The fixed header's size; the data section starts right after it.
pub const SYN_HEADER_BYTES: u64 = 64;
/// The smallest tensor alignment a bundle may declare (and the one [`write_syn`] uses).
pub const SYN_ALIGNMENT: u64 = 64;
/// A directory larger than this is refused as hostile (a 150k-token vocabulary takes ~4 MB).
const MAX_DIRECTORY_BYTES: u64 = 1 << 30;
const FORMAT_NAME: &str = "synaptix-bundle";
/// Arrays of arrays nest at most this deep (as in GGUF).
const MAX_ARRAY_DEPTH: usize = 8;

/// The checksum of a tensor's bytes (and of the directory): XXH3-64 with seed 0.
pub fn checksum(bytes: &[u8]) -> u64 {
    xxh3_64(bytes)
}

/// One tensor to write: its name, dimensions (outermost first), type and byte length.
#[derive(Debug, Clone)]
pub struct SynTensor {
    pub name: String,
    pub dims: Vec<u64>,
    pub dtype: DType,
    pub bytes: u64,
}

/// Writes a bundle to `out`: the metadata in order (`general.architecture` among them), then
/// the tensors, whose bytes `data(i)` supplies one at a time (each exactly `tensors[i].bytes`
/// long), then the directory; the header is written last, so an interrupted write leaves a
/// file that readers refuse. `source` goes to the directory's `source` field.
pub fn write_syn<W: Write + Seek>(
    out: &mut W,
    metadata: &[(String, Value)],
    tensors: &[SynTensor],
    source: Option<Json>,
    mut data: impl FnMut(usize) -> io::Result<Vec<u8>>,
) -> io::Result<()> {
    let invalid = |msg: String| io::Error::new(io::ErrorKind::InvalidInput, msg);
    let architecture = metadata
        .iter()
        .find(|(k, _)| k == "general.architecture")
        .and_then(|(_, v)| v.as_str())
        .ok_or_else(|| invalid("the metadata has no general.architecture string".into()))?
        .to_string();
    out.write_all(&[0u8; SYN_HEADER_BYTES as usize])?;
    let mut pos = 0u64; // within the data section
    let mut entries = Vec::with_capacity(tensors.len());
    for (i, t) in tensors.iter().enumerate() {
        let padding = pos.next_multiple_of(SYN_ALIGNMENT) - pos;
        out.write_all(&vec![0u8; padding as usize])?;
        pos += padding;
        let bytes = data(i)?;
        if bytes.len() as u64 != t.bytes {
            return Err(invalid(format!(
                "tensor '{}': {} bytes supplied, {} declared",
                t.name,
                bytes.len(),
                t.bytes
            )));
        }
        out.write_all(&bytes)?;
        entries.push(json!({
            "name": t.name,
            "type": t.dtype.name(),
            "shape": t.dims,
            "offset": pos,
            "bytes": t.bytes,
            "xxh3": format!("{:016x}", checksum(&bytes)),
        }));
        pos += t.bytes;
    }
    let data_len = pos;
    let metadata: Vec<Json> = metadata
        .iter()
        .map(|(key, value)| {
            let mut entry = Map::new();
            entry.insert("key".into(), Json::String(key.clone()));
            entry.insert(
                "type".into(),
                Json::String(value.value_type().name().into()),
            );
            if let Value::Array(items, _) = value {
                entry.insert("items".into(), Json::String(items.name().into()));
            }
            entry.insert("value".into(), value_to_json(value));
            Json::Object(entry)
        })
        .collect();
    let mut directory = json!({
        "format": FORMAT_NAME,
        "version": SYN_VERSION,
        "architecture": architecture,
        "alignment": SYN_ALIGNMENT,
    });
    if let Some(source) = source {
        directory["source"] = source;
    }
    directory["metadata"] = Json::Array(metadata);
    directory["tensors"] = Json::Array(entries);
    let directory = serde_json::to_vec(&directory).map_err(io::Error::other)?;
    out.write_all(&directory)?;

    let mut header = Vec::with_capacity(SYN_HEADER_BYTES as usize);
    header.extend_from_slice(SYN_MAGIC);
    header.extend_from_slice(&SYN_VERSION.to_le_bytes());
    header.extend_from_slice(&0u32.to_le_bytes()); // flags
    header.extend_from_slice(&SYN_HEADER_BYTES.to_le_bytes());
    header.extend_from_slice(&data_len.to_le_bytes());
    header.extend_from_slice(&(SYN_HEADER_BYTES + data_len).to_le_bytes());
    header.extend_from_slice(&(directory.len() as u64).to_le_bytes());
    header.extend_from_slice(&checksum(&directory).to_le_bytes());
    header.extend_from_slice(&0u64.to_le_bytes()); // reserved
    out.seek(SeekFrom::Start(0))?;
    out.write_all(&header)?;
    out.seek(SeekFrom::End(0))?;
    Ok(())
}

/// A metadata value as the directory holds it (arrays: their items; nested arrays: objects
/// naming their item type).
fn value_to_json(v: &Value) -> Json {
    let float = |f: f64| {
        if f.is_nan() {
            Json::String("nan".into())
        } else if f.is_infinite() {
            Json::String(if f > 0.0 { "inf" } else { "-inf" }.into())
        } else {
            json!(f)
        }
    };
    match v {
        Value::U8(x) => json!(x),
        Value::I8(x) => json!(x),
        Value::U16(x) => json!(x),
        Value::I16(x) => json!(x),
        Value::U32(x) => json!(x),
        Value::I32(x) => json!(x),
        Value::U64(x) => json!(x),
        Value::I64(x) => json!(x),
        Value::F32(x) => float(*x as f64),
        Value::F64(x) => float(*x),
        Value::Bool(x) => json!(x),
        Value::String(s) => Json::String(s.clone()),
        Value::Array(_, items) => Json::Array(
            items
                .iter()
                .map(|item| match item {
                    Value::Array(inner, _) => json!({
                        "items": inner.name(),
                        "value": value_to_json(item),
                    }),
                    _ => value_to_json(item),
                })
                .collect(),
        ),
    }
}

fn value_type_named(name: &str) -> Option<ValueType> {
    (0..=12)
        .filter_map(ValueType::from_id)
        .find(|t| t.name() == name)
}

/// Reads one metadata value of type `ty` (`items` for arrays) from the directory.
fn value_from_json(
    ty: ValueType,
    items: Option<ValueType>,
    j: &Json,
    depth: usize,
) -> Result<Value, String> {
    let int = |lo: i128, hi: i128| -> Result<i128, String> {
        let v = j
            .as_i64()
            .map(i128::from)
            .or_else(|| j.as_u64().map(i128::from))
            .ok_or_else(|| format!("expected an integer ({}), found {j}", ty.name()))?;
        if v < lo || v > hi {
            return Err(format!("{v} does not fit a {}", ty.name()));
        }
        Ok(v)
    };
    let float = || -> Result<f64, String> {
        match j {
            Json::String(s) if s == "nan" => Ok(f64::NAN),
            Json::String(s) if s == "inf" => Ok(f64::INFINITY),
            Json::String(s) if s == "-inf" => Ok(f64::NEG_INFINITY),
            _ => j
                .as_f64()
                .ok_or_else(|| format!("expected a number, found {j}")),
        }
    };
    Ok(match ty {
        ValueType::U8 => Value::U8(int(0, u8::MAX as i128)? as u8),
        ValueType::I8 => Value::I8(int(i8::MIN as i128, i8::MAX as i128)? as i8),
        ValueType::U16 => Value::U16(int(0, u16::MAX as i128)? as u16),
        ValueType::I16 => Value::I16(int(i16::MIN as i128, i16::MAX as i128)? as i16),
        ValueType::U32 => Value::U32(int(0, u32::MAX as i128)? as u32),
        ValueType::I32 => Value::I32(int(i32::MIN as i128, i32::MAX as i128)? as i32),
        ValueType::U64 => Value::U64(int(0, u64::MAX as i128)? as u64),
        ValueType::I64 => Value::I64(int(i64::MIN as i128, i64::MAX as i128)? as i64),
        ValueType::F32 => Value::F32(float()? as f32),
        ValueType::F64 => Value::F64(float()?),
        ValueType::Bool => Value::Bool(
            j.as_bool()
                .ok_or_else(|| format!("expected a bool, found {j}"))?,
        ),
        ValueType::String => Value::String(
            j.as_str()
                .ok_or_else(|| format!("expected a string, found {j}"))?
                .to_string(),
        ),
        ValueType::Array => {
            if depth >= MAX_ARRAY_DEPTH {
                return Err(format!("arrays nested deeper than {MAX_ARRAY_DEPTH}"));
            }
            let items = items.ok_or("an array without \"items\"")?;
            let list = j
                .as_array()
                .ok_or_else(|| "expected an array".to_string())?;
            let mut out = Vec::with_capacity(list.len());
            for item in list {
                if items == ValueType::Array {
                    let inner = item
                        .get("items")
                        .and_then(Json::as_str)
                        .and_then(value_type_named)
                        .ok_or("a nested array without a known \"items\" type")?;
                    let value = item
                        .get("value")
                        .ok_or("a nested array without \"value\"")?;
                    out.push(value_from_json(
                        ValueType::Array,
                        Some(inner),
                        value,
                        depth + 1,
                    )?);
                } else {
                    out.push(value_from_json(items, None, item, depth + 1)?);
                }
            }
            Value::Array(items, out)
        }
    })
}

fn u64_at(buf: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&buf[at..at + 8]);
    u64::from_le_bytes(b)
}

fn u32_at(buf: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&buf[at..at + 4]);
    u32::from_le_bytes(b)
}

/// Parses and validates a whole bundle (the caller checked the magic). The tensors' own
/// checksums are returned, not checked: see [`crate::GgufFile::verify_checksums`].
pub(crate) fn parse_header(buf: &[u8]) -> Result<Header, K> {
    let file_len = buf.len() as u64;
    if file_len < SYN_HEADER_BYTES {
        return Err(K::Truncated {
            offset: 0,
            what: ".syn header".into(),
            needed: SYN_HEADER_BYTES,
            available: file_len,
        });
    }
    let header = |problem: String| K::SynHeader(problem);
    let version = u32_at(buf, 8);
    if version != SYN_VERSION {
        return Err(header(format!(
            "format version {version} (this build reads version {SYN_VERSION})"
        )));
    }
    let flags = u32_at(buf, 12);
    let data_offset = u64_at(buf, 16);
    let data_len = u64_at(buf, 24);
    let dir_offset = u64_at(buf, 32);
    let dir_len = u64_at(buf, 40);
    let dir_sum = u64_at(buf, 48);
    let reserved = u64_at(buf, 56);
    if flags != 0 || reserved != 0 {
        return Err(header(format!(
            "unknown flags {flags:#x} or reserved bits {reserved:#x}"
        )));
    }
    if data_offset != SYN_HEADER_BYTES {
        return Err(header(format!(
            "data offset {data_offset} (version 1 puts the data at {SYN_HEADER_BYTES})"
        )));
    }
    if data_offset.checked_add(data_len) != Some(dir_offset) {
        return Err(header(format!(
            "the directory offset {dir_offset} is not the data's end ({data_offset} + {data_len})"
        )));
    }
    if dir_len > MAX_DIRECTORY_BYTES {
        return Err(header(format!("implausible directory length {dir_len}")));
    }
    let end = dir_offset.checked_add(dir_len);
    if end != Some(file_len) {
        let needed = end.unwrap_or(u64::MAX);
        if needed > file_len {
            return Err(K::Truncated {
                offset: dir_offset.min(file_len),
                what: "the .syn data and directory".into(),
                needed: needed.saturating_sub(dir_offset.min(file_len)),
                available: file_len - dir_offset.min(file_len),
            });
        }
        return Err(header(format!(
            "{} bytes follow the directory's end at {needed}",
            file_len - needed
        )));
    }
    let dir_bytes = &buf[dir_offset as usize..file_len as usize];
    let found = checksum(dir_bytes);
    if found != dir_sum {
        return Err(K::SynChecksum {
            what: "the directory".into(),
            expected: dir_sum,
            found,
        });
    }
    let bad = |problem: String| K::SynDirectory(problem);
    let dir: Json =
        serde_json::from_slice(dir_bytes).map_err(|e| bad(format!("not valid JSON: {e}")))?;
    if dir.get("format").and_then(Json::as_str) != Some(FORMAT_NAME) {
        return Err(bad(format!("\"format\" is not \"{FORMAT_NAME}\"")));
    }
    if dir.get("version").and_then(Json::as_u64) != Some(SYN_VERSION as u64) {
        return Err(bad(format!(
            "\"version\" is not {SYN_VERSION}, as in the header"
        )));
    }
    let alignment = dir
        .get("alignment")
        .and_then(Json::as_u64)
        .ok_or_else(|| bad("no integer \"alignment\"".into()))?;
    if !alignment.is_power_of_two() || !(SYN_ALIGNMENT..=65536).contains(&alignment) {
        return Err(bad(format!(
            "alignment {alignment} is not a power of two from {SYN_ALIGNMENT} to 65536"
        )));
    }
    let architecture = dir
        .get("architecture")
        .and_then(Json::as_str)
        .ok_or_else(|| bad("no \"architecture\" string".into()))?;

    let entries = dir
        .get("metadata")
        .and_then(Json::as_array)
        .ok_or_else(|| bad("no \"metadata\" array".into()))?;
    let mut metadata = Vec::with_capacity(entries.len());
    let mut seen_keys: HashMap<&str, ()> = HashMap::with_capacity(entries.len());
    for (i, e) in entries.iter().enumerate() {
        let key = e
            .get("key")
            .and_then(Json::as_str)
            .ok_or_else(|| bad(format!("metadata entry {i} has no \"key\" string")))?;
        let meta_err = |problem: String| bad(format!("metadata key '{key}': {problem}"));
        if seen_keys.insert(key, ()).is_some() {
            return Err(meta_err("appears twice".into()));
        }
        let ty = e
            .get("type")
            .and_then(Json::as_str)
            .and_then(value_type_named)
            .ok_or_else(|| meta_err("no known \"type\"".into()))?;
        let items = match e.get("items") {
            None => None,
            Some(j) => Some(
                j.as_str()
                    .and_then(value_type_named)
                    .ok_or_else(|| meta_err("unknown \"items\" type".into()))?,
            ),
        };
        let value = e
            .get("value")
            .ok_or_else(|| meta_err("no \"value\"".into()))?;
        let value = value_from_json(ty, items, value, 0).map_err(meta_err)?;
        metadata.push((key.to_string(), value));
    }
    match metadata.iter().find(|(k, _)| k == "general.architecture") {
        Some((_, v)) if v.as_str() == Some(architecture) => {}
        _ => {
            return Err(bad(format!(
                "\"architecture\" is \"{architecture}\" but general.architecture does not say so"
            )))
        }
    }

    let list = dir
        .get("tensors")
        .and_then(Json::as_array)
        .ok_or_else(|| bad("no \"tensors\" array".into()))?;
    let mut tensors = Vec::with_capacity(list.len());
    let mut checksums = Vec::with_capacity(list.len());
    let mut seen_names: HashMap<&str, ()> = HashMap::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let name = t
            .get("name")
            .and_then(Json::as_str)
            .ok_or_else(|| bad(format!("tensor {i} has no \"name\" string")))?;
        let tensor_err = |problem: String| bad(format!("tensor '{name}': {problem}"));
        if seen_names.insert(name, ()).is_some() {
            return Err(tensor_err("appears twice".into()));
        }
        let type_name = t.get("type").and_then(Json::as_str).unwrap_or("");
        let dtype = DType::from_name(type_name)
            .ok_or_else(|| tensor_err(format!("unknown type \"{type_name}\"")))?;
        let dims: Vec<u64> = t
            .get("shape")
            .and_then(Json::as_array)
            .and_then(|dims| dims.iter().map(Json::as_u64).collect::<Option<Vec<_>>>())
            .ok_or_else(|| tensor_err("no \"shape\" array of non-negative integers".into()))?;
        if dims.len() > 4 {
            return Err(tensor_err(format!("rank {} exceeds 4", dims.len())));
        }
        let elements = dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .filter(|&e| usize::try_from(e).is_ok())
            .ok_or_else(|| tensor_err(format!("shape {dims:?} is too large")))?;
        let row = dims.last().copied().unwrap_or(1);
        if row % dtype.block_len() as u64 != 0 {
            return Err(tensor_err(format!(
                "rows of {row} values are not whole {dtype} blocks of {}",
                dtype.block_len()
            )));
        }
        let n_bytes = dtype
            .bytes_for(elements)
            .ok_or_else(|| tensor_err(format!("shape {dims:?} overflows its byte size")))?;
        let field = |key: &str| {
            t.get(key)
                .and_then(Json::as_u64)
                .ok_or_else(|| tensor_err(format!("no integer \"{key}\"")))
        };
        let offset = field("offset")?;
        let declared = field("bytes")?;
        if declared != n_bytes {
            return Err(tensor_err(format!(
                "{declared} bytes declared, its type and shape need {n_bytes}"
            )));
        }
        if offset % alignment != 0 {
            return Err(K::Misaligned {
                name: name.to_string(),
                data_offset: offset,
                alignment,
            });
        }
        match offset.checked_add(n_bytes) {
            Some(e) if e <= data_len => {}
            _ => {
                return Err(K::DataOutOfBounds {
                    name: name.to_string(),
                    start: data_offset + offset.min(data_len),
                    end: data_offset.saturating_add(offset).saturating_add(n_bytes),
                    file_len: dir_offset,
                })
            }
        }
        let sum = t
            .get("xxh3")
            .and_then(Json::as_str)
            .filter(|s| s.len() == 16)
            .and_then(|s| u64::from_str_radix(s, 16).ok())
            .ok_or_else(|| tensor_err("no \"xxh3\" of 16 hex digits".into()))?;
        tensors.push(TensorInfo {
            name: name.to_string(),
            shape: Shape::new(dims.iter().map(|&d| d as usize).collect::<Vec<_>>()),
            dtype,
            file_offset: data_offset + offset,
            n_bytes,
            info_offset: dir_offset,
        });
        checksums.push(sum);
    }
    check_no_overlap(&tensors)?;
    Ok(Header {
        version,
        alignment,
        data_offset,
        metadata,
        tensors,
        checksums: Some(checksums),
    })
}

/// The XXH3-64 of `bytes`, fed in pieces of `piece` bytes with `progress(done)` after each (for
/// progress reports on large tensors).
pub(crate) fn checksum_with_progress(
    bytes: &[u8],
    piece: usize,
    mut progress: impl FnMut(u64),
) -> u64 {
    let mut h = Xxh3::new();
    let mut done = 0u64;
    for chunk in bytes.chunks(piece.max(1)) {
        h.update(chunk);
        done += chunk.len() as u64;
        progress(done);
    }
    h.digest()
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;
    use std::path::PathBuf;

    use super::*;
    use crate::GgufFile;

    /// Every metadata type, nested arrays, floats JSON cannot hold, and extreme integers.
    fn metadata() -> Vec<(String, Value)> {
        vec![
            ("general.architecture".into(), Value::String("llama".into())),
            ("a.u8".into(), Value::U8(255)),
            ("a.i8".into(), Value::I8(-128)),
            ("a.u16".into(), Value::U16(65535)),
            ("a.i16".into(), Value::I16(-32768)),
            ("a.u32".into(), Value::U32(u32::MAX)),
            ("a.i32".into(), Value::I32(i32::MIN)),
            ("a.u64".into(), Value::U64(u64::MAX)),
            ("a.i64".into(), Value::I64(i64::MIN)),
            ("a.f32".into(), Value::F32(0.1)),
            ("a.f32_nan".into(), Value::F32(f32::NAN)),
            ("a.f64_inf".into(), Value::F64(f64::NEG_INFINITY)),
            ("a.f64".into(), Value::F64(1e-300)),
            ("a.bool".into(), Value::Bool(true)),
            (
                "a.str".into(),
                Value::String("Ġthe \"quoted\" \u{0}\n".into()),
            ),
            (
                "a.strings".into(),
                Value::Array(
                    ValueType::String,
                    vec![Value::String("x".into()), Value::String(String::new())],
                ),
            ),
            ("a.empty".into(), Value::Array(ValueType::F32, vec![])),
            (
                "a.nested".into(),
                Value::Array(
                    ValueType::Array,
                    vec![
                        Value::Array(ValueType::I32, vec![Value::I32(-1), Value::I32(2)]),
                        Value::Array(ValueType::String, vec![Value::String("y".into())]),
                    ],
                ),
            ),
        ]
    }

    fn tensors() -> (Vec<SynTensor>, Vec<Vec<u8>>) {
        let f32s: Vec<u8> = (0..6)
            .flat_map(|i| (i as f32 * 0.5).to_le_bytes())
            .collect();
        let q8: Vec<u8> = (0..2 * 34).map(|i| (i * 7 % 251) as u8).collect();
        let f16: Vec<u8> = (0..3 * 2).map(|i| i as u8).collect();
        (
            vec![
                SynTensor {
                    name: "a.weight".into(),
                    dims: vec![2, 3],
                    dtype: DType::F32,
                    bytes: 24,
                },
                SynTensor {
                    name: "b.weight".into(),
                    dims: vec![2, 32],
                    dtype: DType::Q8_0,
                    bytes: 68,
                },
                SynTensor {
                    name: "c.bias".into(),
                    dims: vec![3],
                    dtype: DType::F16,
                    bytes: 6,
                },
            ],
            vec![f32s, q8, f16],
        )
    }

    fn bundle() -> Vec<u8> {
        let (specs, data) = tensors();
        let mut out = Cursor::new(Vec::new());
        write_syn(&mut out, &metadata(), &specs, None, |i| Ok(data[i].clone())).unwrap();
        out.into_inner()
    }

    struct TempFile(PathBuf);
    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    fn temp(tag: &str, bytes: &[u8]) -> TempFile {
        let p = std::env::temp_dir().join(format!("syn-test-{tag}-{}.syn", std::process::id()));
        std::fs::write(&p, bytes).unwrap();
        TempFile(p)
    }

    fn open(tag: &str, bytes: &[u8]) -> Result<GgufFile, String> {
        let f = temp(tag, bytes);
        GgufFile::open(&f.0).map_err(|e| e.kind.to_string())
    }

    /// The bundle with its directory replaced by `dir` (header and checksum fixed up).
    fn with_directory(bytes: &[u8], dir: &Json) -> Vec<u8> {
        let dir_offset = u64_at(bytes, 32) as usize;
        let dir = serde_json::to_vec(dir).unwrap();
        let mut out = bytes[..dir_offset].to_vec();
        out.extend_from_slice(&dir);
        out[40..48].copy_from_slice(&(dir.len() as u64).to_le_bytes());
        out[48..56].copy_from_slice(&checksum(&dir).to_le_bytes());
        out
    }

    fn directory(bytes: &[u8]) -> Json {
        serde_json::from_slice(&bytes[u64_at(bytes, 32) as usize..]).unwrap()
    }

    #[test]
    fn round_trip_keeps_metadata_and_tensors() {
        let bytes = bundle();
        let f = open("round", &bytes).unwrap();
        assert!(f.is_syn());
        assert_eq!(f.format_label(), ".syn v1");
        let want = metadata();
        assert_eq!(f.metadata().len(), want.len());
        for ((k, v), (wk, wv)) in f.metadata().iter().zip(&want) {
            assert_eq!(k, wk);
            match (v, wv) {
                (Value::F32(a), Value::F32(b)) => assert_eq!(a.to_bits(), b.to_bits(), "{k}"),
                _ => assert_eq!(v, wv, "{k}"),
            }
        }
        let (specs, data) = tensors();
        for (t, (spec, d)) in f.tensors().iter().zip(specs.iter().zip(&data)) {
            assert_eq!(t.name, spec.name);
            assert_eq!(t.dtype, spec.dtype);
            let dims: Vec<u64> = t.shape.dims().iter().map(|&d| d as u64).collect();
            assert_eq!(dims, spec.dims);
            assert_eq!(t.file_offset % SYN_ALIGNMENT, 0, "{} aligned", t.name);
            assert_eq!(f.tensor_bytes(t), &d[..]);
        }
        assert!(f.verify_checksums(|_, _| {}).unwrap());
    }

    #[test]
    fn every_truncation_is_an_error() {
        let bytes = bundle();
        for len in 0..bytes.len() {
            let err = open(&format!("trunc{len}"), &bytes[..len]);
            assert!(err.is_err(), "a bundle cut to {len} bytes opened");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        let err = open("longer", &longer).unwrap_err();
        assert!(err.contains("follow the directory"), "{err}");
    }

    #[test]
    fn damage_is_found() {
        let bytes = bundle();
        // Any flipped byte in the directory: its checksum.
        let dir_at = u64_at(&bytes, 32) as usize;
        let mut bad = bytes.clone();
        bad[dir_at + 10] ^= 1;
        let err = open("dirflip", &bad).unwrap_err();
        assert!(err.contains("directory is damaged"), "{err}");
        // A flipped weight byte: found by the tensors' checksums, not at open.
        let mut bad = bytes.clone();
        bad[SYN_HEADER_BYTES as usize + 3] ^= 0x80;
        let f = temp("dataflip", &bad);
        let file = GgufFile::open(&f.0).unwrap();
        let err = file.verify_checksums(|_, _| {}).unwrap_err().to_string();
        assert!(err.contains("tensor 'a.weight' is damaged"), "{err}");
        // Header fields.
        for (at, value, expect) in [
            (8usize, 2u64, "format version 2"),
            (12, 1, "unknown flags"),
            (16, 128, "data offset 128"),
            (56, 1 << 32, "reserved"),
        ] {
            let mut bad = bytes.clone();
            if at == 8 || at == 12 {
                bad[at..at + 4].copy_from_slice(&(value as u32).to_le_bytes());
            } else {
                bad[at..at + 8].copy_from_slice(&value.to_le_bytes());
            }
            let err = open("header", &bad).unwrap_err();
            assert!(err.contains(expect), "{expect}: {err}");
        }
    }

    #[test]
    fn hostile_directories_are_refused() {
        let bytes = bundle();
        let base = directory(&bytes);
        type Change = Box<dyn Fn(&mut Json)>;
        let cases: Vec<(&str, Change)> = vec![
            ("format", Box::new(|d| d["format"] = json!("gguf"))),
            ("alignment 32", Box::new(|d| d["alignment"] = json!(32))),
            (
                "does not say so",
                Box::new(|d| d["architecture"] = json!("qwen2")),
            ),
            (
                "appears twice",
                Box::new(|d| {
                    let first = d["metadata"][1].clone();
                    d["metadata"].as_array_mut().unwrap().push(first);
                }),
            ),
            (
                "does not fit a u8",
                Box::new(|d| d["metadata"][1]["value"] = json!(256)),
            ),
            (
                "no known \"type\"",
                Box::new(|d| d["metadata"][1]["type"] = json!("u128")),
            ),
            (
                "unknown type",
                Box::new(|d| d["tensors"][0]["type"] = json!("q9_9")),
            ),
            (
                "bytes declared",
                Box::new(|d| d["tensors"][0]["bytes"] = json!(23)),
            ),
            (
                "not a multiple of the alignment",
                Box::new(|d| d["tensors"][1]["offset"] = json!(65)),
            ),
            (
                "lies outside",
                Box::new(|d| d["tensors"][2]["offset"] = json!(1u64 << 40)),
            ),
            (
                "overlap",
                Box::new(|d| d["tensors"][1]["offset"] = json!(0)),
            ),
            (
                "not whole q8_0 blocks",
                Box::new(|d| {
                    d["tensors"][1]["shape"] = json!([4, 16]);
                }),
            ),
            (
                "appears twice",
                Box::new(|d| d["tensors"][1]["name"] = json!("a.weight")),
            ),
            ("xxh3", Box::new(|d| d["tensors"][0]["xxh3"] = json!("zz"))),
            (
                "rank 5",
                Box::new(|d| d["tensors"][2]["shape"] = json!([1, 1, 1, 1, 3])),
            ),
            (
                "nested deeper",
                Box::new(|d| {
                    let mut v = json!([1]);
                    for _ in 0..10 {
                        v = json!([{"items": "array", "value": v}]);
                    }
                    d["metadata"][1] =
                        json!({"key": "deep", "type": "array", "items": "array", "value": v});
                }),
            ),
        ];
        for (expect, change) in cases {
            let mut d = base.clone();
            change(&mut d);
            let err = open("hostile", &with_directory(&bytes, &d)).unwrap_err();
            assert!(err.contains(expect), "{expect}: {err}");
        }
        let mut not_json = bytes.clone();
        let at = u64_at(&bytes, 32) as usize;
        not_json.truncate(at);
        not_json.extend_from_slice(b"{\"format\": ");
        let len = (not_json.len() - at) as u64;
        not_json[40..48].copy_from_slice(&len.to_le_bytes());
        let sum = checksum(&not_json[at..]);
        not_json[48..56].copy_from_slice(&sum.to_le_bytes());
        let err = open("notjson", &not_json).unwrap_err();
        assert!(err.contains("not valid JSON"), "{err}");
    }

    #[test]
    fn writer_checks_its_input() {
        let (specs, data) = tensors();
        let mut out = Cursor::new(Vec::new());
        let err = write_syn(&mut out, &metadata()[1..], &specs, None, |i| {
            Ok(data[i].clone())
        })
        .unwrap_err();
        assert!(err.to_string().contains("general.architecture"), "{err}");
        let err = write_syn(&mut out, &metadata(), &specs, None, |_| Ok(vec![0u8; 5])).unwrap_err();
        assert!(err.to_string().contains("5 bytes supplied"), "{err}");
    }
}
