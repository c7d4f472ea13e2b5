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

/// Checks `--device` for a model that runs on the CPU only (`what` names it in the message):
/// `auto` and `cpu` pass, `cuda` and `cuda:N` are an error saying so, anything else is the
/// parse error.
pub fn require_cpu(arg: &str, what: &str) -> Result<()> {
    match arg {
        "auto" | "cpu" => Ok(()),
        other => match other.parse::<Device>() {
            Ok(Device::Cuda(_)) => bail!("--device {other}: {what} on the CPU only for now"),
            Ok(_) => Ok(()),
            Err(e) => bail!("--device {other}: {e}"),
        },
    }
}
