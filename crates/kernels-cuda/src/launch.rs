//! Kernel launches with programmatic dependent launch (PDL).
//!
//! Every launch of the kernels in `kernels/` goes through [`Launch`]: the arguments are
//! collected by value into fixed slots owned by the builder, then the kernel is launched with
//! `cuLaunchKernelEx` and `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`, which lets
//! the GPU schedule it before the previous kernel on the stream has finished (stream capture
//! records a programmatic graph edge instead). That is only correct because every kernel
//! launched here begins with `PDL_WAIT()` (kernels/common.cuh: `griddepcontrol.wait`, which
//! blocks until the previous grids have completed and their writes are visible) before it
//! touches global memory: **a kernel without it must not be launched through this module.**
//!
//! PDL is off, and the launch is a plain `cuLaunchKernel` with the same arguments, when
//! `SYNAPTIX_NO_PDL` is set, the device is older than compute capability 9.0, the driver is
//! older than CUDA 12.3 (no programmatic edges in captured graphs) or does not export
//! `cuLaunchKernelEx`, or [`CudaDevice::set_pdl`] turned it off.

use std::ffi::c_void;
use std::marker::PhantomData;

use cudarc::driver::{sys, CudaFunction, DevicePtr, LaunchConfig};

use crate::{CudaDevice, CudaError, DeviceBuffer, Result};

/// Most arguments one launch takes (the widest kernel, `attention_scores_f32`, has 16).
const MAX_ARGS: usize = 32;

/// Whether a device with this compute capability, on this driver, can take PDL launches; the
/// environment switch is read by the caller.
pub(crate) fn pdl_supported(compute_capability: (i32, i32), driver_version: (i32, i32)) -> bool {
    compute_capability.0 >= 9 && driver_version >= (12, 3) && launch_ex_exported()
}

/// `SYNAPTIX_NO_PDL` set: every launch is a plain one (for comparisons).
pub(crate) fn pdl_disabled_by_env() -> bool {
    std::env::var_os("SYNAPTIX_NO_PDL").is_some()
}

/// Whether the loaded driver library exports `cuLaunchKernelEx` (cudarc panics on a call to a
/// missing symbol, so it is looked up first).
fn launch_ex_exported() -> bool {
    static EXPORTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *EXPORTED.get_or_init(|| {
        // SAFETY: only called once a device is open, so the driver library is loaded (culib
        // would otherwise panic); the symbol is looked up, not called.
        unsafe {
            sys::culib()
                .get::<unsafe extern "C" fn()>(b"cuLaunchKernelEx\0")
                .is_ok()
        }
    })
}

/// One argument of a [`Launch`]: device buffers (as their device address) and scalars (by
/// value). Buffers are borrowed for the builder's lifetime, `&mut` for the ones the kernel
/// writes, so the borrow checker still refuses a written buffer passed twice.
pub trait KernelArg<'a> {
    /// Writes the argument's value into `slot` (at its start: the driver reads as many bytes
    /// as the kernel's parameter has).
    fn write(self, slot: &mut u64, dev: &CudaDevice);
}

/// `v` into the start of `slot`.
fn put<T: Copy>(slot: &mut u64, v: T) {
    const {
        assert!(std::mem::size_of::<T>() <= 8 && std::mem::align_of::<T>() <= 8);
    }
    // SAFETY: `T` fits in the slot and needs no more alignment than a u64 (checked above).
    unsafe { (slot as *mut u64 as *mut T).write(v) }
}

fn device_address<T>(buf: &DeviceBuffer<T>, dev: &CudaDevice) -> sys::CUdeviceptr {
    // The guard would record a read event on drop when cudarc tracks events; CudaDevice turns
    // tracking off (one stream, stream-ordered frees), so it does nothing and may go at once.
    let (ptr, _guard) = buf.device_ptr(dev.stream());
    ptr
}

impl<'a, T> KernelArg<'a> for &'a DeviceBuffer<T> {
    fn write(self, slot: &mut u64, dev: &CudaDevice) {
        put(slot, device_address(self, dev));
    }
}

impl<'a, T> KernelArg<'a> for &'a mut DeviceBuffer<T> {
    fn write(self, slot: &mut u64, dev: &CudaDevice) {
        put(slot, device_address(self, dev));
    }
}

/// An optional buffer: its address, or a null pointer.
impl<'a, T> KernelArg<'a> for Option<&'a DeviceBuffer<T>> {
    fn write(self, slot: &mut u64, dev: &CudaDevice) {
        put(slot, self.map_or(0, |b| device_address(b, dev)));
    }
}

