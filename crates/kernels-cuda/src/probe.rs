//! Is CUDA usable here, and on what?
//!
//! cudarc, built with dynamic loading, panics on first use when libcuda or libnvrtc is absent.
//! Everything in synaptix that touches CUDA goes through [`cuda_status`] first.

use std::sync::OnceLock;

use cudarc::driver::CudaContext;

/// What one GPU is.
#[derive(Debug, Clone)]
pub struct GpuInfo {
    pub ordinal: usize,
    pub name: String,
    /// `(major, minor)`, e.g. `(9, 0)` for Hopper.
    pub compute_capability: (i32, i32),
    pub total_memory: usize,
    pub free_memory: usize,
}

impl GpuInfo {
    /// NVRTC's `--gpu-architecture` value for this card (`sm_90`).
    pub fn arch(&self) -> String {
        format!(
            "sm_{}{}",
            self.compute_capability.0, self.compute_capability.1
        )
    }
}

/// The machine's CUDA situation.
#[derive(Debug, Clone)]
pub enum CudaStatus {
    /// libcuda or libnvrtc cannot be loaded, or the driver reports no device.
    Unavailable(String),
    Available {
        /// `(major, minor)` of the driver's CUDA version.
        driver_version: (i32, i32),
        nvrtc_version: (i32, i32),
        gpus: Vec<GpuInfo>,
    },
}

/// True when NVRTC alone can be loaded (compiling needs no GPU).
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen the library under its known names.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

fn driver_present() -> bool {
    // SAFETY: as above, for libcuda.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// NVRTC's version, when the library loads.
pub fn nvrtc_version() -> Option<(i32, i32)> {
    if !nvrtc_present() {
        return None;
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is present; the call writes two ints.
    let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    (r == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS).then_some((major, minor))
}

/// Probes once per process.
pub fn cuda_status() -> &'static CudaStatus {
    static STATUS: OnceLock<CudaStatus> = OnceLock::new();
    STATUS.get_or_init(probe)
}

fn probe() -> CudaStatus {
    if !driver_present() {
        return CudaStatus::Unavailable("libcuda.so (the NVIDIA driver) is not installed".into());
    }
    let Some(nvrtc_version) = nvrtc_version() else {
        return CudaStatus::Unavailable(
            "libnvrtc.so (CUDA's run-time compiler) cannot be loaded; install the CUDA toolkit \
             or the nvidia-cuda-nvrtc package and add its lib folder to LD_LIBRARY_PATH"
                .into(),
        );
    };
    // The driver library is present (checked above), so cudarc can load it.
    if let Err(e) = cudarc::driver::result::init() {
        return CudaStatus::Unavailable(format!("the CUDA driver did not initialise: {e}"));
    }
    let mut version = 0;
    // SAFETY: initialised driver; writes one int.
    unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut version) };
    let count = match CudaContext::device_count() {
        Ok(n) if n > 0 => n as usize,
        Ok(_) => return CudaStatus::Unavailable("the driver reports no CUDA device".into()),
        Err(e) => return CudaStatus::Unavailable(format!("cannot count CUDA devices: {e}")),
    };
    let mut gpus = Vec::with_capacity(count);
    for ordinal in 0..count {
        let info = CudaContext::new(ordinal).and_then(|ctx| {
            let (free, total) = ctx.mem_get_info()?;
            Ok(GpuInfo {
                ordinal,
                name: ctx.name()?,
                compute_capability: ctx.compute_capability()?,
                total_memory: total,
                free_memory: free,
            })
        });
        match info {
            Ok(i) => gpus.push(i),
            Err(e) => {
                return CudaStatus::Unavailable(format!("cannot open CUDA device {ordinal}: {e}"))
            }
        }
    }
    CudaStatus::Available {
        driver_version: (version / 1000, (version % 1000) / 10),
        nvrtc_version,
        gpus,
    }
}
