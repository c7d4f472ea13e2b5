//! synaptix-bundle: model file formats.
//!
//! - [`gguf`]: GGUF v2/v3 reader (memory-mapped, strictly validated, zero-copy tensors) and a
//!   writer used by conversion tools and tests.
//! - [`cache`]: where fetched models are cached.

pub mod cache;
pub mod gguf;

pub use gguf::{GgufError, GgufFile, TensorInfo, Value, ValueType};
