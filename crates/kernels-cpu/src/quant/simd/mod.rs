//! Run-time selected SIMD kernels. Each produces bit-identical results to the scalar kernel of
//! the same type (same integer sums, same float operations in the same order).

use synaptix_core::DType;

use super::{BlockFn, DotFn};
use crate::cpu::Path;

#[cfg(target_arch = "aarch64")]
pub(crate) mod neon;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

/// Float dot kernel: `w` holds `a.len()` elements of the weight float type.
///
/// # Safety
/// `w.len()` must be `a.len()` times the element size, and the CPU must support the path the
/// kernel was taken for.
pub(crate) type FloatDotFn = unsafe fn(w: &[u8], a: &[f32]) -> f32;

/// The SIMD single-dot and block kernels for `dtype` on `path`, where that path has them.
/// `path` must be supported by the CPU (see `Path::best_supported`).
pub(crate) fn kernels(dtype: DType, path: Path) -> (Option<DotFn>, Option<BlockFn>) {
    #[cfg(target_arch = "x86_64")]
    {
        x86::kernels(dtype, path)
    }
    #[cfg(target_arch = "aarch64")]
    {
        neon::kernels(dtype, path)
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = (dtype, path);
        (None, None)
    }
}

/// The SIMD f32 × f32 dot for `path`, if any (used by `ops::dot`).
pub(crate) fn f32_dot(path: Path) -> Option<FloatDotFn> {
    #[cfg(target_arch = "x86_64")]
    {
        x86::f32_dot(path)
    }
    #[cfg(target_arch = "aarch64")]
    {
        neon::f32_dot(path)
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = path;
        None
    }
}