/// An optional written buffer: its address, or a null pointer.
impl<'a, T> KernelArg<'a> for Option<&'a mut DeviceBuffer<T>> {
    fn write(self, slot: &mut u64, dev: &CudaDevice) {
        put(slot, self.map_or(0, |b| device_address(b, dev)));
    }
}

macro_rules! scalar_arg {
    ($($t:ty),*) => {$(
        impl<'a> KernelArg<'a> for $t {
            fn write(self, slot: &mut u64, _dev: &CudaDevice) {
                put(slot, self);
            }
        }
    )*};
}
scalar_arg!(i32, u32, i64, u64, f32);

/// A kernel launch being assembled: `Launch::new(dev, &f).arg(..).arg(..)`, then
/// [`Launch::launch`]. The argument values live in the builder itself, which outlives the
/// driver call that copies them.
pub struct Launch<'a> {
    dev: &'a CudaDevice,
    func: &'a CudaFunction,
    slots: [u64; MAX_ARGS],
    len: usize,
    /// Set when more than MAX_ARGS arguments were pushed (reported by `launch`).
    overflow: bool,
    /// Ties the borrowed buffers to the builder.
    _args: PhantomData<&'a mut ()>,
}

impl<'a> Launch<'a> {
    pub fn new(dev: &'a CudaDevice, func: &'a CudaFunction) -> Launch<'a> {
        Launch {
            dev,
            func,
            slots: [0; MAX_ARGS],
            len: 0,
            overflow: false,
            _args: PhantomData,
        }
    }

    /// Appends the kernel's next parameter.
    pub fn arg(&mut self, a: impl KernelArg<'a>) -> &mut Self {
        match self.slots.get_mut(self.len) {
            Some(slot) => {
                a.write(slot, self.dev);
                self.len += 1;
            }
            None => self.overflow = true,
        }
        self
    }

    /// Launches the kernel on the device's stream, with PDL when the device allows it.
    ///
    /// # Safety
    /// The arguments must match the kernel's parameters in number, order and type, and the
    /// launch shape must keep every access of the kernel inside the buffers passed; the kernel
    /// must begin with `PDL_WAIT()` (see the module documentation).
    pub unsafe fn launch(&mut self, cfg: LaunchConfig) -> Result<()> {
        if self.overflow {
            return Err(CudaError::Invalid {
                op: "launch",
                detail: format!("more than {MAX_ARGS} kernel arguments"),
            });
        }
        self.dev.context().bind_to_thread()?;
        let mut params = [std::ptr::null_mut::<c_void>(); MAX_ARGS];
        for (p, slot) in params.iter_mut().zip(self.slots.iter_mut()) {
            *p = slot as *mut u64 as *mut c_void;
        }
        let params = &mut params[..self.len];
        let stream = self.dev.stream().cu_stream();
        let f = self.func.cu_function();
        if self.dev.pdl_enabled() {
            // SAFETY: a zeroed launch attribute value is valid; the driver reads only the field
            // of the attribute's id.
            let mut value: sys::CUlaunchAttributeValue = unsafe { std::mem::zeroed() };
            value.programmaticStreamSerializationAllowed = 1;
            let mut attr = sys::CUlaunchAttribute {
                id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
                pad: [0; 4],
                value,
            };
            let config = sys::CUlaunchConfig {
                gridDimX: cfg.grid_dim.0,
                gridDimY: cfg.grid_dim.1,
                gridDimZ: cfg.grid_dim.2,
                blockDimX: cfg.block_dim.0,
                blockDimY: cfg.block_dim.1,
                blockDimZ: cfg.block_dim.2,
                sharedMemBytes: cfg.shared_mem_bytes,
                hStream: stream,
                attrs: &mut attr,
                numAttrs: 1,
            };
            // SAFETY: `config` and `attr` outlive the call; `params` holds one pointer per
            // argument, each to a slot of `self` that the driver copies before returning; the
            // kernel's own contract is the caller's (see above). The symbol exists
            // (`pdl_enabled` implies `launch_ex_exported`).
            unsafe { sys::cuLaunchKernelEx(&config, f, params.as_mut_ptr(), std::ptr::null_mut()) }
                .result()?;
        } else {
            // SAFETY: as above, with a plain launch.
            unsafe {
                cudarc::driver::result::launch_kernel(
                    f,
                    cfg.grid_dim,
                    cfg.block_dim,
                    cfg.shared_mem_bytes,
                    stream,
                    params,
                )
            }?;
        }
        Ok(())
    }
}
