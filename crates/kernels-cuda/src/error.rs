/// CUDA backend errors; each says what to do where the user can act.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error("CUDA is not available: {0}")]
    Unavailable(String),
    #[error("{name} has compute capability {major}.{minor}; synaptix's CUDA kernels need 8.0 or newer (Ampere)")]
    TooOld {
        name: String,
        major: i32,
        minor: i32,
    },
    #[error("no CUDA device {ordinal} (this machine has {count})")]
    NoSuchDevice { ordinal: usize, count: usize },
    #[error("CUDA driver call failed: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
    #[error("NVRTC could not compile {kernel} for {arch}: {log}")]
    Compile {
        kernel: String,
        arch: String,
        log: String,
    },
    #[error("NVRTC error: {0}")]
    Nvrtc(String),
    #[error("no kernel named '{0}' in the embedded sources")]
    UnknownKernel(String),
    #[error("{op}: {detail}")]
    Invalid { op: &'static str, detail: String },
}

pub type Result<T, E = CudaError> = std::result::Result<T, E>;
