//! Tensor-core GEMM for k-quant weights (`kernels/gemm_k.cu`, sm_80+): `y: [m, rows] = x · Wᵀ`
//! for Q2_K, Q3_K, Q4_K, Q5_K and Q6_K weights times activations quantized to Q8_K by
//! [`ops::quantize_acts`](crate::ops::quantize_acts), for prefill (many activation rows).
//!
//! Bit for bit the CPU's `matmul` (ggml's `ggml_vec_dot_*_q8_K_generic`) and
//! [`ops::matvec_quantized`](crate::ops::matvec_quantized): the int8 tensor cores compute each
//! super-block's exact integer lane sums (scales folded into the weights, split into two bytes),
//! and one thread per output runs the CPU's f32 chains over the super-blocks in order.
//!
//! [`gemm_k_supported`] says which (format, m, k) it handles; `ops::matvec_quantized_with`
//! dispatches to it.

use cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg};
use synaptix_core::DType;

use crate::ops::{activation_format, check, i32_arg, suffix, DeviceActs, DeviceMatrix};
use crate::{CudaDevice, DeviceBuffer, Result};

/// The fewest activation rows for which [`gemm_k_supported`] recommends the GEMM (below it the
/// matvec kernels are the better choice). The kernel itself is correct for any m.
pub const GEMM_K_MIN_ROWS: usize = 16;

/// Weight rows, activation rows and threads of a thread block (`GK_BM`, `GK_BN`, `GK_NT`).
const BM: usize = 32;
const BN: usize = 64;
const THREADS: u32 = 256;
/// Transposed activation row in shared memory (`GK_BROW`).
const BROW: usize = 8 * 32 + 16;
/// Super-block length.
const QK_K: usize = 256;
/// Dynamic shared memory a block may use without opting in.
const DEFAULT_SHARED: usize = 48 * 1024;

fn is_k_quant(dtype: DType) -> bool {
    use DType::*;
    matches!(dtype, Q2K | Q3K | Q4K | Q5K | Q6K)
}

/// Shared-memory chunks of 32 bytes per unpacked weight row (`CHUNKS` of the format structs):
/// hi and lo of 8 lanes (+ the min chunk for Q4_K / Q5_K); Q2_K 8 lanes + mins.
fn chunks(dtype: DType) -> usize {
    match dtype {
        DType::Q4K | DType::Q5K => 17,
        DType::Q2K => 9,
        _ => 16,
    }
}

/// Bytes of dynamic shared memory of `gemm_k_*` with `nstage` ring slots (`gk_layout` in
/// kernels/gemm_k.cu): per slot the raw weights (per row the 16-byte words covering a
/// super-block from any 2-byte offset, + 16 bytes of slack), the activation quants (256 per row)
/// and their f32 d; then the unpacked weights, the transposed activations and the weights' f32
/// d and dmin.
fn shared_bytes(dtype: DType, nstage: usize) -> usize {
    let raw = (dtype.block_bytes() + 14).div_ceil(16) * 16;
    let slot = BM * raw + 16 + BN * 256 + BN * 4;
    let arow = chunks(dtype) * 32 + 16;
    nstage * slot + BM * arow + BN * BROW + 2 * BM * 4
}

/// Whether [`gemm_k_quantized`] handles `m` activation rows of `k` values with weights of
/// `dtype` and is worth it: k-quant weights, `k` a positive multiple of 256, `m >=`
/// [`GEMM_K_MIN_ROWS`]. Everything else stays with `ops::matvec`.
pub fn gemm_k_supported(dtype: DType, m: usize, k: usize) -> bool {
    is_k_quant(dtype)
        && k > 0
        && k.is_multiple_of(QK_K)
        && m >= GEMM_K_MIN_ROWS
        && m.div_ceil(BN) <= 65535
        && m.checked_mul(k).is_some_and(|n| n <= i32::MAX as usize)
}

/// Whether `SYNAPTIX_NO_GEMM` is set (the tensor-core GEMMs are then never used, for
/// comparisons; the same switch as `crate::gemm`'s dispatch).
pub(crate) fn gemm_disabled() -> bool {
    static DISABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *DISABLED.get_or_init(|| {
        std::env::var_os("SYNAPTIX_NO_GEMM").is_some()
            || std::env::var_os("SYNAPTIX_NO_GEMM_K").is_some()
    })
}

/// The kernel of the deepest ring (3 stages, else 2) whose shared memory this GPU allows per
/// block, and its shared-memory bytes (opted into above 48 KiB).
fn pick_kernel(dev: &CudaDevice, dtype: DType) -> Result<(CudaFunction, usize)> {
    let name = suffix("gemm_k", dtype)?;
    let mut last = 0;
    for (nstage, tag) in [(3, ""), (2, "_2s")] {
        let f = dev.function("gemm_k", &format!("gemm_k_{name}{tag}"))?;
        let bytes = shared_bytes(dtype, nstage);
        if bytes <= DEFAULT_SHARED {
            return Ok((f, bytes));
        }
        last = dev.max_shared_memory(&f)?;
        if bytes <= last {
            return Ok((f, bytes));
        }
    }
    Err(crate::CudaError::Invalid {
        op: "gemm_k",
        detail: format!(
            "the kernel needs {} bytes of shared memory, this GPU allows {last}",
            shared_bytes(dtype, 2)
        ),
    })
}

