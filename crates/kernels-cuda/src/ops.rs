//! Typed launches of the kernels in `kernels/`, with shape checks before anything reaches the
//! GPU. Activations are `f32` buffers in row-major order; weights stay in their stored format.

use cudarc::driver::{LaunchConfig, PushKernelArg};
use synaptix_core::DType;

use crate::{CudaDevice, CudaError, DeviceBuffer, Result};

const THREADS: u32 = 256;

fn grid_for(n: usize) -> u32 {
    n.div_ceil(THREADS as usize) as u32
}

fn i32_arg(op: &'static str, what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| CudaError::Invalid {
        op,
        detail: format!("{what} = {v} exceeds the kernel's 32-bit index range"),
    })
}

fn check(op: &'static str, ok: bool, detail: impl FnOnce() -> String) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(CudaError::Invalid {
            op,
            detail: detail(),
        })
    }
}

/// The kernel-name suffix of a weight format, if the GPU executes it.
pub fn format_suffix(dtype: DType) -> Option<&'static str> {
    use DType::*;
    Some(match dtype {
        F32 => "f32",
        F16 => "f16",
        BF16 => "bf16",
        Q4_0 => "q4_0",
        Q4_1 => "q4_1",
        Q5_0 => "q5_0",
        Q5_1 => "q5_1",
        Q8_0 => "q8_0",
        Q2K => "q2_k",
        Q3K => "q3_k",
        Q4K => "q4_k",
        Q5K => "q5_k",
        Q6K => "q6_k",
        _ => return None,
    })
}

fn suffix(op: &'static str, dtype: DType) -> Result<&'static str> {
    format_suffix(dtype).ok_or_else(|| CudaError::Invalid {
        op,
        detail: format!("{dtype} weights are not supported on the GPU"),
    })
}

/// `out = a + b` (n elements).
pub fn add(
    dev: &CudaDevice,
    out: &mut DeviceBuffer<f32>,
    a: &DeviceBuffer<f32>,
    b: &DeviceBuffer<f32>,
) -> Result<()> {
    let n = out.len();
    check("add", a.len() == n && b.len() == n, || {
        format!("lengths {} {} {n}", a.len(), b.len())
    })?;
    let f = dev.function("elementwise", "add_f32")?;
    let n32 = i32_arg("add", "n", n)?;
    let mut l = dev.stream().launch_builder(&f);
    l.arg(out).arg(a).arg(b).arg(&n32);
    // SAFETY: the kernel reads and writes `n` elements of buffers that hold `n`.
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: (grid_for(n), 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        })
    }?;
    Ok(())
}

/// `x *= s`.
pub fn scale(dev: &CudaDevice, x: &mut DeviceBuffer<f32>, s: f32) -> Result<()> {
    let n = x.len();
    let f = dev.function("elementwise", "scale_f32")?;
    let n32 = i32_arg("scale", "n", n)?;
    let mut l = dev.stream().launch_builder(&f);
    l.arg(x).arg(&s).arg(&n32);
    // SAFETY: `n` elements of a buffer of `n`.
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: (grid_for(n), 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        })
    }?;
    Ok(())
}

/// `x: [rows, cols] += bias: [cols]`.
pub fn add_bias(
    dev: &CudaDevice,
    x: &mut DeviceBuffer<f32>,
    bias: &DeviceBuffer<f32>,
) -> Result<()> {
    let (n, cols) = (x.len(), bias.len());
    check("add_bias", cols > 0 && n.is_multiple_of(cols), || {
        format!("{n} values, bias of {cols}")
    })?;
    let f = dev.function("elementwise", "add_bias_f32")?;
    let (rows, c32) = (
        i32_arg("add_bias", "rows", n / cols)?,
        i32_arg("add_bias", "cols", cols)?,
    );
    let mut l = dev.stream().launch_builder(&f);
    l.arg(x).arg(bias).arg(&rows).arg(&c32);
    // SAFETY: `rows * cols` elements of `x`, `cols` of `bias`.
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: (grid_for(n), 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        })
    }?;
    Ok(())
}

