//! synaptix-kernels-cuda: the CUDA backend's foundation.
//!
//! - [`probe`]: whether libcuda and libnvrtc can be loaded, checked before cudarc is touched
//!   (cudarc panics when a library is missing), and what each GPU is.
//! - [`compile`]: the `.cu` sources of `kernels/`, embedded in the binary, compiled by NVRTC for
//!   the card's own architecture (CUBIN) and cached on disk, keyed by a hash of the source,
//!   options, architecture and NVRTC version.
//! - [`CudaDevice`]: a context, a stream and the loaded kernel modules, with typed launches.
//! - [`launch`]: the launch builder every op uses, with programmatic dependent launch on
//!   Hopper and later (`SYNAPTIX_NO_PDL` turns it off).

mod attention;
pub mod compile;
mod device;
mod error;
pub mod fused;
pub mod gemm;
pub mod gemm_k;
pub mod launch;
pub mod ops;
pub mod probe;
pub mod sample;
pub mod sources;

pub use device::{CudaDevice, DeviceBuffer, Readback, StepGraph, MIN_COMPUTE_CAPABILITY};
pub use error::{CudaError, Result};
pub use probe::{cuda_status, CudaStatus, GpuInfo};
