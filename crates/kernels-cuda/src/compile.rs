//! NVRTC compilation to CUBIN for one architecture, cached on disk.
//!
//! The cache key is a SHA-256 of the full source, the options, the architecture and NVRTC's
//! version, so a changed kernel, flag, card or toolkit never reuses a stale binary. The cache
//! lives in `$SYNAPTIX_KERNEL_CACHE`, else `${XDG_CACHE_HOME:-~/.cache}/synaptix/kernels`.

use std::ffi::CString;
use std::path::PathBuf;

use cudarc::nvrtc::{result, sys};
use sha2::{Digest, Sha256};

use crate::probe::{nvrtc_present, nvrtc_version};
use crate::sources::{full_source, KernelFile};
use crate::{CudaError, Result};

/// Options every kernel is compiled with (besides the architecture).
const BASE_OPTIONS: &[&str] = &["--std=c++17", "-default-device", "-lineinfo"];

/// Where compiled kernels are cached.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("SYNAPTIX_KERNEL_CACHE") {
        return PathBuf::from(dir);
    }
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"))
        .join("synaptix")
        .join("kernels")
}

/// A compiled kernel file and whether it came from the cache.
pub struct Compiled {
    pub cubin: Vec<u8>,
    pub from_cache: bool,
    pub seconds: f64,
}

fn options(arch: &str) -> Vec<String> {
    let mut o: Vec<String> = BASE_OPTIONS.iter().map(|s| s.to_string()).collect();
    o.push(format!("--gpu-architecture={arch}"));
    // Developer switch for A/B runs: `SYNAPTIX_KERNEL_DEFINES="A=1 B=0"` compiles every kernel
    // file with -DA=1 -DB=0 (part of the cache key like every option).
    if let Ok(defs) = std::env::var("SYNAPTIX_KERNEL_DEFINES") {
        for d in defs.split([' ', ',']).filter(|d| !d.is_empty()) {
            o.push(format!("-D{d}"));
        }
    }
    o
}

fn cache_key(source: &str, opts: &[String], arch: &str, nvrtc: (i32, i32)) -> String {
    let mut h = Sha256::new();
    h.update(source.as_bytes());
    for o in opts {
        h.update([0u8]);
        h.update(o.as_bytes());
    }
    h.update(format!("\0{arch}\0nvrtc {}.{}", nvrtc.0, nvrtc.1).as_bytes());
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// CUBIN for `file` on `arch` (`sm_90`), from the cache when possible.
pub fn compile(file: &KernelFile, arch: &str, use_cache: bool) -> Result<Compiled> {
    let start = std::time::Instant::now();
    if !nvrtc_present() {
        return Err(CudaError::Unavailable("libnvrtc cannot be loaded".into()));
    }
    let nvrtc = nvrtc_version().ok_or_else(|| CudaError::Nvrtc("nvrtcVersion failed".into()))?;
    let arch = &target_arch(file, arch)?;
    let source = full_source(file);
    let opts = options(arch);
    let path = cache_dir().join(format!(
        "{}-{}-{}.cubin",
        file.name,
        arch,
        &cache_key(&source, &opts, arch, nvrtc)[..32]
    ));
    if use_cache {
        if let Ok(cubin) = std::fs::read(&path) {
            return Ok(Compiled {
                cubin,
                from_cache: true,
                seconds: start.elapsed().as_secs_f64(),
            });
        }
    }
    let cubin = nvrtc_compile(file.name, &source, &opts, arch)?;
    if use_cache {
        // A cache that cannot be written only costs a recompilation next time.
        if std::fs::create_dir_all(cache_dir()).is_ok() {
            let tmp = path.with_extension(format!("tmp{}", std::process::id()));
            if std::fs::write(&tmp, &cubin).is_ok() {
                let _ = std::fs::rename(&tmp, &path);
            }
        }
    }
    Ok(Compiled {
        cubin,
        from_cache: false,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// The architecture `file` is compiled for on a card of `arch`: `arch` itself, or `sm_90a` for
/// a Hopper-only file on an `sm_90` card (an error elsewhere).
pub fn target_arch(file: &KernelFile, arch: &str) -> Result<String> {
    if !file.hopper_only {
        return Ok(arch.to_string());
    }
    if arch == "sm_90" || arch == "sm_90a" {
        Ok("sm_90a".to_string())
    } else {
        Err(CudaError::Nvrtc(format!(
            "{} holds Hopper-only kernels (sm_90a); this card is {arch}",
            file.name
        )))
    }
}

fn nvrtc_compile(name: &str, source: &str, opts: &[String], arch: &str) -> Result<Vec<u8>> {
    let nvrtc_err = |e: result::NvrtcError| CudaError::Nvrtc(format!("{e:?}"));
    let src =
        CString::new(source).map_err(|_| CudaError::Nvrtc("source contains a NUL byte".into()))?;
    let cname =
        CString::new(format!("{name}.cu")).map_err(|_| CudaError::Nvrtc("bad name".into()))?;
    let prog = result::create_program(&src, Some(&cname)).map_err(nvrtc_err)?;
    // SAFETY: `prog` is a live program; the options are valid C strings.
    let compiled = unsafe { result::compile_program(prog, opts) };
    let out = match compiled {
        Err(_) => {
            // SAFETY: the log of a live program.
            let log = unsafe { result::get_program_log(prog) }
                .map(|raw| {
                    let bytes: Vec<u8> = raw
                        .iter()
                        .take_while(|&&c| c != 0)
                        .map(|&c| c as u8)
                        .collect();
                    String::from_utf8_lossy(&bytes).into_owned()
                })
                .unwrap_or_default();
            Err(CudaError::Compile {
                kernel: name.to_string(),
                arch: arch.to_string(),
                log: log.trim().to_string(),
            })
        }
        Ok(()) => {
            let mut size = 0usize;
            // SAFETY: querying the CUBIN of a successfully compiled program.
            let r = unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) };
            if r != sys::nvrtcResult::NVRTC_SUCCESS || size == 0 {
                Err(CudaError::Nvrtc(format!("no CUBIN for {arch} ({r:?})")))
            } else {
                let mut cubin = vec![0u8; size];
                // SAFETY: the buffer holds `size` bytes as NVRTC asked.
                let r = unsafe { sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr() as *mut _) };
                if r == sys::nvrtcResult::NVRTC_SUCCESS {
                    Ok(cubin)
                } else {
                    Err(CudaError::Nvrtc(format!("nvrtcGetCUBIN failed ({r:?})")))
                }
            }
        }
    };
    // SAFETY: destroys the program created above exactly once.
    let _ = unsafe { result::destroy_program(prog) };
    out
}

/// Runs `work(i)` for every i in 0..n on up to `threads` threads at once.
fn on_threads(n: usize, threads: usize, work: impl Fn(usize) + Sync) {
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, n.max(1)) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= n {
                    break;
                }
                work(i);
            });
        }
    });
}

