use anyhow::Result;
use clap::Args;

#[derive(Args)]
pub struct DevicesArgs {
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: DevicesArgs) -> Result<()> {
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
                }]
            })
        );
    } else {
        println!("cpu: {} ({cores} threads)", cpu_name());
        println!("  features:    {}", features.join(" "));
        println!("  kernel path: {}", synaptix_kernels_cpu::kernel_path());
        println!("  amx:         {}", amx_state(&f));
        println!("no GPU backend in this build (CUDA support is on the roadmap)");
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
