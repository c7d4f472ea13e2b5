//! Every kernel file compiles with NVRTC for Ampere (sm_80), Hopper (sm_90) and Blackwell
//! (sm_120). Needs only libnvrtc, no GPU: CI loads the one from the `nvidia-cuda-nvrtc` wheel
//! (`scripts/nvrtc.sh`) and sets SYNAPTIX_REQUIRE_NVRTC=1 so that a missing library fails
//! instead of skipping.

use synaptix_kernels_cuda::{compile, probe, sources};

const ARCHS: &[&str] = &["sm_80", "sm_90", "sm_120"];

#[test]
fn every_kernel_compiles_for_every_target() {
    if !probe::nvrtc_present() {
        assert!(
            std::env::var_os("SYNAPTIX_REQUIRE_NVRTC").is_none(),
            "SYNAPTIX_REQUIRE_NVRTC is set but libnvrtc cannot be loaded (LD_LIBRARY_PATH?)"
        );
        eprintln!("SKIPPED: libnvrtc not found; kernels were not compiled (run scripts/nvrtc.sh)");
        return;
    }
    let version = probe::nvrtc_version().expect("nvrtc version");
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut failures = Vec::new();
    for arch in ARCHS {
        // Hopper-only files (wgmma) are compiled for sm_90a, on sm_90 cards only.
        let files: Vec<&sources::KernelFile> = sources::FILES
            .iter()
            .filter(|f| !f.hopper_only || *arch == "sm_90")
            .collect();
        for (file, r) in files
            .iter()
            .zip(compile::compile_many(&files, arch, false, threads))
        {
            match r {
                Ok(c) => {
                    assert!(c.cubin.len() > 100, "{}: tiny CUBIN for {arch}", file.name);
                    assert_eq!(
                        &c.cubin[..4],
                        b"\x7fELF",
                        "{}: CUBIN is an ELF image",
                        file.name
                    );
                }
                Err(e) => failures.push(e.to_string()),
            }
        }
    }
    eprintln!(
        "compiled {} kernel files for {ARCHS:?} with NVRTC {}.{}",
        sources::FILES.len(),
        version.0,
        version.1
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn a_broken_kernel_reports_nvrtc_log() {
    if !probe::nvrtc_present() {
        eprintln!("SKIPPED: libnvrtc not found");
        return;
    }
    let broken = sources::KernelFile {
        name: "broken",
        source: "#include \"common.cuh\"\nextern \"C\" __global__ void k(float* x) { x[0] = undefined_name; }",
        hopper_only: false,
    };
    let err = compile::compile(&broken, "sm_90", false)
        .err()
        .expect("must fail")
        .to_string();
    assert!(err.contains("undefined_name"), "{err}");
}

/// Hopper-only files (wgmma) compile for sm_90a on an sm_90 card and are refused elsewhere,
/// with an error naming the file, instead of failing inside NVRTC.
#[test]
fn hopper_only_files_target_sm_90a_only() {
    let file = sources::find("gemm_wg").expect("gemm_wg is embedded");
    assert!(file.hopper_only);
    assert_eq!(compile::target_arch(file, "sm_90").unwrap(), "sm_90a");
    for arch in ["sm_80", "sm_89", "sm_120"] {
        let err = compile::target_arch(file, arch).unwrap_err().to_string();
        assert!(
            err.contains("gemm_wg") && err.contains(arch),
            "{arch}: {err}"
        );
    }
    let plain = sources::find("gemm").expect("gemm is embedded");
    assert_eq!(compile::target_arch(plain, "sm_80").unwrap(), "sm_80");
}

/// NVRTC compiles several programs at once (the device's background preparation and the test
/// above rely on it): every file for sm_90, prepared by `KernelPrep`'s four background threads,
/// gives the bytes of the same file compiled alone, and asking for a file while a thread
/// compiles it waits for that compile.
#[test]
fn background_preparation_gives_the_lone_compiles_bytes() {
    if !probe::nvrtc_present() {
        eprintln!("SKIPPED: libnvrtc not found");
        return;
    }
    let prep = compile::KernelPrep::new("sm_90", false);
    prep.prefetch(4);
    for file in sources::FILES {
        let together = prep
            .get(file)
            .unwrap_or_else(|e| panic!("{}: {e}", file.name));
        let alone = compile::compile(file, "sm_90", false).unwrap();
        assert!(
            together.cubin == alone.cubin,
            "{}: CUBINs differ",
            file.name
        );
    }
}