/// `x = cap * tanh(x / cap)`.
pub fn softcap(dev: &CudaDevice, x: &mut DeviceBuffer<f32>, cap: f32) -> Result<()> {
    let n = x.len();
    let f = dev.function("elementwise", "softcap_f32")?;
    let n32 = i32_arg("softcap", "n", n)?;
    let mut l = dev.stream().launch_builder(&f);
    l.arg(x).arg(&cap).arg(&n32);
    // SAFETY: `n` elements of a buffer of `n`.
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: (grid_for(n), 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        })
    }?;
    Ok(())
}

/// Gated activations: `out = act(gate) * up`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Glu {
    Silu,
    GeluTanh,
}

/// `gelu_table`: for [`Glu::GeluTanh`], ggml's 65536 f16 GELU values indexed by the f16 bits
/// of the input (ignored for SiLU).
#[allow(clippy::too_many_arguments)]
pub fn glu(
    dev: &CudaDevice,
    kind: Glu,
    out: &mut DeviceBuffer<f32>,
    gate: &DeviceBuffer<f32>,
    up: &DeviceBuffer<f32>,
    cols: usize,
    gelu_table: Option<&DeviceBuffer<u16>>,
) -> Result<()> {
    let n = out.len();
    check(
        "glu",
        gate.len() == n && up.len() == n && cols > 0 && n.is_multiple_of(cols),
        || format!("lengths {} {} {n}, rows of {cols}", gate.len(), up.len()),
    )?;
    let name = match kind {
        Glu::Silu => "swiglu_f32",
        Glu::GeluTanh => "geglu_f32",
    };
    let f = dev.function("elementwise", name)?;
    let n32 = i32_arg("glu", "n", n)?;
    let c32 = i32_arg("glu", "cols", cols)?;
    let mut l = dev.stream().launch_builder(&f);
    l.arg(out).arg(gate).arg(up).arg(&n32);
    match kind {
        Glu::Silu => {
            l.arg(&c32);
        }
        Glu::GeluTanh => {
            let table = gelu_table.ok_or_else(|| CudaError::Invalid {
                op: "glu",
                detail: "GeGLU needs the GELU table".into(),
            })?;
            check("glu", table.len() == 1 << 16, || {
                format!("GELU table of {} entries", table.len())
            })?;
            l.arg(table);
        }
    }
    // SAFETY: `n` elements each.
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: (grid_for(n), 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        })
    }?;
    Ok(())
}

/// RMSNorm of every `w.len()`-long row of `x` into `out`.
pub fn rms_norm(
    dev: &CudaDevice,
    out: &mut DeviceBuffer<f32>,
    x: &DeviceBuffer<f32>,
    w: &DeviceBuffer<f32>,
    eps: f32,
) -> Result<()> {
    let cols = w.len();
    check(
        "rms_norm",
        cols > 0 && x.len().is_multiple_of(cols) && out.len() == x.len(),
        || format!("x {} out {} cols {cols}", x.len(), out.len()),
    )?;
    let rows = x.len() / cols;
    let f = dev.function("norm", "rms_norm_f32")?;
    let c32 = i32_arg("rms_norm", "cols", cols)?;
    let mut l = dev.stream().launch_builder(&f);
    l.arg(out).arg(x).arg(w).arg(&c32).arg(&eps);
    // SAFETY: one block per row of `cols`, inside both buffers.
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        })
    }?;
    Ok(())
}

/// RoPE layout (see `kernels/rope.cu`).
#[derive(Debug, Clone, Copy)]
pub struct RopeParams {
    pub n_heads: usize,
    pub head_dim: usize,
    pub n_rot: usize,
    pub neox: bool,
}

/// Rotates `x: [rows, n_heads * head_dim]` in place with `cos_sin: [rows, n_rot / 2, 2]`, the
/// (cos, sin) of every pair's angle at each row's position (computed on the host).
pub fn rope(
    dev: &CudaDevice,
    x: &mut DeviceBuffer<f32>,
    cos_sin: &DeviceBuffer<f32>,
    p: RopeParams,
) -> Result<()> {
    let half = p.n_rot / 2;
    let width = p.n_heads * p.head_dim;
    check(
        "rope",
        p.n_rot <= p.head_dim
            && p.n_rot.is_multiple_of(2)
            && half > 0
            && width > 0
            && x.len().is_multiple_of(width)
            && cos_sin.len() == x.len() / width * half * 2,
        || {
            format!(
                "x {} heads {} head_dim {} n_rot {} table {}",
                x.len(),
                p.n_heads,
                p.head_dim,
                p.n_rot,
                cos_sin.len()
            )
        },
    )?;
    let rows = x.len() / width;
    let f = dev.function("rope", "rope_f32")?;
    let (nh, hd, nr) = (p.n_heads as i32, p.head_dim as i32, p.n_rot as i32);
    let neox = p.neox as i32;
    let mut l = dev.stream().launch_builder(&f);
    l.arg(x).arg(cos_sin).arg(&nh).arg(&hd).arg(&nr).arg(&neox);
    // SAFETY: one thread per (head, pair) of each row, all inside `x` and the table.
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: (grid_for(p.n_heads * half), rows as u32, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        })
    }?;
    Ok(())
}

