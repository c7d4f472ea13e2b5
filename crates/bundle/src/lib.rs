//! synaptix-bundle: model file formats.
//!
//! - [`gguf`]: GGUF v2/v3 reader (memory-mapped, strictly validated, zero-copy tensors) and a
//!   writer used by conversion tools and tests.
//! - [`ct2`]: CTranslate2 `model.bin` reader (binary versions 5 and 6, memory-mapped, strictly
//!   validated).
//! - [`safetensors`]: Hugging Face safetensors reader (memory-mapped, strictly validated).
//! - [`onnx`]: ONNX `ModelProto` reader (memory-mapped, hand-parsed protobuf, strictly
//!   validated, zero-copy `raw_data`).
//! - [`symb`]: SYNAXIM's `.symb` directory format: one file per tensor (INT4 groups, FP16,
//!   FP32 or INT8); read and written tensor by tensor.
//! - [`syn`]: synaptix's own `.syn` bundle (`docs/syn.md`): read through [`GgufFile::open`],
//!   written by [`syn::write_syn`].
//! - [`imatrix`]: importance matrices in llama.cpp's GGUF layout, read and written.
//! - [`cache`]: where fetched models are cached.

pub mod cache;
pub mod ct2;
pub mod gguf;
pub mod imatrix;
pub mod onnx;
pub mod safetensors;
pub mod symb;
pub mod syn;

pub use ct2::{Ct2DType, Ct2Error, Ct2File, Ct2Variable};
pub use gguf::{GgufError, GgufFile, TensorInfo, Value, ValueType};
pub use onnx::{OnnxError, OnnxFile};
pub use safetensors::{SafetensorsError, SafetensorsFile, StDType, StTensor};
