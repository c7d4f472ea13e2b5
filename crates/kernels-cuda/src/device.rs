use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits,
};
use cudarc::nvrtc::Ptx;

use crate::compile::KernelPrep;
use crate::probe::{cuda_status, CudaStatus, GpuInfo};
use crate::sources::find;
use crate::{CudaError, Result};

/// The oldest GPU generation the kernels are written for (Ampere).
pub const MIN_COMPUTE_CAPABILITY: (i32, i32) = (8, 0);

/// Device memory holding `T`s.
pub type DeviceBuffer<T> = CudaSlice<T>;

/// One GPU: its context, the stream all work goes on, and kernel modules loaded on first use.
pub struct CudaDevice {
    pub info: GpuInfo,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
    /// The kernel files' CUBINs for this card (shared by the process's devices of one
    /// architecture; compiled ahead by background threads with `SYNAPTIX_KERNEL_PREFETCH=1`).
    prep: Arc<KernelPrep>,
    /// Seconds spent compiling or loading kernels (cold vs warm start reports).
    compile_seconds: Mutex<f64>,
    /// One zeroed u32 that multi-block reductions count finished blocks in (each launch leaves
    /// it at zero again).
    block_counter: std::sync::OnceLock<DeviceBuffer<u32>>,
    /// Whether this GPU and driver can take programmatic dependent launches (crate::launch).
    pdl_supported: bool,
    /// Whether launches use them now (`SYNAPTIX_NO_PDL` unset at creation, or `set_pdl`).
    pdl: AtomicBool,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaDevice({} {})", self.info.ordinal, self.info.name)
    }
}

impl CudaDevice {
    /// Opens GPU `ordinal`; a clear error when CUDA or that GPU is missing.
    pub fn new(ordinal: usize) -> Result<CudaDevice> {
        let (gpus, driver_version) = match cuda_status() {
            CudaStatus::Unavailable(why) => return Err(CudaError::Unavailable(why.clone())),
            CudaStatus::Available {
                gpus,
                driver_version,
                ..
            } => (gpus, *driver_version),
        };
        let info = gpus.get(ordinal).cloned().ok_or(CudaError::NoSuchDevice {
            ordinal,
            count: gpus.len(),
        })?;
        // cp.async, int8 mma.sync and the other sm_80 instructions the kernels use.
        if info.compute_capability < MIN_COMPUTE_CAPABILITY {
            return Err(CudaError::TooOld {
                name: info.name.clone(),
                major: info.compute_capability.0,
                minor: info.compute_capability.1,
            });
        }
        let ctx = CudaContext::new(ordinal)?;
        // SAFETY: every buffer of this device is created, used and freed on the one stream
        // below, in order, so cudarc's per-buffer events (meant for several streams) are not
        // needed; turning them off before any buffer exists keeps launches free of event
        // records, which stream capture could not take either.
        unsafe { ctx.disable_event_tracking() };
        // A stream of our own: the legacy default stream cannot be captured into a graph.
        let stream = ctx.new_stream()?;
        keep_pool_memory(&ctx);
        // Developer switch: the device printf buffer's size, for kernels compiled with the
        // KTRACE define (`SYNAPTIX_KERNEL_DEFINES=KTRACE`), whose timelines overflow the 1 MiB default.
        if let Some(bytes) = std::env::var("SYNAPTIX_PRINTF_FIFO")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
        {
            ctx.set_limit(
                cudarc::driver::sys::CUlimit::CU_LIMIT_PRINTF_FIFO_SIZE,
                bytes,
            )?;
        }
        let pdl_supported = crate::launch::pdl_supported(info.compute_capability, driver_version);
        let pdl = pdl_supported && !crate::launch::pdl_disabled_by_env();
        let (prep, created) = KernelPrep::for_arch(&info.arch());
        // Off by default until a cold start with it has been checked on a GPU machine's NVRTC
        // (CI checks concurrent compiles with the wheel's NVRTC 13.5).
        if created && std::env::var("SYNAPTIX_KERNEL_PREFETCH").as_deref() == Ok("1") {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            prep.prefetch(cores);
        }
        Ok(CudaDevice {
            info,
            ctx,
            stream,
            modules: Mutex::new(HashMap::new()),
            prep,
            compile_seconds: Mutex::new(0.0),
            block_counter: std::sync::OnceLock::new(),
            pdl_supported,
            pdl: AtomicBool::new(pdl),
        })
    }

    /// Whether kernels are launched with programmatic dependent launch (see `crate::launch`):
    /// compute capability 9.0 or later, a CUDA 12.3+ driver, and `SYNAPTIX_NO_PDL` unset when
    /// the device was opened (or [`CudaDevice::set_pdl`]).
    pub fn pdl_enabled(&self) -> bool {
        self.pdl.load(Ordering::Relaxed)
    }