/// A weight matrix `[rows, cols]` on the GPU, in its stored format.
pub struct DeviceMatrix {
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    pub data: DeviceBuffer<u8>,
}

impl DeviceMatrix {
    pub fn upload(
        dev: &CudaDevice,
        dtype: DType,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<DeviceMatrix> {
        suffix("upload", dtype)?;
        let expected = (rows * cols / dtype.block_len()) * dtype.block_bytes();
        check(
            "upload",
            cols.is_multiple_of(dtype.block_len()) && bytes.len() == expected,
            || {
                format!(
                    "{dtype} [{rows}, {cols}] needs {expected} bytes, got {}",
                    bytes.len()
                )
            },
        )?;
        Ok(DeviceMatrix {
            dtype,
            rows,
            cols,
            data: dev.upload(bytes)?,
        })
    }
}

/// Rows `ids` of an embedding table, dequantized and scaled: `out: [ids, cols]`.
pub fn get_rows(
    dev: &CudaDevice,
    out: &mut DeviceBuffer<f32>,
    table: &DeviceMatrix,
    ids: &DeviceBuffer<i32>,
    scale: f32,
) -> Result<()> {
    check("get_rows", out.len() == ids.len() * table.cols, || {
        format!("out {} for {} ids of {}", out.len(), ids.len(), table.cols)
    })?;
    let f = dev.function(
        "embed",
        &format!("get_rows_{}", suffix("get_rows", table.dtype)?),
    )?;
    let c32 = i32_arg("get_rows", "cols", table.cols)?;
    let mut l = dev.stream().launch_builder(&f);
    l.arg(out).arg(&table.data).arg(ids).arg(&c32).arg(&scale);
    // SAFETY: one block per id; ids are checked against the vocabulary by the caller.
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: (ids.len() as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        })
    }?;
    Ok(())
}

/// The activation format ggml pairs with quantized weights of `dtype`: Q8_0 for Q4_0, Q5_0 and
/// Q8_0, Q8_1 for Q4_1 and Q5_1, Q8_K for the k-quants; `None` for float weights (F32, F16,
/// BF16), whose activations stay f32 (rounded to the weight type inside the kernel).
pub fn activation_format(dtype: DType) -> Option<DType> {
    use DType::*;
    match dtype {
        Q4_0 | Q5_0 | Q8_0 => Some(Q8_0),
        Q4_1 | Q5_1 => Some(Q8_1),
        Q2K | Q3K | Q4K | Q5K | Q6K => Some(Q8K),
        _ => None,
    }
}

/// Activation rows quantized on the GPU for one quantized weight format, exactly as the CPU
/// (ggml's reference quantizers) quantizes them: same quants, same scales, bit for bit.
///
/// One byte buffer (see `kernels/quantize.cu`): the `rows × cols` int8 quants, then per block
/// the scales (Q8_0 / Q8_1: half bits of `d` and `s` plus the block's Σq; Q8_K: f32 `d`), then
/// for Q8_K the i16 sums of 16 quants. Quantize once with [`quantize_acts`], then multiply by any
/// number of weight matrices of formats with the same [`activation_format`] with
/// [`matvec_quantized`] (Q, K and V, or gate and up, share one quantization).
pub struct DeviceActs {
    dtype: DType,
    rows: usize,
    cols: usize,
    /// Byte offsets of the per-block scales and of the Q8_K sums of 16.
    meta_offset: usize,
    bsums_offset: usize,
    buf: DeviceBuffer<u8>,
}