/// Compiles `files` for a card of `arch` on up to `threads` threads at once (NVRTC compiles
/// independent programs concurrently), each file once; the results in `files`' order.
pub fn compile_many(
    files: &[&KernelFile],
    arch: &str,
    use_cache: bool,
    threads: usize,
) -> Vec<Result<Compiled>> {
    let results: Vec<std::sync::OnceLock<Result<Compiled>>> =
        files.iter().map(|_| std::sync::OnceLock::new()).collect();
    on_threads(files.len(), threads, |i| {
        let _ = results[i].set(compile(files[i], arch, use_cache));
    });
    results
        .into_iter()
        .map(|r| {
            r.into_inner()
                .unwrap_or_else(|| Err(CudaError::Nvrtc("a compile thread failed".into())))
        })
        .collect()
}

/// Every kernel file's CUBIN for one card, each compiled (or read from the cache) once: on
/// first use, or ahead of it by [`KernelPrep::prefetch`]'s background threads, so that a cold
/// start compiles the files side by side while the model loads. A file asked for while a
/// background thread compiles it waits for that compile.
pub struct KernelPrep {
    arch: String,
    use_cache: bool,
    cells: Vec<std::sync::OnceLock<Result<Compiled>>>,
}

impl KernelPrep {
    /// A preparation for cards of `arch`, reading and writing the disk cache when `use_cache`.
    pub fn new(arch: &str, use_cache: bool) -> std::sync::Arc<KernelPrep> {
        std::sync::Arc::new(KernelPrep {
            arch: arch.to_string(),
            use_cache,
            cells: crate::sources::FILES
                .iter()
                .map(|_| std::sync::OnceLock::new())
                .collect(),
        })
    }

    /// The process's one preparation for `arch`, shared by every device of that architecture;
    /// `started` tells whether this call created it.
    pub fn for_arch(arch: &str) -> (std::sync::Arc<KernelPrep>, bool) {
        use std::collections::HashMap;
        use std::sync::{Arc, Mutex, OnceLock};
        static PREPS: OnceLock<Mutex<HashMap<String, Arc<KernelPrep>>>> = OnceLock::new();
        let table = PREPS.get_or_init(|| Mutex::new(HashMap::new()));
        let Ok(mut table) = table.lock() else {
            return (KernelPrep::new(arch, true), true);
        };
        match table.get(arch) {
            Some(p) => (p.clone(), false),
            None => {
                let p = KernelPrep::new(arch, true);
                table.insert(arch.to_string(), p.clone());
                (p, true)
            }
        }
    }

    /// `file`'s CUBIN (compiled here, or by a background thread).
    pub fn get(&self, file: &KernelFile) -> Result<&Compiled> {
        let i = crate::sources::FILES
            .iter()
            .position(|f| f.name == file.name)
            .ok_or_else(|| CudaError::UnknownKernel(file.name.to_string()))?;
        match self.cells[i].get_or_init(|| compile(file, &self.arch, self.use_cache)) {
            Ok(c) => Ok(c),
            Err(e) => Err(duplicate(e)),
        }
    }

    /// Starts compiling every kernel file this card runs on a background thread pool of up to
    /// `threads` threads (the files already in the cache are only read).
    pub fn prefetch(self: &std::sync::Arc<Self>, threads: usize) {
        let prep = self.clone();
        let spawned = std::thread::Builder::new()
            .name("synaptix-nvrtc".into())
            .spawn(move || {
                let files: Vec<&KernelFile> = crate::sources::FILES
                    .iter()
                    .filter(|f| target_arch(f, &prep.arch).is_ok())
                    .collect();
                // Errors stay in the cells for the first use to report.
                on_threads(files.len(), threads, |i| {
                    let _ = prep.get(files[i]);
                });
            });
        // Without the thread, each file compiles on first use as before.
        drop(spawned);
    }
}

/// A copy of a compile error for a second caller (CudaError holds driver errors that are not
/// Clone; compiles never produce those).
fn duplicate(e: &CudaError) -> CudaError {
    match e {
        CudaError::Unavailable(s) => CudaError::Unavailable(s.clone()),
        CudaError::Compile { kernel, arch, log } => CudaError::Compile {
            kernel: kernel.clone(),
            arch: arch.clone(),
            log: log.clone(),
        },
        CudaError::UnknownKernel(s) => CudaError::UnknownKernel(s.clone()),
        other => CudaError::Nvrtc(other.to_string()),
    }
}