    /// Turns programmatic dependent launch on or off for the launches that follow (on only
    /// where supported); returns whether it is on. Results are the same either way.
    pub fn set_pdl(&self, on: bool) -> bool {
        let on = on && self.pdl_supported;
        self.pdl.store(on, Ordering::Relaxed);
        on
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
                    let compiled = self.prep.get(kf)?;
                    let m = self
                        .ctx
                        .load_module(Ptx::from_binary(compiled.cubin.clone()))?;
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

    /// Free and total device memory in bytes, now.
    pub fn memory_info(&self) -> Result<(usize, usize)> {
        Ok(self.ctx.mem_get_info()?)
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

    /// The device's block counter (see the field), created zeroed on first use.
    pub fn block_counter(&self) -> Result<&DeviceBuffer<u32>> {
        if let Some(c) = self.block_counter.get() {
            return Ok(c);
        }
        let zeroed = self.zeros(1)?;
        Ok(self.block_counter.get_or_init(|| zeroed))
    }

    pub fn synchronize(&self) -> Result<()> {
        Ok(self.stream.synchronize()?)
    }

    /// Copies `src` into the start of `dst` in stream order, through a shared reference: the
    /// inputs of a recorded graph are fixed buffers that kernels of the graph also hold.
    pub fn overwrite<T: DeviceRepr>(&self, dst: &DeviceBuffer<T>, src: &[T]) -> Result<()> {
        use cudarc::driver::DevicePtr;
        if src.len() > dst.len() {
            return Err(CudaError::Invalid {
                op: "overwrite",
                detail: format!("{} values into a buffer of {}", src.len(), dst.len()),
            });
        }
        let (ptr, _sync) = dst.device_ptr(&self.stream);
        // SAFETY: `ptr` addresses at least `src.len()` elements of `T` (checked above); the copy
        // is ordered on the device's only stream after every earlier use of `dst`, and the
        // driver stages pageable `src` before returning.
        unsafe { cudarc::driver::result::memcpy_htod_async(ptr, src, self.stream.cu_stream()) }?;
        Ok(())
    }

    /// Starts recording the work issued on the device's stream (nothing runs until the
    /// recording is launched). Relaxed mode: kernels may still be loaded while recording.
    pub fn begin_capture(&self) -> Result<()> {
        use cudarc::driver::sys::CUstreamCaptureMode;
        Ok(self
            .stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)?)
    }

    /// Ends a recording started by [`CudaDevice::begin_capture`] and makes it launchable.
    pub fn end_capture(&self) -> Result<Option<StepGraph>> {
        let graph = self
            .stream
            .end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0))?;
        let Some(graph) = graph else {
            return Ok(None);
        };
        let mut step = StepGraph { graph };
        let skip = graph_skip();
        if !skip.is_empty() {
            let (left_out, kernels) = step.disable_kernels(skip)?;
            eprintln!(
                "SYNAPTIX_GRAPH_SKIP: {left_out} of the {kernels} kernel launches of a recorded \
                 step left out (diagnostic: outputs are wrong)"
            );
        }
        Ok(Some(step))
    }
}

impl CudaDevice {
    /// `slots` i32 values in page-locked host memory that copies from the device land in
    /// without stopping the stream (see [`Readback`]).
    pub fn readback(&self, slots: usize) -> Result<Readback> {
        let slots = slots.max(1);
        let bytes = slots * std::mem::size_of::<i32>();
        // SAFETY: plain page-locked memory (no flags), freed in Drop; zeroed before use.
        let ptr = unsafe { cudarc::driver::result::malloc_host(bytes, 0) }? as *mut i32;
        // SAFETY: `ptr` holds `slots` i32s, suitably aligned (page-locked allocations are).
        unsafe { std::ptr::write_bytes(ptr, 0, slots) };
        let events = (0..slots)
            .map(|_| self.ctx.new_event(None))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(Readback {
            ptr,
            events,
            stream: self.stream.clone(),
        })
    }
}

/// Page-locked host slots for single i32 results (a decode step's token id): a copy into a slot
/// is queued on the device's stream behind the work that produces the value, and the host waits
/// for that copy alone, not for whatever was queued after it.
pub struct Readback {
    ptr: *mut i32,
    /// `events[i]`: recorded after the last copy into slot `i`.
    events: Vec<cudarc::driver::CudaEvent>,
    stream: Arc<CudaStream>,
}

// SAFETY: the slots are only written by copies queued through `&self` methods and read after
// their event; the raw pointer is owned (freed once, in Drop).
unsafe impl Send for Readback {}
unsafe impl Sync for Readback {}

impl Readback {
    /// Queues, in stream order, a copy of `src[0]` into `slot`.
    pub fn enqueue(&self, slot: usize, src: &DeviceBuffer<i32>) -> Result<()> {
        use cudarc::driver::DevicePtr;
        let event = self.events.get(slot).ok_or_else(|| CudaError::Invalid {
            op: "readback",
            detail: format!("slot {slot} of {}", self.events.len()),
        })?;
        if src.is_empty() {
            return Err(CudaError::Invalid {
                op: "readback",
                detail: "empty source".into(),
            });
        }
        let (src_ptr, _sync) = src.device_ptr(&self.stream);
        // SAFETY: the slot is one i32 of our page-locked allocation; the caller waits for a
        // slot's previous copy (`wait`) before queueing another into it, and nothing else
        // writes there. The copy reads one i32 of `src` in stream order.
        unsafe {
            let dst = std::slice::from_raw_parts_mut(self.ptr.add(slot), 1);
            cudarc::driver::result::memcpy_dtoh_async(dst, src_ptr, self.stream.cu_stream())?;
        }
        event.record(&self.stream)?;
        Ok(())
    }