impl DeviceActs {
    /// Room for `rows` activation rows of `cols` values, quantized for `weight_dtype` weights.
    pub fn new(
        dev: &CudaDevice,
        weight_dtype: DType,
        rows: usize,
        cols: usize,
    ) -> Result<DeviceActs> {
        let dtype = activation_format(weight_dtype).ok_or_else(|| CudaError::Invalid {
            op: "quantize_acts",
            detail: format!("{weight_dtype} weights take f32 activations"),
        })?;
        check(
            "quantize_acts",
            cols.is_multiple_of(dtype.block_len()),
            || format!("rows of {cols} are not whole {dtype} blocks"),
        )?;
        let n = rows * cols;
        let meta_offset = n.next_multiple_of(16);
        let meta_bytes = n / dtype.block_len() * if dtype == DType::Q8K { 4 } else { 8 };
        let bsums_offset = (meta_offset + meta_bytes).next_multiple_of(16);
        let bytes = if dtype == DType::Q8K {
            bsums_offset + n / 16 * 2
        } else {
            bsums_offset
        };
        // SAFETY: quantize_acts writes every quant, scale and sum before a kernel reads them
        // (the alignment padding between the regions is never read).
        let buf = unsafe { dev.uninit::<u8>(bytes.max(1)) }?;
        Ok(DeviceActs {
            dtype,
            rows,
            cols,
            meta_offset,
            bsums_offset,
            buf,
        })
    }

    /// The activation format: Q8_0, Q8_1 or Q8_K.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    fn blocks(&self) -> usize {
        self.rows * self.cols / self.dtype.block_len()
    }

    /// The rows in ggml's block layout (`block_q8_0`, `block_q8_1` or `block_q8_K` structs,
    /// rows back to back), for comparisons with the CPU quantizer.
    pub fn to_ggml_bytes(&self, dev: &CudaDevice) -> Result<Vec<u8>> {
        let raw = dev.download(&self.buf)?;
        let (n, bl) = (self.rows * self.cols, self.dtype.block_len());
        let qs = &raw[..n];
        let meta = &raw[self.meta_offset..];
        let mut out = Vec::with_capacity(self.blocks() * self.dtype.block_bytes());
        for (b, q) in qs.chunks_exact(bl).enumerate() {
            match self.dtype {
                DType::Q8K => {
                    out.extend_from_slice(&meta[4 * b..4 * b + 4]);
                    out.extend_from_slice(q);
                    let bs = self.bsums_offset + b * 32;
                    out.extend_from_slice(&raw[bs..bs + 32]);
                }
                _ => {
                    let m = &meta[8 * b..8 * b + 8];
                    out.extend_from_slice(&m[0..2]); // d
                    if self.dtype == DType::Q8_1 {
                        out.extend_from_slice(&m[2..4]); // s
                    }
                    out.extend_from_slice(q);
                }
            }
        }
        Ok(out)
    }
}

/// Quantizes `x: [acts.rows(), acts.cols()]` into `acts` on the GPU (ggml's reference
/// quantizers, bit for bit).
pub fn quantize_acts(dev: &CudaDevice, acts: &mut DeviceActs, x: &DeviceBuffer<f32>) -> Result<()> {
    check("quantize_acts", x.len() == acts.rows * acts.cols, || {
        format!(
            "x has {} values for [{}, {}]",
            x.len(),
            acts.rows,
            acts.cols
        )
    })?;
    let n_blocks = acts.blocks();
    if n_blocks == 0 {
        return Ok(());
    }
    let name = match acts.dtype {
        DType::Q8_0 => "quantize_q8_0",
        DType::Q8_1 => "quantize_q8_1",
        _ => "quantize_q8_k",
    };
    let f = dev.function("quantize", name)?;
    let nb = i32_arg("quantize_acts", "blocks", n_blocks)?;
    let (meta, bsums) = (acts.meta_offset as i64, acts.bsums_offset as i64);
    let mut l = dev.stream().launch_builder(&f);
    l.arg(x).arg(&mut acts.buf).arg(&meta);
    if acts.dtype == DType::Q8K {
        l.arg(&bsums);
    }
    l.arg(&nb);
    // SAFETY: one warp per block of 32 (or 256) values of `x`, writing that block's quants and
    // scales inside the buffer sized for them by `DeviceActs::new`.
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: (n_blocks.div_ceil(8) as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        })
    }?;
    Ok(())
}

