//! GGUF: the llama.cpp model container.
//!
//! Layout (all little-endian): magic `GGUF`, u32 version (2 or 3), u64 tensor count, u64
//! metadata count, the metadata key/values, the tensor infos (name, u32 rank, u64 dims innermost
//! first, u32 ggml type, u64 offset relative to the data section), padding to
//! `general.alignment` (default 32), then the tensor data.
//!
//! [`GgufFile::open`] validates everything before any use: every string, array and tensor lies
//! inside the file, no count or size overflows, every type id is known. A failure is a
//! [`GgufError`] naming the file, the key or tensor, and the byte offset.

mod error;
pub(crate) mod reader;
mod value;
mod writer;

pub use error::{GgufError, GgufErrorKind};
pub use reader::{GgufFile, TensorInfo, DEFAULT_ALIGNMENT, GGUF_MAGIC};
pub use value::{Value, ValueType};
pub use writer::GgufWriter;
