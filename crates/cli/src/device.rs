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

/// [`resolve`] for a model: `auto` also falls back to the CPU, with a notice, for a model
/// that only the CPU runs (mixture-of-experts layers, synaptix's own weight types). Models
/// that do not open are left for the loader to report.
pub fn resolve_for_model(arg: &str, model: &std::path::Path) -> Result<(Device, Option<String>)> {
    let (device, notice) = resolve(arg)?;
    if arg != "auto" || device == Device::Cpu {
        return Ok((device, notice));
    }
    let path = synaptix_bundle::cache::resolve_model(&model.to_string_lossy());
    let why = synaptix_models::open_model_file(&path)
        .ok()
        .and_then(|f| synaptix_models::cpu_only_reason(&f));
    Ok(match why {
        Some(why) => (
            Device::Cpu,
            Some(format!("note: {why}; running on the CPU")),
        ),
        None => (device, notice),
    })
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
