//! synaptix-core: the vocabulary every other crate speaks.
//!
//! - [`DType`]: every element and block type a weight can be stored in (all ggml block types,
//!   with their GGUF ids, block lengths and block byte sizes).
//! - [`Shape`]: dimensions with overflow-checked element and byte counts.
//! - [`Device`]: where computation runs.
//! - [`Error`]: the typed errors shared by kernels and layers.

mod blob;
mod device;
mod dtype;
mod error;
mod shape;

pub use blob::Blob;
pub use device::Device;
pub use dtype::DType;
pub use error::{Error, Result};
pub use shape::Shape;