/// Warps per thread block of the matvec kernels, and activation rows per pass (kernels/matvec.cu).
const MV_WARPS: usize = 8;
const MV_COLS: usize = 8;
/// Elements of a weight row per warp chunk of `matvec_q8_*` (`SUBS × 1024` in kernels/matvec.cu;
/// only the choice of warps per row depends on it).
fn mv_step(dtype: DType) -> usize {
    use DType::*;
    1024 * match dtype {
        Q8_0 | Q3K | Q4K | Q5K | Q6K => 1,
        Q2K => 4,
        _ => 2,
    }
}

/// Whether `matvec_q8_*` transposes a block step's activations into shared memory for `dtype`
/// (the lane-major k-quants), which bounds warps per row × activation rows per pass by MV_COLS.
fn mv_lane_major(dtype: DType) -> bool {
    use DType::*;
    matches!(dtype, Q3K | Q4K | Q5K | Q6K)
}

/// Streaming multiprocessors of `dev` (cached per ordinal).
fn sm_count(dev: &CudaDevice) -> usize {
    use std::sync::atomic::{AtomicU32, Ordering};
    static COUNTS: [AtomicU32; 16] = [const { AtomicU32::new(0) }; 16];
    let slot = COUNTS.get(dev.info.ordinal);
    if let Some(n) = slot.map(|s| s.load(Ordering::Relaxed)).filter(|&n| n > 0) {
        return n as usize;
    }
    let n = dev
        .context()
        .attribute(
            cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )
        .map_or(100, |n| n.max(1) as u32);
    if let Some(s) = slot {
        s.store(n, Ordering::Relaxed);
    }
    n as usize
}

/// How many warps share one weight row: more when there are too few rows (× passes over the
/// activation rows) to give every SM 32 warps, at most one per warp chunk of the row, and 1, 2,
/// 4 or 8 (for the lane-major k-quants, at most MV_COLS / activation rows per pass). The warps of
/// a row compute their chunks' terms in parallel; the block adds them in order, so the result
/// does not depend on this choice.
fn warps_per_row(dev: &CudaDevice, w: &DeviceMatrix, m: usize) -> usize {
    let target = sm_count(dev) * 32;
    let passes = m.div_ceil(MV_COLS);
    let steps = w.cols.div_ceil(mv_step(w.dtype));
    let cap = if mv_lane_major(w.dtype) {
        MV_COLS / m.min(MV_COLS)
    } else {
        MV_WARPS
    };
    let mut wpr = 1;
    while wpr * 2 <= cap && w.rows * passes * wpr < target && wpr * 2 <= steps {
        wpr *= 2;
    }
    wpr
}

fn check_matvec(w: &DeviceMatrix, y_len: usize, m: usize) -> Result<()> {
    check("matvec", y_len == m * w.rows, || {
        format!(
            "y has {y_len} values for {m} rows of [{}, {}]",
            w.rows, w.cols
        )
    })
}