/// The weight bytes `w` must hold for its shape, if representable.
fn weight_bytes(w: &DeviceMatrix) -> Option<usize> {
    w.rows
        .checked_mul(w.cols / w.dtype.block_len())?
        .checked_mul(w.dtype.block_bytes())
}

/// `y: [m, rows] = acts · Wᵀ` on the tensor cores for Q2_K, Q3_K, Q4_K, Q5_K and Q6_K weights
/// and Q8_K activations from [`ops::quantize_acts`](crate::ops::quantize_acts) (m =
/// `acts.rows()`, `cols` a multiple of 256): every output bit for bit the CPU's `matmul`.
/// Correct for any m; meant for m >= [`GEMM_K_MIN_ROWS`] (see [`gemm_k_supported`]).
pub fn gemm_k_quantized(
    dev: &CudaDevice,
    y: &mut DeviceBuffer<f32>,
    w: &DeviceMatrix,
    acts: &DeviceActs,
) -> Result<()> {
    const OP: &str = "gemm_k";
    check(
        OP,
        is_k_quant(w.dtype)
            && activation_format(w.dtype) == Some(acts.dtype)
            && acts.cols == w.cols
            && w.cols > 0
            && w.cols.is_multiple_of(QK_K),
        || {
            format!(
                "{} [{}, {}] weights, activations {} × {} (the k-quant GEMM takes Q2_K .. Q6_K \
                 weights with Q8_K activations)",
                w.dtype, w.rows, w.cols, acts.dtype, acts.cols
            )
        },
    )?;
    check(
        OP,
        weight_bytes(w).is_some_and(|b| b <= w.data.len()),
        || {
            format!(
                "{} [{}, {}] weights in {} bytes",
                w.dtype,
                w.rows,
                w.cols,
                w.data.len()
            )
        },
    )?;
    let m = acts.rows;
    check(OP, m.checked_mul(w.rows) == Some(y.len()), || {
        format!(
            "y has {} values for {m} rows of [{}, {}]",
            y.len(),
            w.rows,
            w.cols
        )
    })?;
    if m == 0 || w.rows == 0 {
        return Ok(());
    }
    let (r32, k32, m32) = (
        i32_arg(OP, "rows", w.rows)?,
        i32_arg(OP, "cols", w.cols)?,
        i32_arg(OP, "m", m)?,
    );
    i32_arg(OP, "m × cols", m * w.cols)?;
    let (gx, gy) = (w.rows.div_ceil(BM), m.div_ceil(BN));
    check(OP, gy <= 65535 && gx <= i32::MAX as usize, || {
        format!(
            "{m} activation rows × {} weight rows exceed the grid",
            w.rows
        )
    })?;
    let (f, smem) = pick_kernel(dev, w.dtype)?;
    let meta = acts.meta_offset as i64;
    let mut l = dev.stream().launch_builder(&f);
    l.arg(y)
        .arg(&w.data)
        .arg(&acts.buf)
        .arg(&meta)
        .arg(&r32)
        .arg(&k32)
        .arg(&m32);
    // SAFETY: shapes checked above: W holds `rows` rows of `cols / 256` super-blocks (its byte
    // length matches), the activation buffer `m` rows of `cols` Q8_K quants with an f32 d per
    // super-block at `meta_offset` (DeviceActs::new sized it for Q8_K), m × cols fits the
    // kernel's 32-bit element indices. The kernel reads only inside those (weight copies are cut
    // at the buffer's end, rows past `rows` / `m` are not read) and writes y[i][r] for i < m,
    // r < rows only, y holding m × rows; the dynamic shared memory is the kernel's layout for
    // this format and ring depth (`shared_bytes`), opted into above 48 KiB by `pick_kernel`.
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: (gx as u32, gy as u32, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: smem as u32,
        })
    }?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn supported_shapes() {
        for dtype in [DType::Q2K, DType::Q3K, DType::Q4K, DType::Q5K, DType::Q6K] {
            assert!(gemm_k_supported(dtype, 16, 256));
            assert!(gemm_k_supported(dtype, 512, 3584));
            assert!(!gemm_k_supported(dtype, 15, 3584));
            assert!(!gemm_k_supported(dtype, 64, 0));
            assert!(!gemm_k_supported(dtype, 64, 384));
        }
        for dtype in [DType::F32, DType::F16, DType::Q4_0, DType::Q8_0] {
            assert!(!gemm_k_supported(dtype, 512, 4096));
        }
    }

    #[test]
    fn shared_memory_fits() {
        // 3 stages: two blocks per H100 / H200 SM (228 KiB); 2 stages: one block within the
        // 99 KiB per block of sm_120 / sm_86.
        for dtype in [DType::Q2K, DType::Q3K, DType::Q4K, DType::Q5K, DType::Q6K] {
            let (b3, b2) = (shared_bytes(dtype, 3), shared_bytes(dtype, 2));
            assert!(
                b3.is_multiple_of(16) && 2 * b3 <= 227 * 1024,
                "{dtype} {b3}"
            );
            assert!(b2 <= 99 * 1024, "{dtype} {b2}");
        }
        assert_eq!(shared_bytes(DType::Q6K, 3), 106_032);
    }
}
