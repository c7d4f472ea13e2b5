use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits,
};
use cudarc::nvrtc::Ptx;

use crate::compile::compile;
use crate::probe::{cuda_status, CudaStatus, GpuInfo};
use crate::sources::find;
use crate::{CudaError, Result};

/// Device memory holding `T`s.
pub type DeviceBuffer<T> = CudaSlice<T>;

/// One GPU: its context, the stream all work goes on, and kernel modules loaded on first use.
pub struct CudaDevice {
    pub info: GpuInfo,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
    /// Seconds spent compiling or loading kernels (cold vs warm start reports).
    compile_seconds: Mutex<f64>,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaDevice({} {})", self.info.ordinal, self.info.name)
    }
}

impl CudaDevice {
    /// Opens GPU `ordinal`; a clear error when CUDA or that GPU is missing.
    pub fn new(ordinal: usize) -> Result<CudaDevice> {
        let gpus = match cuda_status() {
            CudaStatus::Unavailable(why) => return Err(CudaError::Unavailable(why.clone())),
            CudaStatus::Available { gpus, .. } => gpus,
        };
        let info = gpus.get(ordinal).cloned().ok_or(CudaError::NoSuchDevice {
            ordinal,
            count: gpus.len(),
        })?;
        let ctx = CudaContext::new(ordinal)?;
        let stream = ctx.default_stream();
        keep_pool_memory(&ctx);
        Ok(CudaDevice {
            info,
            ctx,
            stream,
            modules: Mutex::new(HashMap::new()),
            compile_seconds: Mutex::new(0.0),
        })
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Total seconds spent getting kernels ready (NVRTC or cache, plus module loads).
    pub fn compile_seconds(&self) -> f64 {
        self.compile_seconds.lock().map_or(0.0, |s| *s)
    }

    /// The kernel `name` from file `file`, compiling and loading the file on first use.
    pub fn function(&self, file: &'static str, name: &str) -> Result<CudaFunction> {
        let module = {
            let mut modules = self
                .modules
                .lock()
                .map_err(|_| CudaError::Nvrtc("module table poisoned".into()))?;
            match modules.get(file) {
                Some(m) => m.clone(),
                None => {
                    let start = std::time::Instant::now();
                    let kf =
                        find(file).ok_or_else(|| CudaError::UnknownKernel(file.to_string()))?;
                    let compiled = compile(kf, &self.info.arch(), true)?;
                    let m = self.ctx.load_module(Ptx::from_binary(compiled.cubin))?;
                    if let Ok(mut s) = self.compile_seconds.lock() {
                        *s += start.elapsed().as_secs_f64();
                    }
                    modules.insert(kf.name, m.clone());
                    m
                }
            }
        };
        module
            .load_function(name)
            .map_err(|_| CudaError::UnknownKernel(format!("{file}::{name}")))
    }

    /// Opts `f` into the device's largest dynamic shared memory per block and returns that size
    /// in bytes (48 KiB without opting in; 227 KiB on Hopper).
    pub fn max_shared_memory(&self, f: &CudaFunction) -> Result<usize> {
        use cudarc::driver::sys::{CUdevice_attribute, CUfunction_attribute};
        let optin = self
            .ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?;
        let static_bytes = f.shared_size_bytes()?;
        let dynamic = (optin - static_bytes).max(0);
        f.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            dynamic,
        )?;
        Ok(dynamic as usize)
    }

    pub fn upload<T: DeviceRepr>(&self, host: &[T]) -> Result<DeviceBuffer<T>> {
        Ok(self.stream.clone_htod(host)?)
    }

    /// Memory whose contents are whatever the allocator left there.
    ///
    /// # Safety
    /// Every element must be written before it is read (each kernel writes its whole output).
    pub unsafe fn uninit<T: DeviceRepr>(&self, n: usize) -> Result<DeviceBuffer<T>> {
        // SAFETY: forwarded to the caller.
        Ok(unsafe { self.stream.alloc(n) }?)
    }

    pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(&self, n: usize) -> Result<DeviceBuffer<T>> {
        Ok(self.stream.alloc_zeros(n)?)
    }

    pub fn download<T: DeviceRepr + Default + Clone>(
        &self,
        dev: &DeviceBuffer<T>,
    ) -> Result<Vec<T>> {
        Ok(self.stream.clone_dtoh(dev)?)
    }

    pub fn synchronize(&self) -> Result<()> {
        Ok(self.stream.synchronize()?)
    }
}

/// Lets the device's default memory pool keep freed memory instead of returning it to the
/// driver at every synchronisation, so the per-op activation buffers of a forward pass are
/// recycled in about a microsecond rather than re-mapped. Best effort: without stream-ordered
/// allocation support nothing changes.
fn keep_pool_memory(ctx: &CudaContext) {
    use cudarc::driver::sys;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: the context is current (just created); both calls only touch the pool handle
    // and a u64 attribute of it.
    unsafe {
        if sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) == sys::CUresult::CUDA_SUCCESS
        {
            let mut threshold = u64::MAX;
            sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                &mut threshold as *mut u64 as *mut std::ffi::c_void,
            );
        }
    }
}