/// `y: [m, rows] = acts · Wᵀ` with activations already quantized for W's format: exact
/// integer block sums, ggml's per-block float formulas and its order of f32 additions, so every
/// output is bit for bit the CPU's (`synaptix_kernels_cpu::matmul`).
pub fn matvec_quantized(
    dev: &CudaDevice,
    y: &mut DeviceBuffer<f32>,
    w: &DeviceMatrix,
    acts: &DeviceActs,
) -> Result<()> {
    check(
        "matvec",
        activation_format(w.dtype) == Some(acts.dtype) && acts.cols == w.cols,
        || {
            format!(
                "{} [{}, {}] weights, activations {} × {}",
                w.dtype, w.rows, w.cols, acts.dtype, acts.cols
            )
        },
    )?;
    let m = acts.rows;
    check_matvec(w, y.len(), m)?;
    if m == 0 || w.rows == 0 {
        return Ok(());
    }
    let f = dev.function(
        "matvec",
        &format!("matvec_q8_{}", suffix("matvec", w.dtype)?),
    )?;
    let (r32, c32, m32) = (
        i32_arg("matvec", "rows", w.rows)?,
        i32_arg("matvec", "cols", w.cols)?,
        i32_arg("matvec", "m", m)?,
    );
    let passes = m.div_ceil(MV_COLS);
    check("matvec", passes <= 65535, || {
        format!("{m} activation rows exceed the grid")
    })?;
    let wpr = warps_per_row(dev, w, m);
    let wpr32 = wpr as i32;
    let (meta, bsums) = (acts.meta_offset as i64, acts.bsums_offset as i64);
    let mut l = dev.stream().launch_builder(&f);
    l.arg(y)
        .arg(&w.data)
        .arg(&acts.buf)
        .arg(&meta)
        .arg(&bsums)
        .arg(&r32)
        .arg(&c32)
        .arg(&m32)
        .arg(&wpr32);
    // SAFETY: the shapes were checked: `wpr` warps per weight row (8 / wpr rows per block; for
    // the lane-major k-quants wpr × min(m, MV_COLS) <= MV_COLS, the size of their shared
    // activation buffer), up to MV_COLS activation rows per block row, reads inside the weight
    // and activation buffers, writes of y[i][row] for i < m and row < rows only.
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: (w.rows.div_ceil(MV_WARPS / wpr) as u32, passes as u32, 1),
            block_dim: ((MV_WARPS * 32) as u32, 1, 1),
            shared_mem_bytes: 0,
        })
    }?;
    Ok(())
}

/// `y: [m, rows] = x: [m, cols] · Wᵀ` with ggml's CPU arithmetic, bit for bit the CPU's
/// `matmul`: for quantized W, the rows of x are quantized once to W's [`activation_format`] (as
/// the CPU does) into a scratch buffer and multiplied with exact integer block sums
/// ([`matvec_quantized`]); F16 and BF16 weights see x rounded to their type, and the products
/// are summed in f64 in element order.
pub fn matvec(
    dev: &CudaDevice,
    y: &mut DeviceBuffer<f32>,
    w: &DeviceMatrix,
    x: &DeviceBuffer<f32>,
) -> Result<()> {
    check(
        "matvec",
        w.cols > 0 && x.len().is_multiple_of(w.cols),
        || format!("x {} for [{}, {}]", x.len(), w.rows, w.cols),
    )?;
    let m = x.len() / w.cols;
    if activation_format(w.dtype).is_none() {
        return matvec_float(dev, y, w, x);
    }
    check_matvec(w, y.len(), m)?;
    if m == 0 || w.rows == 0 {
        return Ok(());
    }
    let mut acts = DeviceActs::new(dev, w.dtype, m, w.cols)?;
    quantize_acts(dev, &mut acts, x)?;
    matvec_quantized(dev, y, w, &acts)
}

/// Float weights (F32, F16, BF16): x rounded to the weight type, f32 products, one f64 sum per
/// output in element order (evaluated speculatively by a warp, see kernels/matvec.cu).
fn matvec_float(
    dev: &CudaDevice,
    y: &mut DeviceBuffer<f32>,
    w: &DeviceMatrix,
    x: &DeviceBuffer<f32>,
) -> Result<()> {
    let m = x.len() / w.cols;
    check_matvec(w, y.len(), m)?;
    if m == 0 || w.rows == 0 {
        return Ok(());
    }
    let f = dev.function(
        "matvec",
        &format!("matvec_float_{}", suffix("matvec", w.dtype)?),
    )?;
    let (r32, c32, m32) = (
        i32_arg("matvec", "rows", w.rows)?,
        i32_arg("matvec", "cols", w.cols)?,
        i32_arg("matvec", "m", m)?,
    );
    // One warp per output: `cc` activation rows (a power of two <= MV_COLS) of MV_WARPS / cc
    // weight rows per block.
    let cc = m.min(MV_COLS).next_power_of_two();
    check("matvec", m.div_ceil(cc) <= 65535, || {
        format!("{m} activation rows exceed the grid")
    })?;
    let cc32 = cc as i32;
    let mut l = dev.stream().launch_builder(&f);
    l.arg(y)
        .arg(&w.data)
        .arg(x)
        .arg(&r32)
        .arg(&c32)
        .arg(&m32)
        .arg(&cc32);
    // SAFETY: one warp per (weight row, activation row) pair, warps past `rows` or `m` return at
    // once; reads and writes stay inside the checked shapes.
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: (
                w.rows.div_ceil(MV_WARPS / cc) as u32,
                m.div_ceil(cc) as u32,
                1,
            ),
            block_dim: ((MV_WARPS * 32) as u32, 1, 1),
            shared_mem_bytes: 0,
        })
    }?;
    Ok(())
}

