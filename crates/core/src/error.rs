use crate::{DType, Shape};

/// Errors of kernels and layers: each names the op and what did not fit.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{op}: {dtype} tensors are not supported by this backend")]
    UnsupportedDType { op: &'static str, dtype: DType },

    #[error("{op}: shape mismatch: {detail}")]
    ShapeMismatch { op: &'static str, detail: String },

    #[error("{op}: tensor '{name}' has shape {shape}, expected {expected}")]
    UnexpectedShape {
        op: &'static str,
        name: String,
        shape: Shape,
        expected: String,
    },

    #[error("{op}: {detail}")]
    Invalid { op: &'static str, detail: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
