//! Kernels that do two ops in one launch where a decode step pays mostly for launches.

use cudarc::driver::LaunchConfig;
use synaptix_core::DType;

use crate::launch::Launch;
use crate::ops::{check, DeviceActs, Glu};
use crate::{CudaDevice, DeviceBuffer, Result};

/// Most threads per row of the fused RMSNorm (each keeps up to four float4 of the row; its
/// warps then quantize activation blocks): `ops::rms_norm`'s count is used.
const NORM_THREADS: usize = 256;
/// The longest row the fused RMSNorm takes: its shared copy of the normalised row
/// (RMS_QUANT_MAX_COLS in kernels/quantize.cu).
const NORM_MAX_COLS: usize = 16 * NORM_THREADS;

/// Whether [`rms_norm_quantized`] takes rows of `cols` values into `act` activations.
pub fn rms_norm_quantized_supported(cols: usize, act: DType) -> bool {
    let block = match act {
        DType::Q8_0 | DType::Q8_1 => 32,
        DType::Q8K => 256,
        _ => return false,
    };
    cols > 0 && cols.is_multiple_of(block) && cols <= NORM_MAX_COLS
}

/// `out = rms_norm(x) * w` (bit for bit `ops::rms_norm`) and, in the same launch, `acts` = out
/// quantized to its format (bit for bit `ops::quantize_acts`): the RMSNorm before a layer's
/// matvecs and their activation quantization as one kernel.
pub fn rms_norm_quantized(
    dev: &CudaDevice,
    out: &mut DeviceBuffer<f32>,
    acts: &mut DeviceActs,
    x: &DeviceBuffer<f32>,
    w: &DeviceBuffer<f32>,
    eps: f32,
) -> Result<()> {
    let cols = w.len();
    check(
        "rms_norm_quantized",
        rms_norm_quantized_supported(cols, acts.dtype)
            && acts.cols == cols
            && x.len() == acts.rows * cols
            && out.len() == x.len(),
        || {
            format!(
                "x {} out {} weight {cols} for {} activations [{}, {}]",
                x.len(),
                out.len(),
                acts.dtype,
                acts.rows,
                acts.cols
            )
        },
    )?;
    if acts.rows == 0 {
        return Ok(());
    }
    let name = match acts.dtype {
        DType::Q8_0 => "rms_norm_q8_0",
        DType::Q8_1 => "rms_norm_q8_1",
        _ => "rms_norm_q8_k",
    };
    let f = dev.function("quantize", name)?;
    let (meta, bsums) = (acts.meta_offset as i64, acts.bsums_offset as i64);
    let c32 = cols as i32;
    let mut l = Launch::new(dev, &f);
    l.arg(out)
        .arg(&mut acts.buf)
        .arg(meta)
        .arg(bsums)
        .arg(x)
        .arg(w)
        .arg(c32)
        .arg(eps);
    // SAFETY: one block of NORM_THREADS per row of `cols` (checked: a multiple of the block
    // length and of 4, at most four float4 per thread) inside x, out and w; each row's quants
    // and scales land in the slots DeviceActs::new sized for them.
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: (acts.rows as u32, 1, 1),
            block_dim: (crate::ops::norm_vec_threads(), 1, 1),
            shared_mem_bytes: 0,
        })
    }?;
    Ok(())
}

/// Whether [`glu_quantized`] takes rows of `cols` values into `act` activations.
pub fn glu_quantized_supported(cols: usize, act: DType) -> bool {
    let block = match act {
        DType::Q8_0 | DType::Q8_1 => 32,
        DType::Q8K => 256,
        _ => return false,
    };
    cols > 0 && cols.is_multiple_of(block)
}

/// `out = act(gate) * up` (bit for bit `ops::glu`) and, in the same launch, `acts` = out
/// quantized to its format (bit for bit `ops::quantize_acts`): an MLP's activation and the
/// quantization of the down projection's input as one kernel. `gelu_table` as for `ops::glu`.
#[allow(clippy::too_many_arguments)]
pub fn glu_quantized(
    dev: &CudaDevice,
    kind: Glu,
    out: &mut DeviceBuffer<f32>,
    acts: &mut DeviceActs,
    gate: &DeviceBuffer<f32>,
    up: &DeviceBuffer<f32>,
    gelu_table: Option<&DeviceBuffer<u16>>,
) -> Result<()> {
    let cols = acts.cols;
    let n = acts.rows * cols;
    check(
        "glu_quantized",
        glu_quantized_supported(cols, acts.dtype)
            && gate.len() == n
            && up.len() == n
            && out.len() == n,
        || {
            format!(
                "gate {} up {} out {} for {} activations [{}, {cols}]",
                gate.len(),
                up.len(),
                out.len(),
                acts.dtype,
                acts.rows
            )
        },
    )?;
    if acts.rows == 0 {
        return Ok(());
    }
    let act = match kind {
        Glu::Silu => "swiglu",
        Glu::GeluTanh => "geglu",
    };
    let format = match acts.dtype {
        DType::Q8_0 => "q8_0",
        DType::Q8_1 => "q8_1",
        _ => "q8_k",
    };
    let f = dev.function("quantize", &format!("{act}_{format}"))?;
    let table = match kind {
        Glu::Silu => None,
        Glu::GeluTanh => {
            let t = gelu_table.ok_or_else(|| crate::CudaError::Invalid {
                op: "glu_quantized",
                detail: "GeGLU needs the GELU table".into(),
            })?;
            check("glu_quantized", t.len() == 1 << 16, || {
                format!("GELU table of {} entries", t.len())
            })?;
            Some(t)
        }
    };
    let (meta, bsums) = (acts.meta_offset as i64, acts.bsums_offset as i64);
    let c32 = i32::try_from(cols).map_err(|_| crate::CudaError::Invalid {
        op: "glu_quantized",
        detail: format!("{cols} columns"),
    })?;
    let n_blocks = n / acts.dtype.block_len();
    let nb32 = i32::try_from(n_blocks).map_err(|_| crate::CudaError::Invalid {
        op: "glu_quantized",
        detail: format!("{n_blocks} blocks"),
    })?;
    let mut l = Launch::new(dev, &f);
    l.arg(out)
        .arg(&mut acts.buf)
        .arg(meta)
        .arg(bsums)
        .arg(gate)
        .arg(up)
        .arg(c32)
        .arg(nb32);
    // The table, or a null pointer (SiLU).
    l.arg(table);
    // Q8_0 / Q8_1: one warp per 32-value block, 8 per thread block; Q8_K: one thread block of
    // 256 threads per 256-value block.
    let grid = if acts.dtype == DType::Q8K {
        n_blocks
    } else {
        n_blocks.div_ceil(8)
    };
    // SAFETY: one warp (Q8_K: one thread block) per activation block (of `n_blocks`, whole rows:
    // checked) inside gate, up and out; the table (GeGLU) holds 65536 entries; each block's
    // quants and scales land in the slots DeviceActs::new sized for them.
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: (grid as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        })
    }?;
    Ok(())
}
