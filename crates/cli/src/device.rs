//! `--device auto|cpu|cuda|cuda:N`, shared by the model subcommands.

use anyhow::{bail, Result};
use synaptix_core::Device;
use synaptix_kernels_cuda::{cuda_status, CudaStatus};

/// The device to run on, and a notice to print once the model is loaded when `auto` fell back
/// to the CPU.
pub fn resolve(arg: &str) -> Result<(Device, Option<String>)> {
    let status = cuda_status();
    if arg == "auto" {
        return Ok(match status {
            CudaStatus::Available { .. } => (Device::Cuda(0), None),
            CudaStatus::Unavailable(why) => (
                Device::Cpu,
                Some(format!("note: no usable GPU ({why}); running on the CPU")),
            ),
        });
    }
    let device: Device = arg.parse().map_err(anyhow::Error::msg)?;
    if let Device::Cuda(n) = device {
        match status {
            CudaStatus::Unavailable(why) => bail!("--device {arg}: CUDA is not available: {why}"),
            CudaStatus::Available { gpus, .. } if n >= gpus.len() => {
                bail!("--device {arg}: this machine has {} GPU(s)", gpus.len())
            }
            CudaStatus::Available { .. } => {}
        }
    }
    Ok((device, None))
}
