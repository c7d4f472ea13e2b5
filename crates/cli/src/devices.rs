use anyhow::Result;
use clap::Args;

#[derive(Args)]
#[command(
    after_help = "Examples:\n  synaptix devices\n  synaptix devices --compile-kernels   # time the NVRTC compile (cold) or cache load (warm)"
)]
pub struct DevicesArgs {
    /// Print JSON
    #[arg(long)]
    pub json: bool,
    /// Compile (or load from the cache) every GPU kernel and report how long it took
    #[arg(long)]
    pub compile_kernels: bool,
}

pub fn run(a: DevicesArgs) -> Result<()> {
    let gpus = gpu_report(a.compile_kernels)?;
    let f = synaptix_kernels_cpu::cpu_features();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let features = feature_names(&f);
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "devices": [{
                    "kind": "cpu",
                    "name": cpu_name(),
                    "threads": cores,
                    "features": features,
                    "kernel_path": synaptix_kernels_cpu::kernel_path(),
                    "amx": amx_state(&f),
                }],
                "cuda": gpus,
            })
        );
    } else {
        println!("cpu: {} ({cores} threads)", cpu_name());
        println!("  features:    {}", features.join(" "));
        println!("  kernel path: {}", synaptix_kernels_cpu::kernel_path());
        println!("  amx:         {}", amx_state(&f));
        match &gpus["status"] {
            serde_json::Value::String(s) if s == "unavailable" => {
                println!(
                    "cuda: not available ({})",
                    gpus["reason"].as_str().unwrap_or("")
                );
            }
            _ => {
                println!(
                    "cuda: driver {}, nvrtc {}, kernel cache {}",
                    gpus["driver"].as_str().unwrap_or("?"),
                    gpus["nvrtc"].as_str().unwrap_or("?"),
                    gpus["kernel_cache"].as_str().unwrap_or("?")
                );
                for g in gpus["gpus"].as_array().into_iter().flatten() {
                    println!(
                        "gpu {}: {} (compute {}, {:.1} GiB, {:.1} GiB free), kernels built for {}{}",
                        g["ordinal"],
                        g["name"].as_str().unwrap_or("?"),
                        g["compute_capability"].as_str().unwrap_or("?"),
                        g["memory_bytes"].as_f64().unwrap_or(0.0) / 1073741824.0,
                        g["free_bytes"].as_f64().unwrap_or(0.0) / 1073741824.0,
                        g["arch"].as_str().unwrap_or("?"),
                        g["kernels_ready_s"]
                            .as_f64()
                            .map(|s| format!("; all kernels ready in {s:.3} s ({})", g["kernels_from"].as_str().unwrap_or("?")))
                            .unwrap_or_default()
                    );
                }
            }
        }
    }
    Ok(())
}

/// The CPU's marketing name, from /proc/cpuinfo where available.
pub fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

fn feature_names(f: &synaptix_kernels_cpu::CpuFeatures) -> Vec<&'static str> {
    [
        (f.avx2, "avx2"),
        (f.fma, "fma"),
        (f.f16c, "f16c"),
        (f.avx512f, "avx512f"),
        (f.avx512bw, "avx512bw"),
        (f.avx512vl, "avx512vl"),
        (f.avx512vnni, "avx512vnni"),
        (f.avx512bf16, "avx512bf16"),
        (f.neon, "neon"),
        (f.dotprod, "dotprod"),
    ]
    .into_iter()
    .filter_map(|(on, name)| on.then_some(name))
    .collect()
}

fn amx_state(f: &synaptix_kernels_cpu::CpuFeatures) -> &'static str {
    match (f.amx_advertised, f.amx_usable) {
        (false, _) => "not present",
        (true, false) => "advertised but not granted by the OS (not used)",
        (true, true) => "usable (not used by the kernels yet)",
    }
}