    /// Waits for the last copy queued into `slot` and returns its value.
    pub fn wait(&self, slot: usize) -> Result<i32> {
        let event = self.events.get(slot).ok_or_else(|| CudaError::Invalid {
            op: "readback",
            detail: format!("slot {slot} of {}", self.events.len()),
        })?;
        event.synchronize()?;
        // SAFETY: the copy into the slot has completed (its event has); volatile because the
        // device wrote it behind the compiler's back.
        Ok(unsafe { std::ptr::read_volatile(self.ptr.add(slot)) })
    }
}

impl Drop for Readback {
    fn drop(&mut self) {
        // Copies still queued write into the slots: let them land before the memory goes.
        for e in &self.events {
            let _ = e.synchronize();
        }
        // SAFETY: allocated by malloc_host in CudaDevice::readback, freed once.
        let _ = unsafe { cudarc::driver::result::free_host(self.ptr as _) };
    }
}

/// `SYNAPTIX_GRAPH_SKIP=name,...` (diagnostic): recorded decode steps leave out every kernel whose
/// name contains one of these, so that a benchmark measures what those kernels cost in place
/// (replayed, overlapped by programmatic dependent launch as they run). The outputs are wrong.
fn graph_skip() -> &'static [String] {
    static SKIP: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    SKIP.get_or_init(|| {
        std::env::var("SYNAPTIX_GRAPH_SKIP")
            .map(|v| {
                v.split(',')
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty())
                    .collect()
            })
            .unwrap_or_default()
    })
}

/// A recorded sequence of launches (a CUDA graph), replayed on the device's stream.
pub struct StepGraph {
    graph: cudarc::driver::CudaGraph,
}

// SAFETY: a CUDA graph may be used from any thread as long as calls on it are not concurrent;
// `launch` takes `&mut self`, so the borrow checker serialises them.
unsafe impl Send for StepGraph {}

impl StepGraph {
    /// Replays the recording on the stream it was captured from.
    pub fn launch(&mut self) -> Result<()> {
        Ok(self.graph.launch()?)
    }

    /// Disables, in the launchable graph, every kernel launch whose function name contains one
    /// of `names`. Returns how many it disabled and how many kernel launches the graph holds.
    fn disable_kernels(&mut self, names: &[String]) -> Result<(usize, usize)> {
        use cudarc::driver::sys;
        let failed = |r: sys::CUresult| CudaError::Driver(cudarc::driver::DriverError(r));
        let (graph, exec) = (self.graph.cu_graph(), self.graph.cu_graph_exec());
        let mut n = 0usize;
        // SAFETY: `graph` is this recording's graph; a null array asks for the count only.
        let r = unsafe { sys::cuGraphGetNodes(graph, std::ptr::null_mut(), &mut n) };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(failed(r));
        }
        let mut nodes: Vec<sys::CUgraphNode> = vec![std::ptr::null_mut(); n];
        // SAFETY: `nodes` holds `n` entries, as many as the graph has.
        let r = unsafe { sys::cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut n) };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(failed(r));
        }
        let (mut disabled, mut kernels) = (0, 0);
        for &node in nodes.iter().take(n) {
            let mut kind = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
            // SAFETY: `node` belongs to `graph`; the call writes one enum value.
            let r = unsafe { sys::cuGraphNodeGetType(node, &mut kind) };
            if r != sys::CUresult::CUDA_SUCCESS
                || kind != sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL
            {
                continue;
            }
            kernels += 1;
            // SAFETY: a kernel node's parameters, written into a zeroed plain-data struct.
            let mut params: sys::CUDA_KERNEL_NODE_PARAMS = unsafe { std::mem::zeroed() };
            let r = unsafe { sys::cuGraphKernelNodeGetParams_v2(node, &mut params) };
            if r != sys::CUresult::CUDA_SUCCESS || params.func.is_null() {
                continue;
            }
            let mut name: *const std::ffi::c_char = std::ptr::null();
            // SAFETY: `params.func` is the node's loaded function; the driver returns a pointer
            // to its NUL-terminated name, valid while the module is loaded.
            let r = unsafe { sys::cuFuncGetName(&mut name, params.func) };
            if r != sys::CUresult::CUDA_SUCCESS || name.is_null() {
                continue;
            }
            // SAFETY: checked non-null above; NUL-terminated by the driver.
            let name = unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy();
            if names.iter().any(|s| name.contains(s.as_str())) {
                // SAFETY: `exec` was instantiated from `graph`, which holds `node`.
                let r = unsafe { sys::cuGraphNodeSetEnabled(exec, node, 0) };
                if r != sys::CUresult::CUDA_SUCCESS {
                    return Err(failed(r));
                }
                disabled += 1;
            }
        }
        Ok((disabled, kernels))
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
