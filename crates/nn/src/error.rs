use synaptix_bundle::GgufError;
use synaptix_core::{DType, Shape};

#[derive(Debug, thiserror::Error)]
pub enum NnError {
    #[error(transparent)]
    Kernel(#[from] synaptix_core::Error),
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Ct2(#[from] synaptix_bundle::ct2::Ct2Error),
    #[error(transparent)]
    Safetensors(#[from] synaptix_bundle::safetensors::SafetensorsError),
    #[error(transparent)]
    Onnx(#[from] synaptix_bundle::onnx::OnnxError),
    /// An ONNX graph whose structure a layer cannot take (a missing node, an attribute out of
    /// range).
    #[error("{source_name}: {problem}")]
    OnnxGraph {
        source_name: String,
        problem: String,
    },
    #[error(transparent)]
    Cuda(#[from] synaptix_kernels_cuda::CudaError),
    #[error("{source_name}: missing tensor '{name}'")]
    MissingTensor { source_name: String, name: String },
    #[error("tensor '{name}' has shape {shape}, expected {expected}")]
    BadShape {
        name: String,
        shape: Shape,
        expected: String,
    },
    #[error("tensor '{name}' is stored as {dtype}, which synaptix cannot execute yet")]
    UnsupportedWeight { name: String, dtype: DType },
    #[error("tensor '{name}' is stored as {dtype}, which only the CPU executes so far (use --device cpu)")]
    CpuOnlyWeight { name: String, dtype: DType },
    #[error("cannot allocate the KV cache ({bytes} bytes): lower --ctx-size")]
    OutOfMemory { bytes: usize },
    #[error("context full: position {pos} is beyond the KV cache capacity of {capacity} tokens")]
    ContextFull { pos: usize, capacity: usize },
    /// A model-level failure inside a [`crate::Backend::decode_step`] closure, by message (the
    /// model keeps the typed error).
    #[error("{0}")]
    Step(String),
    /// Hyper-parameters a layer cannot take, by message.
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T, E = NnError> = std::result::Result<T, E>;
