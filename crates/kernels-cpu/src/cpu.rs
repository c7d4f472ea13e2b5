//! CPU feature detection and the choice of kernel path.

use std::sync::OnceLock;

/// Instruction-set extensions of the running CPU that matter to the kernels.
///
/// Detection is at run time; the crate is never compiled for a specific CPU. AMX is reported
/// twice: advertised by CPUID, and usable (the OS granted the tile state). Some hosts advertise
/// AMX without granting it, and AMX instructions then fault; the kernels never use AMX.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuFeatures {
    pub avx2: bool,
    pub fma: bool,
    pub f16c: bool,
    pub avx512f: bool,
    pub avx512bw: bool,
    pub avx512vl: bool,
    pub avx512vnni: bool,
    pub avx512bf16: bool,
    pub neon: bool,
    /// The Armv8.2 dot-product instructions (`sdot`), used by the NEON kernels where present.
    pub dotprod: bool,
    /// CPUID says AMX-TILE is present.
    pub amx_advertised: bool,
    /// Linux granted this process the AMX tile state (`arch_prctl(ARCH_REQ_XCOMP_PERM)`).
    pub amx_usable: bool,
}

/// Features of the running CPU (detected once, then cached).
pub fn cpu_features() -> CpuFeatures {
    static FEATURES: OnceLock<CpuFeatures> = OnceLock::new();
    *FEATURES.get_or_init(detect)
}

#[cfg(target_arch = "x86_64")]
fn detect() -> CpuFeatures {
    CpuFeatures {
        avx2: is_x86_feature_detected!("avx2"),
        fma: is_x86_feature_detected!("fma"),
        f16c: is_x86_feature_detected!("f16c"),
        avx512f: is_x86_feature_detected!("avx512f"),
        avx512bw: is_x86_feature_detected!("avx512bw"),
        avx512vl: is_x86_feature_detected!("avx512vl"),
        avx512vnni: is_x86_feature_detected!("avx512vnni"),
        avx512bf16: is_x86_feature_detected!("avx512bf16"),
        neon: false,
        dotprod: false,
        amx_advertised: amx_advertised(),
        amx_usable: amx_advertised() && amx_permission_granted(),
    }
}

#[cfg(target_arch = "x86_64")]
fn amx_advertised() -> bool {
    const AMX_TILE_BIT: u32 = 24;
    // Leaf 7 exists only when the maximum basic leaf (leaf 0's eax) reaches it.
    let max_leaf = std::arch::x86_64::__cpuid(0).eax;
    max_leaf >= 7 && (std::arch::x86_64::__cpuid_count(7, 0).edx >> AMX_TILE_BIT) & 1 == 1
}

/// Asks Linux for the AMX tile-data state; without it the first tile instruction faults.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn amx_permission_granted() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with these arguments only changes this process's permission mask.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(all(target_arch = "x86_64", not(target_os = "linux")))]
fn amx_permission_granted() -> bool {
    false
}

#[cfg(target_arch = "aarch64")]
fn detect() -> CpuFeatures {
    CpuFeatures {
        neon: std::arch::is_aarch64_feature_detected!("neon"),
        dotprod: std::arch::is_aarch64_feature_detected!("dotprod"),
        ..CpuFeatures::default()
    }
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn detect() -> CpuFeatures {
    CpuFeatures::default()
}

/// Kernel families of this architecture, from most portable to most specialised. Each later
/// one of an architecture requires the features of the earlier ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Path {
    Scalar,
    /// AVX2 + FMA + F16C.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// Avx2 plus AVX-512 F/BW/VL/VNNI.
    #[cfg(target_arch = "x86_64")]
    Avx512,
    /// Advanced SIMD (NEON), with the dot-product instructions where the CPU has them (chosen
    /// inside the kernels: both forms give the same results).
    #[cfg(target_arch = "aarch64")]
    Neon,
}

impl Path {
    /// The paths of this architecture, most portable first.
    fn family() -> &'static [Path] {
        #[cfg(target_arch = "x86_64")]
        {
            &[Path::Scalar, Path::Avx2, Path::Avx512]
        }
        #[cfg(target_arch = "aarch64")]
        {
            &[Path::Scalar, Path::Neon]
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            &[Path::Scalar]
        }
    }

    /// Whether a CPU with features `f` can run this path.
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(unused_variables)
    )]
    fn runs_on(self, f: &CpuFeatures) -> bool {
        match self {
            Path::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Path::Avx2 => f.avx2 && f.fma && f.f16c,
            #[cfg(target_arch = "x86_64")]
            Path::Avx512 => {
                Path::Avx2.runs_on(f) && f.avx512f && f.avx512bw && f.avx512vl && f.avx512vnni
            }
            #[cfg(target_arch = "aarch64")]
            Path::Neon => f.neon,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Path::Scalar => "scalar",
            #[cfg(target_arch = "x86_64")]
            Path::Avx2 => "avx2",
            #[cfg(target_arch = "x86_64")]
            Path::Avx512 => "avx512-vnni",
            #[cfg(target_arch = "aarch64")]
            Path::Neon => "neon",
        }
    }

    /// The best path the CPU supports.
    pub(crate) fn best_supported() -> Path {
        Path::all_supported()
            .last()
            .copied()
            .unwrap_or(Path::Scalar)
    }

    /// The name `KERNEL_PATH_ENV` takes for this path.
    pub(crate) fn short_name(self) -> &'static str {
        match self {
            Path::Scalar => "scalar",
            #[cfg(target_arch = "x86_64")]
            Path::Avx2 => "avx2",
            #[cfg(target_arch = "x86_64")]
            Path::Avx512 => "avx512",
            #[cfg(target_arch = "aarch64")]
            Path::Neon => "neon",
        }
    }

    /// Every path usable on this CPU, most portable first (for tests comparing paths).
    pub(crate) fn all_supported() -> Vec<Path> {
        let f = cpu_features();
        Path::family()
            .iter()
            .copied()
            .take_while(|p| p.runs_on(&f))
            .collect()
    }
}

/// Environment variable that caps the kernel path (`scalar`, `avx2`, `avx512` on x86_64;
/// `scalar`, `neon` on aarch64), for comparing paths; it can only lower the choice, never enable
/// what the CPU lacks. Other values leave the choice alone.
pub const KERNEL_PATH_ENV: &str = "SYNAPTIX_CPU_KERNELS";

pub(crate) fn path() -> Path {
    static PATH: OnceLock<Path> = OnceLock::new();
    *PATH.get_or_init(|| {
        let best = Path::best_supported();
        let requested = std::env::var(KERNEL_PATH_ENV).ok();
        let cap = Path::family()
            .iter()
            .copied()
            .find(|p| Some(p.short_name()) == requested.as_deref());
        cap.map_or(best, |cap| best.min(cap))
    })
}

/// Name of the kernel path in use: `"scalar"`, `"avx2"`, `"avx512-vnni"` or `"neon"`.
pub fn kernel_path() -> &'static str {
    path().name()
}
