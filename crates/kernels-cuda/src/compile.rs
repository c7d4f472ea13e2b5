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