/// What the CUDA backend runs on a GPU of compute capability `cc`.
fn kernel_paths(cc: (i32, i32)) -> String {
    if cc < synaptix_kernels_cuda::MIN_COMPUTE_CAPABILITY {
        return "none: the kernels need compute capability 8.0 or newer".into();
    }
    let hopper = cc == (9, 0);
    format!(
        "decode: CUDA graphs per KV cache (one for each side of the one-pass attention limit); \
         matvec with 8-bit activations and exact-order block sums (dp4a), k-quants a whole \
         super-block per thread, F16/BF16 with f64 sums; attention over a paged f16 KV cache, \
         in one pass per head up to 256 positions (RoPE and the cache write inside it), \
         split-K beyond; penalties, top-k and argmax \
         on the device. prefill: {}; below 64 rows int8 tensor-core GEMM (mma.sync) for \
         quantized weights, k-quants with their scales folded in, and exact attention in one \
         pass per row and head; from 64 rows quantized weights dequantized to f16 and flash \
         attention on tensor cores{}",
        if hopper {
            "f16/bf16 GEMM on warpgroup tensor cores (wgmma, sm_90a)"
        } else {
            "f16/bf16 tensor-core GEMM (mma.sync)"
        },
        if cc.0 >= 9 {
            ". sm_90+: programmatic dependent launch; F16/BF16 decode rows of 2048+ values, \
             large Q8_0 matrices (from a split copy made at load) and the k-quant decode \
             kernel's weight rounds streamed into shared memory by bulk copies (TMA)"
        } else {
            ""
        }
    )
}

/// The CUDA side of `devices`, probed without touching cudarc when the libraries are absent.
fn gpu_report(compile: bool) -> Result<serde_json::Value> {
    use synaptix_kernels_cuda::{compile, cuda_status, sources, CudaStatus};
    Ok(match cuda_status() {
        CudaStatus::Unavailable(why) => serde_json::json!({"status": "unavailable", "reason": why}),
        CudaStatus::Available {
            driver_version,
            nvrtc_version,
            gpus,
        } => {
            let mut list = Vec::new();
            for g in gpus {
                let mut entry = serde_json::json!({
                    "ordinal": g.ordinal,
                    "name": g.name,
                    "compute_capability": format!("{}.{}", g.compute_capability.0, g.compute_capability.1),
                    "memory_bytes": g.total_memory,
                    "free_bytes": g.free_memory,
                    "arch": g.arch(),
                    "kernel_paths": kernel_paths(g.compute_capability),
                });
                if compile {
                    let start = std::time::Instant::now();
                    let (mut cached, mut files) = (0, 0);
                    // Hopper-only files (wgmma) exist for compute capability 9.0 alone.
                    let hopper = g.compute_capability == (9, 0);
                    for file in sources::FILES.iter().filter(|f| hopper || !f.hopper_only) {
                        files += 1;
                        if compile::compile(file, &g.arch(), true)?.from_cache {
                            cached += 1;
                        }
                    }
                    entry["kernels_ready_s"] = serde_json::json!(start.elapsed().as_secs_f64());
                    entry["kernels_from"] = serde_json::json!(if cached == files {
                        "disk cache"
                    } else {
                        "NVRTC"
                    });
                }
                list.push(entry);
            }
            serde_json::json!({
                "status": "available",
                "driver": format!("{}.{}", driver_version.0, driver_version.1),
                "nvrtc": format!("{}.{}", nvrtc_version.0, nvrtc_version.1),
                "kernel_cache": compile::cache_dir().display().to_string(),
                "gpus": list,
            })
        }
    })
}

#[cfg(test)]
mod tests {
    use super::kernel_paths;

    #[test]
    fn kernel_paths_name_the_gemm_each_card_runs() {
        let hopper = kernel_paths((9, 0));
        assert!(hopper.contains("wgmma") && hopper.contains("programmatic dependent launch"));
        assert!(hopper.contains("bulk copies") && hopper.contains("Q8_0"));
        let ampere = kernel_paths((8, 6));
        assert!(ampere.contains("mma.sync") && !ampere.contains("wgmma"));
        assert!(!ampere.contains("programmatic") && !ampere.contains("bulk copies"));
        let blackwell = kernel_paths((12, 0));
        assert!(blackwell.contains("mma.sync") && blackwell.contains("programmatic"));
        assert!(kernel_paths((7, 5)).starts_with("none"));
    }
}
