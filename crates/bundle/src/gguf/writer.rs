use std::io::{self, Write};

use synaptix_core::DType;

use super::reader::{DEFAULT_ALIGNMENT, GGUF_MAGIC};
use super::value::Value;

/// Builds a GGUF file in memory: metadata in insertion order, then tensors, each aligned.
///
/// Used by conversion tools and by tests that need small or deliberately broken files.
pub struct GgufWriter {
    pub version: u32,
    pub alignment: u64,
    metadata: Vec<(String, Value)>,
    tensors: Vec<PendingTensor>,
}

struct PendingTensor {
    name: String,
    /// Outermost first, as everywhere in synaptix; written innermost first.
    dims: Vec<u64>,
    dtype: DType,
    /// The bytes, or `None` for a tensor whose `len` bytes come from `write_streaming`'s callback.
    data: Option<Vec<u8>>,
    len: u64,
}

impl Default for GgufWriter {
    fn default() -> Self {
        GgufWriter {
            version: 3,
            alignment: DEFAULT_ALIGNMENT,
            metadata: Vec::new(),
            tensors: Vec::new(),
        }
    }
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn add_metadata(&mut self, key: impl Into<String>, value: Value) -> &mut Self {
        let key = key.into();
        if key == "general.alignment" {
            if let Some(a) = value.as_u64() {
                self.alignment = a.max(1);
            }
        }
        self.metadata.push((key, value));
        self
    }

    /// Adds a tensor; `dims` outermost first, `data` its raw bytes in `dtype`'s layout.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        dtype: DType,
        data: Vec<u8>,
    ) -> &mut Self {
        self.tensors.push(PendingTensor {
            name: name.into(),
            dims: dims.to_vec(),
            dtype,
            len: data.len() as u64,
            data: Some(data),
        });
        self
    }

    /// Adds a tensor of `len` bytes that [`GgufWriter::write_streaming`] asks its callback for
    /// when it gets there, so a large file never sits in memory whole.
    pub fn add_tensor_later(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        dtype: DType,
        len: u64,
    ) -> &mut Self {
        self.tensors.push(PendingTensor {
            name: name.into(),
            dims: dims.to_vec(),
            dtype,
            data: None,
            len,
        });
        self
    }

    /// Convenience: an F32 tensor from values.
    pub fn add_f32(&mut self, name: impl Into<String>, dims: &[u64], values: &[f32]) -> &mut Self {
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.add_tensor(name, dims, DType::F32, data)
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        // Writing into a Vec cannot fail.
        let _ = self.write_to(&mut out);
        out
    }

    pub fn write_to(&self, w: &mut impl Write) -> io::Result<()> {
        self.write_streaming(w, |i| {
            Err(io::Error::other(format!(
                "tensor {i} was added without data and this writer has no source for it"
            )))
        })
    }

    /// Writes the file: the header at once, then each tensor's bytes, those added with
    /// [`GgufWriter::add_tensor_later`] from `fill(tensor index)` (which must return exactly the
    /// announced length).
    pub fn write_streaming(
        &self,
        w: &mut impl Write,
        mut fill: impl FnMut(usize) -> io::Result<Vec<u8>>,
    ) -> io::Result<()> {
        if let Some(t) = self.tensors.iter().find(|t| !t.dtype.in_gguf()) {
            return Err(io::Error::other(format!(
                "tensor {} is {}, which GGUF cannot hold (write a .syn bundle instead)",
                t.name, t.dtype
            )));
        }
        let mut out = Vec::new();
        out.extend_from_slice(GGUF_MAGIC);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            put_string(&mut out, key);
            out.extend_from_slice(&(value.value_type() as u32).to_le_bytes());
            put_value(&mut out, value);
        }
        let align = self.alignment.max(1);
        let mut offset = 0u64;
        let mut offsets = Vec::with_capacity(self.tensors.len());
        for t in &self.tensors {
            offsets.push(offset);
            offset = (offset + t.len).div_ceil(align) * align;
        }
        for (t, off) in self.tensors.iter().zip(&offsets) {
            put_string(&mut out, &t.name);
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in t.dims.iter().rev() {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.dtype.gguf_id().to_le_bytes());
            out.extend_from_slice(&off.to_le_bytes());
        }
        // Data starts aligned; each tensor is padded so the next starts aligned.
        if !self.tensors.is_empty() {
            pad_to(&mut out, align);
        }
        w.write_all(&out)?;
        let mut written = out.len() as u64;
        for (i, t) in self.tensors.iter().enumerate() {
            let later;
            let data = match &t.data {
                Some(d) => d,
                None => {
                    later = fill(i)?;
                    if later.len() as u64 != t.len {
                        return Err(io::Error::other(format!(
                            "tensor {}: {} bytes announced, {} given",
                            t.name,
                            t.len,
                            later.len()
                        )));
                    }
                    &later
                }
            };
            w.write_all(data)?;
            written += t.len;
            // Every tensor is padded, the last one too: ggml's reader reads the data section as
            // the sum of the padded sizes (llama.cpp's and gguf-py's writers pad them all).
            let padded = written.div_ceil(align) * align;
            w.write_all(&vec![0u8; (padded - written) as usize])?;
            written = padded;
        }
        Ok(())
    }
}

fn pad_to(out: &mut Vec<u8>, align: u64) {
    let len = out.len() as u64;
    let padded = len.div_ceil(align) * align;
    out.resize(padded as usize, 0);
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::String(s) => put_string(out, s),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Array(ty, items) => {
            out.extend_from_slice(&(*ty as u32).to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                put_value(out, item);
            }
        }
    }
}