/// `y = x · Wᵀ` from W dequantized to f32 and x as is (the first GPU kernels, `matvec_{fmt}`):
/// no activation quantization, so it differs from the CPU reference by that quantization's
/// noise. Kept for comparisons and tests.
pub fn matvec_dequant(
    dev: &CudaDevice,
    y: &mut DeviceBuffer<f32>,
    w: &DeviceMatrix,
    x: &DeviceBuffer<f32>,
) -> Result<()> {
    check(
        "matvec",
        w.cols > 0 && x.len().is_multiple_of(w.cols) && y.len() == x.len() / w.cols * w.rows,
        || format!("x {} y {} for [{}, {}]", x.len(), y.len(), w.rows, w.cols),
    )?;
    let m = x.len() / w.cols;
    if m == 0 || w.rows == 0 {
        return Ok(());
    }
    let f = dev.function("matvec", &format!("matvec_{}", suffix("matvec", w.dtype)?))?;
    let (r32, c32) = (
        i32_arg("matvec", "rows", w.rows)?,
        i32_arg("matvec", "cols", w.cols)?,
    );
    const WARPS: u32 = 8;
    let mut l = dev.stream().launch_builder(&f);
    l.arg(y).arg(&w.data).arg(x).arg(&r32).arg(&c32);
    // SAFETY: one warp per output row of each of the m activation rows.
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: ((w.rows as u32).div_ceil(WARPS), m as u32, 1),
            block_dim: (WARPS * 32, 1, 1),
            shared_mem_bytes: 0,
        })
    }?;
    Ok(())
}

/// Positions per KV page (`KV_PAGE` in `kernels/attention.cu`).
pub const KV_PAGE: usize = 16;

/// A layer's KV cache in f16, paged: position `t` lives in page `block_table[t / KV_PAGE]`, each
/// page `[n_kv_heads, KV_PAGE, head_dim]`. A single sequence owns its pages in order today; the
/// table is what lets batched sequences share a page pool later.
pub struct DeviceKv {
    pub k: DeviceBuffer<u16>,
    pub v: DeviceBuffer<u16>,
    pub block_table: DeviceBuffer<i32>,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub capacity: usize,
}

impl DeviceKv {
    /// A cache for `capacity` positions whose pages are in order.
    pub fn new(
        dev: &CudaDevice,
        n_kv_heads: usize,
        head_dim: usize,
        capacity: usize,
    ) -> Result<DeviceKv> {
        let pages = capacity.div_ceil(KV_PAGE);
        let table: Vec<usize> = (0..pages).collect();
        DeviceKv::with_pages(dev, n_kv_heads, head_dim, capacity, pages, &table)
    }

    /// A cache over a pool of `pool_pages` pages, position block `i` in page `table[i]`.
    pub fn with_pages(
        dev: &CudaDevice,
        n_kv_heads: usize,
        head_dim: usize,
        capacity: usize,
        pool_pages: usize,
        table: &[usize],
    ) -> Result<DeviceKv> {
        check(
            "kv cache",
            table.len() == capacity.div_ceil(KV_PAGE) && table.iter().all(|&p| p < pool_pages),
            || {
                format!(
                    "{} table entries for {capacity} positions over {pool_pages} pages",
                    table.len()
                )
            },
        )?;
        let table: Vec<i32> = table
            .iter()
            .map(|&p| i32_arg("kv cache", "page", p))
            .collect::<Result<_>>()?;
        let n = pool_pages * KV_PAGE * n_kv_heads * head_dim;
        Ok(DeviceKv {
            k: dev.zeros(n)?,
            v: dev.zeros(n)?,
            block_table: dev.upload(&table)?,
            n_kv_heads,
            head_dim,
            capacity,
        })
    }
}

/// Stores `k, v: [rows, n_kv_heads * head_dim]` at `positions` (each below the capacity).
pub fn kv_store(
    dev: &CudaDevice,
    kv: &mut DeviceKv,
    k: &DeviceBuffer<f32>,
    v: &DeviceBuffer<f32>,
    positions: &DeviceBuffer<i32>,
) -> Result<()> {
    let width = kv.n_kv_heads * kv.head_dim;
    let rows = positions.len();
    check(
        "kv_store",
        k.len() == rows * width && v.len() == rows * width,
        || format!("k {} v {} rows {rows} width {width}", k.len(), v.len()),
    )?;
    let f = dev.function("attention", "kv_store_f32")?;
    let (h, d) = (kv.n_kv_heads as i32, kv.head_dim as i32);
    let mut l = dev.stream().launch_builder(&f);
    l.arg(&mut kv.k)
        .arg(&mut kv.v)
        .arg(k)
        .arg(v)
        .arg(&kv.block_table)
        .arg(positions)
        .arg(&h)
        .arg(&d);
    // SAFETY: positions are below the capacity (the caller's KV bookkeeping guarantees it).
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: (grid_for(width), rows as u32, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        })
    }?;
    Ok(())
}

/// How [`attention`] attends.
#[derive(Debug, Clone, Copy)]
pub struct AttentionParams {
    pub n_heads: usize,
    /// Multiplies `q·k` before the softmax.
    pub scale: f32,
    /// Sliding window length (`None`: causal over the whole cache).
    pub window: Option<usize>,
    /// The largest position in `positions` (sizes the score buffer).
    pub max_pos: usize,
}

/// Attention of `q: [rows, n_heads * head_dim]` at `positions` over `kv` (already holding them).
pub fn attention(
    dev: &CudaDevice,
    out: &mut DeviceBuffer<f32>,
    q: &DeviceBuffer<f32>,
    kv: &DeviceKv,
    positions: &DeviceBuffer<i32>,
    p: AttentionParams,
) -> Result<()> {
    let AttentionParams {
        n_heads,
        scale,
        window,
        max_pos,
    } = p;
    let rows = positions.len();
    let width = n_heads * kv.head_dim;
    check(
        "attention",
        q.len() == rows * width
            && out.len() == q.len()
            && n_heads.is_multiple_of(kv.n_kv_heads)
            && max_pos < kv.capacity,
        || {
            format!(
                "q {} out {} rows {rows} heads {n_heads}/{} max_pos {max_pos}",
                q.len(),
                out.len(),
                kv.n_kv_heads
            )
        },
    )?;
    // Scores for positions 0..=max_pos rounded up to groups of four, then the f16-rounded query.
    let smem = (((max_pos + 1).next_multiple_of(4) + kv.head_dim) * 4) as u32;
    let f = dev.function("attention", "attention_f32")?;
    let limit = dev.max_shared_memory(&f)?;
    check("attention", smem as usize <= limit, || {
        format!(
            "{} positions exceed this kernel's shared-memory score buffer ({limit} bytes)",
            max_pos + 1
        )
    })?;
    let (nh, nkv, hd) = (n_heads as i32, kv.n_kv_heads as i32, kv.head_dim as i32);
    let win = window.map_or(0, |w| w as i32);
    let mut l = dev.stream().launch_builder(&f);
    l.arg(out)
        .arg(q)
        .arg(&kv.k)
        .arg(&kv.v)
        .arg(&kv.block_table)
        .arg(positions)
        .arg(&nh)
        .arg(&nkv)
        .arg(&hd)
        .arg(&scale)
        .arg(&win);
    // SAFETY: one block per (head, row); scores fit the dynamic shared memory sized above.
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: (n_heads as u32, rows as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: smem,
        })
    }?;
    Ok(())
}

/// Index of the largest value (lowest on ties), computed on the GPU.
pub fn argmax(dev: &CudaDevice, x: &DeviceBuffer<f32>, out: &mut DeviceBuffer<i32>) -> Result<()> {
    let f = dev.function("sample", "argmax_f32")?;
    let n32 = i32_arg("argmax", "n", x.len())?;
    let mut l = dev.stream().launch_builder(&f);
    l.arg(out).arg(x).arg(&n32);
    // SAFETY: one block of 1024 threads scans `n` elements; `out` holds one.
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1024, 1, 1),
            shared_mem_bytes: 0,
        })
    }?;
    Ok(())
}
