//! Typed launches of the kernels in `kernels/`, with shape checks before anything reaches the
//! GPU. Activations are `f32` buffers in row-major order; weights stay in their stored format.

use cudarc::driver::LaunchConfig;
use synaptix_core::DType;

use crate::launch::Launch;
use crate::{CudaDevice, CudaError, DeviceBuffer, Result};

const THREADS: u32 = 256;
/// Threads per row of `rms_norm_vec_f32`, as the fused RMSNorm + quantization uses (the f64
/// sum is grouped by the thread count, so both give the same values). 256 and 1024 measured
/// the same on Qwen2.5 0.5B decode (within ±10 t/s); 1024 lets the fused kernel's warps
/// quantize a 1024-value row in one round.
pub(crate) const fn norm_vec_threads() -> u32 {
    1024
}

fn grid_for(n: usize) -> u32 {
    n.div_ceil(THREADS as usize) as u32
}

/// A launch of one thread per element for `n` elements (THREADS a block), `rows` deep.
fn flat_config(n: usize, rows: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (grid_for(n), rows, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

pub(crate) fn i32_arg(op: &'static str, what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| CudaError::Invalid {
        op,
        detail: format!("{what} = {v} exceeds the kernel's 32-bit index range"),
    })
}

pub(crate) fn check(op: &'static str, ok: bool, detail: impl FnOnce() -> String) -> Result<()> {
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
        IQ4NL => "iq4_nl",
        IQ4XS => "iq4_xs",
        _ => return None,
    })
}

pub(crate) fn suffix(op: &'static str, dtype: DType) -> Result<&'static str> {
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
    let mut l = Launch::new(dev, &f);
    l.arg(out).arg(a).arg(b).arg(n32);
    // SAFETY: the kernel reads and writes `n` elements of buffers that hold `n`.
    unsafe { l.launch(flat_config(n, 1)) }?;
    Ok(())
}

/// `x *= s`.
pub fn scale(dev: &CudaDevice, x: &mut DeviceBuffer<f32>, s: f32) -> Result<()> {
    let n = x.len();
    let f = dev.function("elementwise", "scale_f32")?;
    let n32 = i32_arg("scale", "n", n)?;
    let mut l = Launch::new(dev, &f);
    l.arg(x).arg(s).arg(n32);
    // SAFETY: `n` elements of a buffer of `n`.
    unsafe { l.launch(flat_config(n, 1)) }?;
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
    let mut l = Launch::new(dev, &f);
    l.arg(x).arg(bias).arg(rows).arg(c32);
    // SAFETY: `rows * cols` elements of `x`, `cols` of `bias`.
    unsafe { l.launch(flat_config(n, 1)) }?;
    Ok(())
}

/// `x = cap * tanh(x / cap)`.
pub fn softcap(dev: &CudaDevice, x: &mut DeviceBuffer<f32>, cap: f32) -> Result<()> {
    let n = x.len();
    let f = dev.function("elementwise", "softcap_f32")?;
    let n32 = i32_arg("softcap", "n", n)?;
    let mut l = Launch::new(dev, &f);
    l.arg(x).arg(cap).arg(n32);
    // SAFETY: `n` elements of a buffer of `n`.
    unsafe { l.launch(flat_config(n, 1)) }?;
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
    let mut l = Launch::new(dev, &f);
    l.arg(out).arg(gate).arg(up).arg(n32);
    match kind {
        Glu::Silu => {
            l.arg(c32);
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
    // swiglu_f32 takes four elements per thread.
    let per_thread = if kind == Glu::Silu { 4 } else { 1 };
    // SAFETY: `n` elements each (16-byte accesses only where four lie inside; cudarc's
    // allocations are 256-byte aligned).
    unsafe { l.launch(flat_config(n.div_ceil(per_thread), 1)) }?;
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
    let c32 = i32_arg("rms_norm", "cols", cols)?;
    if cols.is_multiple_of(4) && cols <= 16 * 256 {
        // Rows held in registers, 16-byte loads.
        let f = dev.function("norm", "rms_norm_vec_f32")?;
        let mut l = Launch::new(dev, &f);
        l.arg(out).arg(x).arg(w).arg(c32).arg(eps);
        // SAFETY: one block per row of `cols` (a multiple of 4, at most 4 float4 per thread),
        // inside both buffers; cudarc allocations are 16-byte aligned and rows start at
        // multiples of 4 floats.
        unsafe {
            l.launch(LaunchConfig {
                grid_dim: (rows as u32, 1, 1),
                block_dim: (norm_vec_threads(), 1, 1),
                shared_mem_bytes: 0,
            })
        }?;
        return Ok(());
    }
    let f = dev.function("norm", "rms_norm_f32")?;
    let mut l = Launch::new(dev, &f);
    l.arg(out).arg(x).arg(w).arg(c32).arg(eps);
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
    let mut l = Launch::new(dev, &f);
    l.arg(x).arg(cos_sin).arg(nh).arg(hd).arg(nr).arg(neox);
    // SAFETY: one thread per (head, pair) of each row, all inside `x` and the table.
    unsafe { l.launch(flat_config(p.n_heads * half, rows as u32)) }?;
    Ok(())
}

/// [`rope`] of a layer's queries `q` (`q_params.n_heads` heads) and keys `k` (`n_kv_heads`) in
/// one launch, then `q *= q_scale` when given (which needs `n_rot == head_dim`).
pub fn rope_qk(
    dev: &CudaDevice,
    q: &mut DeviceBuffer<f32>,
    k: &mut DeviceBuffer<f32>,
    cos_sin: &DeviceBuffer<f32>,
    q_params: RopeParams,
    n_kv_heads: usize,
    q_scale: Option<f32>,
) -> Result<()> {
    let p = q_params;
    let half = p.n_rot / 2;
    let (qw, kw) = (p.n_heads * p.head_dim, n_kv_heads * p.head_dim);
    check(
        "rope_qk",
        p.n_rot <= p.head_dim
            && p.n_rot.is_multiple_of(2)
            && half > 0
            && qw > 0
            && kw > 0
            && q.len().is_multiple_of(qw)
            && k.len() == q.len() / qw * kw
            && cos_sin.len() == q.len() / qw * half * 2
            && (q_scale.is_none() || p.n_rot == p.head_dim),
        || {
            format!(
                "q {} k {} heads {}/{n_kv_heads} head_dim {} n_rot {} table {} scale {q_scale:?}",
                q.len(),
                k.len(),
                p.n_heads,
                p.head_dim,
                p.n_rot,
                cos_sin.len()
            )
        },
    )?;
    let rows = q.len() / qw;
    let f = dev.function("rope", "rope_qk_f32")?;
    let (nq, nk, hd, nr) = (
        p.n_heads as i32,
        n_kv_heads as i32,
        p.head_dim as i32,
        p.n_rot as i32,
    );
    let neox = p.neox as i32;
    let (scale, use_scale) = (q_scale.unwrap_or(1.0), q_scale.is_some() as i32);
    let mut l = Launch::new(dev, &f);
    l.arg(q)
        .arg(k)
        .arg(cos_sin)
        .arg(nq)
        .arg(nk)
        .arg(hd)
        .arg(nr)
        .arg(neox)
        .arg(scale)
        .arg(use_scale);
    // SAFETY: one thread per (head, pair) of the query then key heads of each row, inside `q`,
    // `k` and the table (checked above).
    unsafe { l.launch(flat_config((p.n_heads + n_kv_heads) * half, rows as u32)) }?;
    Ok(())
}

/// A weight matrix `[rows, cols]` on the GPU, in its stored format.
pub struct DeviceMatrix {
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    /// The weights as stored, then [`WEIGHT_PAD`] zero bytes.
    pub data: DeviceBuffer<u8>,
    /// Q8_0 on sm_90+: the same blocks in the split layout of `matvec_q8s_bulk` (quants in
    /// aligned 16-byte words, scales after each group of 16 blocks), which one activation row
    /// streams by bulk copies. None where that kernel does not apply or memory is short.
    pub split: Option<DeviceBuffer<u8>>,
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
        let repacked;
        let bytes = if dtype == DType::IQ4XS {
            repacked = iq4_xs_blocks_of_32(bytes);
            &repacked[..]
        } else {
            bytes
        };
        // Zeroed padding after the weights lets kernels read whole aligned words past the
        // last block.
        let data = dev.zeros::<u8>(bytes.len() + WEIGHT_PAD)?;
        dev.overwrite(&data, bytes)?;
        let split = if q8s_wanted(rows, cols) {
            q8_split(dev, dtype, rows, cols, &data)?
        } else {
            None
        };
        Ok(DeviceMatrix {
            dtype,
            rows,
            cols,
            data,
            split,
        })
    }

    /// Makes the split copy of a Q8_0 matrix whatever its shape (for tests and comparisons:
    /// [`DeviceMatrix::upload`] makes it only for the shapes where it pays). Returns whether
    /// the matrix has one: only Q8_0 on sm_90+, with the bulk kernels on and memory to spare.
    pub fn split_copy(&mut self, dev: &CudaDevice) -> Result<bool> {
        if self.split.is_none() {
            self.split = q8_split(dev, self.dtype, self.rows, self.cols, &self.data)?;
        }
        Ok(self.split.is_some())
    }
}

/// Bytes of one IQ4_XS block of 32 as the GPU holds it (`fmt_iq4_xs` in kernels/common.cuh).
const IQ4XS_GPU_BLOCK_BYTES: usize = 20;

/// IQ4_XS super-blocks (136 bytes: f16 d, u16 scales_h, scales_l[4], qs[128]) rewritten as
/// eight blocks of 32 each: d, the sub-block's scale l - 32 as i8, a zero, its 16 code bytes.
/// The GPU then runs IQ4_XS through the legacy-format kernels (one term a block of 32, as
/// ggml's dot product has), at 5 bits a weight instead of 4.25.
fn iq4_xs_blocks_of_32(bytes: &[u8]) -> Vec<u8> {
    const SUPER_BYTES: usize = 136;
    let mut out = Vec::with_capacity(bytes.len() / SUPER_BYTES * 8 * IQ4XS_GPU_BLOCK_BYTES);
    for sb in bytes.chunks_exact(SUPER_BYTES) {
        let scales_h = u16::from_le_bytes([sb[2], sb[3]]);
        for ib in 0..8 {
            let low = (sb[4 + ib / 2] >> (4 * (ib % 2))) & 0xf;
            let high = ((scales_h >> (2 * ib)) & 3) as u8;
            let l = (low | (high << 4)) as i8 - 32;
            out.extend_from_slice(&sb[..2]);
            out.push(l as u8);
            out.push(0);
            out.extend_from_slice(&sb[8 + 16 * ib..8 + 16 * ib + 16]);
        }
    }
    out
}

/// Blocks of 32 per group of the Q8_0 split layout, and a full group's bytes (kernels/matvec.cu).
const Q8S_GROUP_BLOCKS: usize = 16;
const Q8S_GROUP_BYTES: usize = 544;

/// Bytes of one row of `cols` Q8_0 values in the split layout (`q8s_row_bytes` in
/// kernels/matvec.cu): whole groups, then the last group's quants and its scales padded to 16.
fn q8s_row_bytes(cols: usize) -> usize {
    let nb = cols / 32;
    let r = nb % Q8S_GROUP_BLOCKS;
    nb / Q8S_GROUP_BLOCKS * Q8S_GROUP_BYTES
        + if r > 0 {
            32 * r + (2 * r).next_multiple_of(16)
        } else {
            0
        }
}

/// Whether an uploaded Q8_0 matrix of `rows × cols` gets a split copy (`SYNAPTIX_Q8_SPLIT`):
/// by default those of at least [`Q8S_MIN_VALUES`] values in rows of at least [`Q8S_MIN_COLS`],
/// narrow ones (keys and values beside such queries), tall ones
/// ([`Q8S_TALL_VALUES`]) and huge ones ([`Q8S_HUGE_VALUES`]: output heads); `N,C` those of at least N
/// values in rows of at least C instead; `0` none.
fn q8s_wanted(rows: usize, cols: usize) -> bool {
    enum Rule {
        Default,
        Bounds(usize, usize),
        Off,
    }
    static RULE: std::sync::OnceLock<Rule> = std::sync::OnceLock::new();
    let rule = RULE.get_or_init(
        || match std::env::var("SYNAPTIX_Q8_SPLIT").ok().as_deref() {
            Some("0") | Some("off") => Rule::Off,
            Some(v) => {
                let n: Vec<usize> = v.split(',').filter_map(|s| s.trim().parse().ok()).collect();
                match n[..] {
                    [values, cols] => Rule::Bounds(values, cols),
                    _ => Rule::Default,
                }
            }
            None => Rule::Default,
        },
    );
    match *rule {
        Rule::Off => false,
        Rule::Bounds(values, min_cols) => rows * cols >= values && cols >= min_cols,
        Rule::Default => {
            (cols >= Q8S_MIN_COLS && rows * cols >= Q8S_MIN_VALUES)
                || (cols >= Q8S_MIN_COLS && rows * cols >= Q8S_NARROW_VALUES && rows * 6 <= cols)
                || (rows * cols >= Q8S_TALL_VALUES && cols >= Q8S_TALL_COLS && rows >= 2 * cols)
                || (rows * cols >= Q8S_HUGE_VALUES && cols >= Q8S_HUGE_COLS)
        }
    }
}

/// The Q8_0 matrices that get a split copy: a warp needs many long rows. On the H200 (GB/s, one
/// row, stored-block kernels → `matvec_q8s_bulk`): 37888×3584 3,175 → 3,734, 152064×3584
/// 3,681 → 4,054, 3584×18944 2,463 → 3,240 and 1536×8960 1,535 → 1,738, but 3584×3584
/// 2,213 → 1,687, 17920×1536 2,575 → 2,001 and 151936×1536 3,438 → 2,654; 4608×3584 even
/// (1,777 → 1,801). 7B Q8_0 tg128 with Q/K/V and O split too: 297.6-300.8 against 304.3-304.6.
/// Since the ring of 32 warps (`q8s_shape`), also tall matrices of rows of 1536 or more: 1.5B's
/// gate/up (8960×1536) and head (151936×1536) took 1.5B Q8_0 tg128 742.4 / 742.6 → 769.9 /
/// 769.6 (every Q8_0 matrix split: 769.6 / 769.9; at 7B that also splits Q/K/V and O: 339.9 →
/// 332.9, and at 0.5B, rows of 896, 1,282.5 → 1,212.9). Since whole-row rings are kept to one
/// row a warp (`q8s_whole`), 12M values in rows of 3072 or more, and narrow matrices (at least
/// six times as long as tall, 1M values or more) in such rows: 7B's Q, O and (GQA) K and V too
/// (twenty-second pass: 7B Q8_0 349.2 → 354.7, 347.5 → 352.6, against the old rule 339.6 →
/// 352.8 / 354.4 in one call). Not 0.5B's down projection (896×4864: 1,400.7 → 1,385.4 split).
const Q8S_MIN_VALUES: usize = 12 << 20;
const Q8S_MIN_COLS: usize = 3072;
const Q8S_NARROW_VALUES: usize = 1 << 20;
const Q8S_TALL_VALUES: usize = 10 << 20;
const Q8S_TALL_COLS: usize = 1536;
/// Output heads of small models: 0.5B's 151936×896 (136M values) split, tg128 1,355.7 / 1,356.6
/// → 1,367.4 / 1,366.6 (and 1,358.3 → 1,367.4 in another machine session).
const Q8S_HUGE_VALUES: usize = 100 << 20;
const Q8S_HUGE_COLS: usize = 512;

/// The split copy of a Q8_0 matrix for `matvec_q8s_bulk` (see [`DeviceMatrix::split`]), made
/// on the GPU from the uploaded blocks, where the kernel applies (Q8_0, sm_90+, bulk kernels not
/// switched off) and the copy leaves at least a third of the device's memory free.
fn q8_split(
    dev: &CudaDevice,
    dtype: DType,
    rows: usize,
    cols: usize,
    data: &DeviceBuffer<u8>,
) -> Result<Option<DeviceBuffer<u8>>> {
    let applies = dtype == DType::Q8_0
        && dev.info.compute_capability.0 >= 9
        && bulk_shape().is_some()
        && rows > 0
        && cols.is_multiple_of(32);
    if !applies {
        return Ok(None);
    }
    let bytes = rows * q8s_row_bytes(cols) + WEIGHT_PAD;
    let (free, total) = dev.memory_info()?;
    if free < bytes + total / 3 {
        return Ok(None);
    }
    let blocks = rows * (cols / 32);
    let (r32, c32) = (
        i32_arg("upload", "rows", rows)?,
        i32_arg("upload", "cols", cols)?,
    );
    let split = dev.zeros::<u8>(bytes)?;
    let f = dev.function("matvec", "q8_0_split")?;
    let mut l = Launch::new(dev, &f);
    l.arg(&split).arg(data).arg(r32).arg(c32);
    // SAFETY: one thread per stored block (rows × cols / 32 of them, inside `data`), each writing
    // its 32 quants and its scale inside its row of the split copy (`q8s_row_bytes` per row).
    unsafe { l.launch(flat_config(blocks, 1)) }?;
    Ok(Some(split))
}

/// Zero bytes after every matrix's weights in [`DeviceMatrix::data`].
pub const WEIGHT_PAD: usize = 64;

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
    let mut l = Launch::new(dev, &f);
    l.arg(out).arg(&table.data).arg(ids).arg(c32).arg(scale);
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
        Q4_0 | Q5_0 | Q8_0 | IQ4NL => Some(Q8_0),
        Q4_1 | Q5_1 => Some(Q8_1),
        Q2K | Q3K | Q4K | Q5K | Q6K | IQ4XS => Some(Q8K),
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
    pub(crate) dtype: DType,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    /// Byte offsets of the per-block scales and of the Q8_K sums of 16.
    pub(crate) meta_offset: usize,
    pub(crate) bsums_offset: usize,
    pub(crate) buf: DeviceBuffer<u8>,
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
    let mut l = Launch::new(dev, &f);
    l.arg(x).arg(&mut acts.buf).arg(meta);
    if acts.dtype == DType::Q8K {
        l.arg(bsums);
    }
    l.arg(nb);
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
/// Elements of one block of `dtype` as the GPU holds it: IQ4_XS in blocks of 32
/// (`iq4_xs_blocks_of_32`), every other format as stored.
fn gpu_block_len(dtype: DType) -> usize {
    if dtype == DType::IQ4XS {
        32
    } else {
        dtype.block_len()
    }
}

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
pub(crate) fn sm_count(dev: &CudaDevice) -> usize {
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
    matvec_quantized_with(dev, y, w, acts, Epilogue::default())
}

/// What a matvec adds to its products before storing them, fused into its last step: `+ bias`
/// (per output row), then `+ residual` (same shape as y), in that order, as the CPU's separate
/// bias and residual additions do.
#[derive(Debug, Clone, Copy, Default)]
pub struct Epilogue<'a> {
    pub bias: Option<&'a DeviceBuffer<f32>>,
    pub residual: Option<&'a DeviceBuffer<f32>>,
}

impl Epilogue<'_> {
    fn check(&self, rows: usize, y_len: usize) -> Result<()> {
        check(
            "matvec",
            self.bias.is_none_or(|b| b.len() == rows)
                && self.residual.is_none_or(|r| r.len() == y_len),
            || {
                format!(
                    "bias {:?} residual {:?} for {rows} rows, y {y_len}",
                    self.bias.map(|b| b.len()),
                    self.residual.map(|r| r.len())
                )
            },
        )
    }
}

/// `matvec_q8_short_*`: legacy-format rows of at most 1024 elements (a block per lane), up
/// to MV_COLS activation rows; shapes and epilogue checked by the caller.
fn matvec_short(
    dev: &CudaDevice,
    y: &mut DeviceBuffer<f32>,
    w: &DeviceMatrix,
    acts: &DeviceActs,
    epi: Epilogue,
    more: &mut [MatvecPart],
) -> Result<()> {
    let f = dev.function(
        "matvec",
        &format!("matvec_q8_short_{}", suffix("matvec", w.dtype)?),
    )?;
    let rows = w.rows + more.iter().map(|p| p.w.rows).sum::<usize>();
    let (r32, c32, m32) = (
        i32_arg("matvec", "rows", rows)?,
        i32_arg("matvec", "cols", w.cols)?,
        i32_arg("matvec", "m", acts.rows)?,
    );
    let meta = acts.meta_offset as i64;
    let mut l = Launch::new(dev, &f);
    l.arg(y)
        .arg(&w.data)
        .arg(&acts.buf)
        .arg(meta)
        .arg(r32)
        .arg(c32)
        .arg(m32);
    epilogue_args(&mut l, &epi);
    segment_args(&mut l, w.rows, more)?;
    // SAFETY: one warp per weight row of the launch's matrices (warps past their rows return),
    // lane b < cols / 32 <= 32 reads block b of its row (word reads may pass the last block by
    // less than WEIGHT_PAD) and of up to MV_COLS activation rows < m; writes y[i][row] of its
    // matrix for i < m (the caller passes several matrices only for m == 1).
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: (rows.div_ceil(MV_WARPS) as u32, 1, 1),
            block_dim: ((MV_WARPS * 32) as u32, 1, 1),
            shared_mem_bytes: 0,
        })
    }?;
    Ok(())
}

/// Warps per block of `matvec_q8_tile_*` and `matvec_q8_row_*` (MVT_WARPS in kernels/matvec.cu).
const MVT_WARPS: usize = 4;

/// One activation row against legacy-format weights (32-element blocks), G lanes per weight row:
/// `matvec_q8_tile_*` (G = 8) when the rows give every SM at least four blocks of 16 rows,
/// `matvec_q8_row_*` (G = 32: one row per warp) otherwise, so that few long rows still spread
/// over the GPU. Shapes and epilogue checked by the caller.
fn matvec_tile(
    dev: &CudaDevice,
    y: &mut DeviceBuffer<f32>,
    w: &DeviceMatrix,
    acts: &DeviceActs,
    epi: Epilogue,
    more: &mut [MatvecPart],
) -> Result<()> {
    let rows = w.rows + more.iter().map(|p| p.w.rows).sum::<usize>();
    // Rows of whole 256-element runs are 16-byte aligned in every round: the staged kernel, with
    // 8 lanes per row (H200, Q8_0 37888×3584: 2,558 → 3,291 GB/s). With 32 (one row per warp)
    // it lost to the register ring on every shape measured (3584×18944 2,466 → 1,899 GB/s,
    // 3584×3584 2,252 → 1,429), so few rows keep `matvec_q8_row_*`. Rows more than one wave of
    // it (ROW_KERNEL_WARPS_PER_SM warps an SM) take the staged kernel with 16 lanes per row (two
    // rows per warp) instead, which the H200 ran faster there (4608×3584, 7B's Q/K/V: 1,776 →
    // 1,990 GB/s; below one wave it lost: 3584×3584 2,246 → 1,714). `SYNAPTIX_Q8_STILE16=1`
    // gives it every such row count, `=0` none.
    let aligned = staged_tile_kernel() && w.cols.is_multiple_of(256);
    let beyond_one_wave = rows > sm_count(dev) * ROW_KERNEL_WARPS_PER_SM;
    let lanes_per_row = if rows >= 4 * sm_count(dev) * (MVT_WARPS * 32 / 8) {
        8
    } else if aligned && staged_tile16().unwrap_or(beyond_one_wave) {
        16
    } else {
        32
    };
    let kernel = match (lanes_per_row, aligned) {
        (8, false) => "tile",
        (8, true) => "stile",
        (16, _) => "stile16",
        _ => "row",
    };
    let f = dev.function(
        "matvec",
        &format!("matvec_q8_{kernel}_{}", suffix("matvec", w.dtype)?),
    )?;
    let (r32, c32) = (
        i32_arg("matvec", "rows", rows)?,
        i32_arg("matvec", "cols", w.cols)?,
    );
    let meta = acts.meta_offset as i64;
    let rows_per_block = MVT_WARPS * 32 / lanes_per_row;
    let mut l = Launch::new(dev, &f);
    l.arg(y)
        .arg(&w.data)
        .arg(&acts.buf)
        .arg(meta)
        .arg(r32)
        .arg(c32);
    epilogue_args(&mut l, &epi);
    segment_args(&mut l, w.rows, more)?;
    // SAFETY: m == 1 and the shapes were checked (the epilogue's too); G lanes per weight row
    // (rows past `rows` load and write nothing), lane g reading blocks g, g + G, ... < cols / 32
    // of its row (word reads may pass the last block by less than WEIGHT_PAD) and the same
    // blocks of the one activation row; writes y[row] for row < rows. The staged kernel copies
    // only bytes inside each row (`cols` a multiple of 256 keeps every run 16-byte aligned).
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: (rows.div_ceil(rows_per_block) as u32, 1, 1),
            block_dim: ((MVT_WARPS * 32) as u32, 1, 1),
            shared_mem_bytes: 0,
        })
    }?;
    Ok(())
}

/// `SYNAPTIX_Q8_STILE16=1` / `=0`: [`matvec_tile`] gives every row count too small for 8
/// lanes a row to the staged kernel with 16 lanes per row / none (None: its own rule).
fn staged_tile16() -> Option<bool> {
    static ON: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    *ON.get_or_init(|| match std::env::var("SYNAPTIX_Q8_STILE16").as_deref() {
        Ok("1") => Some(true),
        Ok("0") => Some(false),
        _ => None,
    })
}

/// Warps of `matvec_q8_row_*` resident per SM: its 64 registers a thread (ptxas, sm_90) allow
/// 8 blocks of 4 warps.
const ROW_KERNEL_WARPS_PER_SM: usize = 32;

/// Whether [`matvec_tile`] stages the weights in shared memory (coalesced 16-byte copies) when
/// the row length allows it. `SYNAPTIX_NO_STAGED_TILE` set: never, for comparisons.
fn staged_tile_kernel() -> bool {
    static DISABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    !*DISABLED.get_or_init(|| std::env::var_os("SYNAPTIX_NO_STAGED_TILE").is_some())
}

/// Whether one activation row against legacy-format weights of `rows` rows (over all matrices of
/// the launch) goes to [`matvec_tile`] rather than the block-step kernel: from 1024 rows on (H200, Q8_0: 3584×18944 2472 GB/s against 2222,
/// 18944×3584 2647 against 2348, 1536×8960 1562 against 1332; but 896×4864 1022 against 1131).
/// `SYNAPTIX_NO_TILE_KERNEL` set: never, for comparisons.
fn use_tile_kernel(dtype: DType, rows: usize) -> bool {
    static DISABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    !*DISABLED.get_or_init(|| std::env::var_os("SYNAPTIX_NO_TILE_KERNEL").is_some())
        && gpu_block_len(dtype) == 32
        && rows >= 1024
}

/// Warps per thread block of `matvec_q8_rows_*` (its `W`): 4, and for the whole-super-block
/// formats also 6 and 8 (`_w6`, `_w8`), which share one block's transposed activation row
/// between more warps.
const MVR_WARPS: usize = 4;
const MVR_WARP_CHOICES: [usize; 3] = [4, 6, 8];
/// Shared memory a block may use without opting in.
const MVR_DEFAULT_SHARED: usize = 48 * 1024;

/// Whether `matvec_q8_rows_*` computes whole super-blocks per thread from 16-byte copies of the
/// round's bytes (`mvr_shape::COPY16` in kernels/matvec.cu: Q4_K, Q5_K and Q6_K).
fn mv_rows_whole(dtype: DType) -> bool {
    matches!(dtype, DType::Q4K | DType::Q5K | DType::Q6K)
}

/// Whether one `matvec_q8_rows_*` launch may take several matrices: whole super-blocks of whole
/// 16-byte words only (Q4_K, Q5_K), whose pieces the kernel can take from either matrix.
fn mv_rows_multi(dtype: DType) -> bool {
    mv_rows_whole(dtype) && dtype.block_bytes().is_multiple_of(16)
}

/// Dynamic shared memory of `matvec_q8_rows_*` for `cols` (kernels/matvec.cu:
/// `mvr_smem_bytes`): the transposed activation row (304 bytes per super-block), then per warp
/// two staging buffers of 32 super-blocks (whole-super-block formats: their bytes, plus 32 when
/// they are not whole 16-byte words; otherwise slots of odd word counts and 4 spare words) and
/// 32 × 9 f32 terms.
fn mv_rows_shared(dtype: DType, cols: usize, warps: usize) -> usize {
    let bytes = dtype.block_bytes();
    let buf_words = if mv_rows_whole(dtype) {
        32 * bytes / 4 + if bytes.is_multiple_of(16) { 0 } else { 8 }
    } else {
        let words = (bytes + if bytes.is_multiple_of(4) { 0 } else { 2 }).div_ceil(4);
        32 * (words | 1) + 4
    };
    let warp = 2 * buf_words * 4 + 32 * 9 * 4;
    cols / 256 * 304 + warps * warp
}

/// The `matvec_q8_rows_*` function of `dtype` with `warps` warps per block for rows of `cols`
/// values: Q4_K / Q5_K / Q6_K have one kernel for rows of at most 32 super-blocks (whole-row
/// rounds) and one (`_long`, one matrix a launch) for longer rows, each holding only its own
/// path; Q3_K one for both.
fn rows_function(
    dev: &CudaDevice,
    dtype: DType,
    warps: usize,
    cols: usize,
) -> Result<cudarc::driver::CudaFunction> {
    let fmt = suffix("matvec", dtype)?;
    let w = match warps {
        4 => String::new(),
        w => format!("_w{w}"),
    };
    let long = if mv_rows_whole(dtype) && rows_long(cols) {
        "_long"
    } else {
        ""
    };
    dev.function("matvec", &format!("matvec_q8_rows_{fmt}{w}{long}"))
}

/// Rows of more than 32 super-blocks: the row kernel's rounds cross rows.
fn rows_long(cols: usize) -> bool {
    cols / 256 > 32
}

/// `matvec_q8_rows_*`: one activation row against Q3_K .. Q6_K weights, each warp streaming
/// whole weight rows; shapes and epilogue checked by the caller. `Ok(false)` (nothing
/// launched) when its shared memory does not fit this GPU (very long rows).
/// Blocks of `matvec_q8_rows_*` (function `f`, `smem` bytes of dynamic shared memory) that fit
/// on one SM; 0 when its shared memory does not fit this GPU (very long rows). Opts `f` into
/// more than the default shared memory where needed.
fn rows_blocks_per_sm(
    dev: &CudaDevice,
    f: &cudarc::driver::CudaFunction,
    smem: usize,
    warps: usize,
) -> Result<usize> {
    if smem > MVR_DEFAULT_SHARED && smem > dev.max_shared_memory(f)? {
        return Ok(0);
    }
    let threads = (warps * 32) as u32;
    Ok(f.occupancy_max_active_blocks_per_multiprocessor(threads, smem, None)? as usize)
}

/// Whether `matvec_q8_rows_*` can run for rows of `cols` values of `dtype` on this GPU.
fn rows_kernel_fits(dev: &CudaDevice, dtype: DType, cols: usize) -> Result<bool> {
    let f = rows_function(dev, dtype, MVR_WARPS, cols)?;
    Ok(rows_blocks_per_sm(dev, &f, mv_rows_shared(dtype, cols, MVR_WARPS), MVR_WARPS)? > 0)
}

/// Whether `matvec_q8_rows_*` fetches its rounds of Q4_K / Q5_K / Q6_K weights by bulk copies:
/// on sm_90+ always (the kernels there are compiled with that path alone), below it by 16-byte
/// `cp.async` from every lane.
fn rows_bulk(dev: &CudaDevice) -> bool {
    dev.info.compute_capability.0 >= 9
}

/// Where `matvec_q8_rows_*` takes its activation row from.
#[derive(Clone, Copy)]
enum RowActs<'a> {
    /// Already quantized (Q8_K).
    Quantized(&'a DeviceActs),
    /// f32 values the kernel quantizes itself, after RMSNorm with this weight and epsilon when
    /// given.
    Raw {
        x: &'a DeviceBuffer<f32>,
        norm: Option<(&'a DeviceBuffer<f32>, f32)>,
    },
}

/// One activation row against Q3_K .. Q6_K weights on `matvec_q8_rows_*` (`Ok(false)`: nothing
/// launched, the caller takes another kernel). `late`: the kernel's LATE form where it has one
/// (whole-row rounds of Q4_K / Q5_K / Q6_K from the raw row), for a launch whose inputs were all
/// complete before the launch before it, which it then runs beside (see `rms_norm_matvec_many`).
fn matvec_rows(
    dev: &CudaDevice,
    y: &mut DeviceBuffer<f32>,
    w: &DeviceMatrix,
    acts: RowActs,
    epi: Epilogue,
    more: &mut [MatvecPart],
    late: bool,
) -> Result<bool> {
    // Several matrices per launch only where the kernel can split its 16-byte copies, and in
    // whole-row rounds (the long-row kernels take one matrix).
    if !more.is_empty() && (!mv_rows_multi(w.dtype) || rows_long(w.cols)) {
        return Ok(false);
    }
    let late =
        late && mv_rows_whole(w.dtype) && !rows_long(w.cols) && matches!(acts, RowActs::Raw { .. });
    let rows = w.rows + more.iter().map(|p| p.w.rows).sum::<usize>();
    // A few blocks per SM (each transposes the activation row once, then its warps split the
    // rows), no block without rows, and as many rows for every warp as the grid allows (no
    // warp waits on a neighbour with one row more, a third more work with long rows). One even
    // wave (every warp's rows within one, every SM's within a few) measured slower on an H200:
    // Q4_K 3584×18944 16.4 → 17.9 µs, 37888×3584 22.5 → 23.3. Of the block sizes, the one
    // that leaves the fewest rows per warp (ties: the smallest; where shared memory caps the
    // blocks per SM, long rows, larger blocks fit more warps), unless `preferred_block_warps`
    // names one.
    let Some((warps, f, smem, rows_per_warp)) = rows_launch_shape(
        dev,
        w.dtype,
        w.cols,
        rows,
        late,
        preferred_block_warps(&acts, w.cols),
    )?
    else {
        return Ok(false);
    };
    let threads = (warps * 32) as u32;
    let blocks = rows.div_ceil(rows_per_warp).div_ceil(warps);
    let (r32, c32) = (
        i32_arg("matvec", "rows", rows)?,
        i32_arg("matvec", "cols", w.cols)?,
    );
    let (quantized, raw, norm) = match acts {
        RowActs::Quantized(a) => (Some(a), None, None),
        RowActs::Raw { x, norm } => (None, Some(x), norm),
    };
    let (meta, bsums) = quantized.map_or((0, 0), |a| (a.meta_offset as i64, a.bsums_offset as i64));
    let mut l = Launch::new(dev, &f);
    l.arg(y)
        .arg(&w.data)
        .arg(quantized.map(|a| &a.buf))
        .arg(meta)
        .arg(bsums)
        .arg(r32)
        .arg(c32);
    epilogue_args(&mut l, &epi);
    segment_args(&mut l, w.rows, more)?;
    l.arg(raw)
        .arg(norm.map(|(g, _)| g))
        .arg(norm.map_or(0.0f32, |(_, eps)| eps))
        .arg(i32::from(rows_bulk(dev)));
    // SAFETY: the shapes were checked (the epilogue's too) and m == 1: the warps split the rows
    // into disjoint ranges and write y[row] (plus bias[row], residual[row] reads) for their own
    // rows only; weight reads stay inside the row's super-blocks but for at most 14 bytes past
    // the last one (inside WEIGHT_PAD); activation reads cover the one row of `acts` (or the
    // k values of x and of the norm weight, checked by the caller); the dynamic shared memory is `mv_rows_shared`, which the kernel's layout needs exactly and
    // the function was opted into above when over the default.
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: smem as u32,
        })
    }?;
    Ok(true)
}

/// A block size [`preferred_block_warps`] asks [`rows_launch_shape`] for.
#[derive(Clone, Copy)]
enum BlockPreference {
    /// This size wherever it fits.
    Always(usize),
    /// This size where it leaves as few rows per warp as the best.
    OnTies(usize),
}

/// Which block size a launch of the row kernel prefers (twenty-first pass, H200):
/// - one that quantizes an f32 row itself (after RMSNorm or not) takes 6 warps wherever they
///   fit: every block normalises and quantizes the whole row, so fewer, larger blocks repeat
///   that less. 1.5B Q4_K_M tg128: 788 t/s with the old rule (the fewest rows per warp, the
///   smallest block on ties: 4 warps, 8 for the Q6_K head), 800 with 6 on ties, 807 with 8 on
///   ties, 809-811 with 6 everywhere (the head too);
/// - long rows (more than 32 super-blocks: each block transposes the whole row) take 6 warps
///   where that leaves as few rows per warp as any other size (1.5B's down projection: 797 → 800).
///   0.5B's down projection (19 super-blocks, a quantized row) lost with 6 (1,348 → 1,336), and
///   7B's sizes leave no ties, so the rule stops there.
///
/// `SYNAPTIX_ROWS_RAW_WARPS=N` / `SYNAPTIX_ROWS_LONG_WARPS=N` set them (4: the old rule).
fn preferred_block_warps(acts: &RowActs, cols: usize) -> Option<BlockPreference> {
    fn from_env(name: &str) -> usize {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|w| MVR_WARP_CHOICES.contains(w))
            .unwrap_or(6)
    }
    static RAW: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    static LONG: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    if matches!(acts, RowActs::Raw { .. }) {
        let warps = *RAW.get_or_init(|| from_env("SYNAPTIX_ROWS_RAW_WARPS"));
        (warps != MVR_WARPS).then_some(BlockPreference::Always(warps))
    } else if rows_long(cols) {
        let warps = *LONG.get_or_init(|| from_env("SYNAPTIX_ROWS_LONG_WARPS"));
        Some(BlockPreference::OnTies(warps))
    } else {
        None
    }
}

/// Warps per block, function, shared memory and rows per warp of `matvec_q8_rows_*` for `rows`
/// rows of `cols` values of `dtype`; None when no block fits (very long rows). Of the sizes that
/// fit, the one `preferred` names (see [`preferred_block_warps`]), else the one leaving the fewest
/// rows per warp, the smallest on ties. `SYNAPTIX_ROWS_WARPS=4|6|8` forces a block size where it
/// fits (comparisons).
fn rows_launch_shape(
    dev: &CudaDevice,
    dtype: DType,
    cols: usize,
    rows: usize,
    late: bool,
    preferred: Option<BlockPreference>,
) -> Result<Option<(usize, cudarc::driver::CudaFunction, usize, usize)>> {
    static FORCED: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let forced = *FORCED.get_or_init(|| {
        std::env::var("SYNAPTIX_ROWS_WARPS")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|w| MVR_WARP_CHOICES.contains(w))
    });
    let (always, on_ties) = match preferred {
        Some(BlockPreference::Always(w)) => (Some(w), None),
        Some(BlockPreference::OnTies(w)) => (None, Some(w)),
        None => (None, None),
    };
    // The LATE form has four warps a block only.
    let choices: &[usize] = if mv_rows_whole(dtype) && !late {
        &MVR_WARP_CHOICES
    } else {
        &MVR_WARP_CHOICES[..1]
    };
    let mut best: Option<(usize, cudarc::driver::CudaFunction, usize, usize)> = None;
    for &warps in choices {
        if forced.is_some_and(|f| f != warps && choices.contains(&f)) {
            continue;
        }
        let f = if late {
            dev.function(
                "matvec",
                &format!("matvec_q8_rows_{}_late", suffix("matvec", dtype)?),
            )?
        } else {
            rows_function(dev, dtype, warps, cols)?
        };
        let smem = mv_rows_shared(dtype, cols, warps);
        let per_sm = rows_blocks_per_sm(dev, &f, smem, warps)?;
        if per_sm == 0 {
            continue;
        }
        // At most 16 warps an SM: the kernel's 128 registers per thread.
        let max_warps = (per_sm * warps).min(16) * sm_count(dev);
        let rows_per_warp = rows.div_ceil(max_warps);
        if forced.is_none() && always == Some(warps) {
            return Ok(Some((warps, f, smem, rows_per_warp)));
        }
        let better = best.as_ref().is_none_or(|b| {
            rows_per_warp < b.3 || (rows_per_warp == b.3 && on_ties == Some(warps))
        });
        if better {
            best = Some((warps, f, smem, rows_per_warp));
        }
    }
    Ok(best)
}

/// Whether one activation row against `w` goes to `matvec_q8_rows_*`: measured on an H200,
/// its lane-by-lane form beat the block-step kernel for Q3_K on rows up to 8192 (and so did
/// Q4_K: 4096×4096 819 vs 651 GB/s, 18944×3584 1117 vs 830) but not on longer rows nor for
/// Q6_K. Q4_K and Q5_K compute whole super-blocks per thread, which takes them on any row whose
/// activations fit in shared memory (18944×3584 Q4_K: 2170 GB/s; 3584×18944: 2014, against
/// 860 and 892 for the block-step kernel; 3356 and 2333 since rounds of whole rows). A
/// whole-super-block Q6_K from 4-byte copies ran no faster than the block-step kernel (1093 and
/// 778 against 1181 and 1210 GB/s); from 16-byte copies of the round's bytes and with one
/// transpose per super-block it beats it everywhere measured (37888×3584 1241 → 2739 GB/s,
/// 3584×18944 1243 → 2079, 1536×8960 883 → 1197), so Q6_K takes it too.
/// `SYNAPTIX_NO_ROWS_KERNEL` set: never.
fn use_rows_kernel(w: &DeviceMatrix) -> bool {
    static DISABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    !*DISABLED.get_or_init(|| std::env::var_os("SYNAPTIX_NO_ROWS_KERNEL").is_some())
        && w.cols > 0
        && (mv_rows_whole(w.dtype) || (w.dtype == DType::Q3K && w.cols <= 8192))
}

/// Whether `m` activation rows against `[_, k]` weights of `dtype` go to the tensor-core GEMM
/// (`SYNAPTIX_NO_GEMM` set: never, for comparisons).
fn use_gemm(dtype: DType, m: usize, k: usize) -> bool {
    !gemm_off() && crate::gemm::gemm_supported(dtype, m, k)
}

/// `SYNAPTIX_NO_FLOAT1` set: one activation row against float weights takes the general
/// `matvec_float_*` kernels too (for comparisons).
fn float1_off() -> bool {
    static DISABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *DISABLED.get_or_init(|| std::env::var_os("SYNAPTIX_NO_FLOAT1").is_some())
}

/// `SYNAPTIX_GEMM_EPILOGUE=0`: the prefill GEMMs' bias and residual take passes of their own
/// (same values; for comparisons).
fn epilogue_fusion_off() -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OFF.get_or_init(|| std::env::var("SYNAPTIX_GEMM_EPILOGUE").as_deref() == Ok("0"))
}

/// `SYNAPTIX_NO_GEMM` set: no tensor-core GEMM at all.
fn gemm_off() -> bool {
    static DISABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *DISABLED.get_or_init(|| std::env::var_os("SYNAPTIX_NO_GEMM").is_some())
}

/// Runs `product` (writing `y: [m, rows]`, no epilogue of its own), then applies `epi` with the
/// elementwise kernels: `+ bias`, then `residual +`, the order the fused epilogue uses.
fn with_epilogue(
    dev: &CudaDevice,
    y: &mut DeviceBuffer<f32>,
    epi: Epilogue,
    product: impl FnOnce(&mut DeviceBuffer<f32>) -> Result<()>,
) -> Result<()> {
    match epi.residual {
        None => {
            product(y)?;
            if let Some(b) = epi.bias {
                add_bias(dev, y, b)?;
            }
        }
        Some(residual) => {
            // SAFETY: `product` writes every element of the scratch product.
            let mut p = unsafe { dev.uninit::<f32>(y.len()) }?;
            product(&mut p)?;
            if let Some(b) = epi.bias {
                add_bias(dev, &mut p, b)?;
            }
            add(dev, y, residual, &p)?;
        }
    }
    Ok(())
}

/// Adds an epilogue's two pointers (null where absent) to a launch.
fn epilogue_args<'a>(l: &mut Launch<'a>, epi: &Epilogue<'a>) {
    l.arg(epi.bias).arg(epi.residual);
}

/// One matrix of a [`matvec_many`] call: `y = x · Wᵀ (+ bias)`.
pub struct MatvecPart<'a> {
    pub w: &'a DeviceMatrix,
    pub y: &'a mut DeviceBuffer<f32>,
    pub bias: Option<&'a DeviceBuffer<f32>>,
}

/// Adds the parameters of a launch's matrices 1 and 2 (`MV_SEG_PARAMS` in kernels/matvec.cu:
/// weights, outputs, biases, then the first global row of each; nulls and `rows0` for absent
/// ones) after those of matrix 0, which has `rows0` rows. At most two more matrices.
fn segment_args<'a, 'b: 'a>(
    l: &mut Launch<'a>,
    rows0: usize,
    more: &'a mut [MatvecPart<'b>],
) -> Result<()> {
    segment_args_of(l, rows0, more, |w| Some(&w.data))
}

/// [`segment_args`] with the weights each matrix passes (`pick`: its stored blocks or its
/// split copy; the caller checked that every matrix has it).
fn segment_args_of<'a, 'b: 'a>(
    l: &mut Launch<'a>,
    rows0: usize,
    more: &'a mut [MatvecPart<'b>],
    pick: fn(&DeviceMatrix) -> Option<&DeviceBuffer<u8>>,
) -> Result<()> {
    type Seg<'a> = (
        Option<&'a DeviceBuffer<u8>>,
        Option<&'a mut DeviceBuffer<f32>>,
        Option<&'a DeviceBuffer<f32>>,
        usize,
    );
    let split = |p: Option<&'a mut MatvecPart<'b>>| -> Seg<'a> {
        match p {
            Some(p) => {
                let w: &'b DeviceMatrix = p.w;
                (pick(w), Some(&mut *p.y), p.bias, w.rows)
            }
            None => (None, None, None, 0),
        }
    };
    check("matvec", more.len() <= 2, || {
        format!("{} matrices in one launch (at most 3)", more.len() + 1)
    })?;
    let mut parts = more.iter_mut();
    let (w1, y1, b1, rows1) = split(parts.next());
    let (w2, y2, b2, rows2) = split(parts.next());
    // The first rows of matrices 1 and 2 (the launch's row count where a matrix is absent).
    let r1 = i32_arg("matvec", "rows", rows0)?;
    let r2 = i32_arg("matvec", "rows", rows0 + rows1)?;
    check("matvec", rows2 == 0 || rows1 > 0, || {
        "matrix 2 without matrix 1".into()
    })?;
    l.arg(w1)
        .arg(w2)
        .arg(y1)
        .arg(y2)
        .arg(b1)
        .arg(b2)
        .arg(r1)
        .arg(r2);
    Ok(())
}

/// [`matvec_quantized`] with an [`Epilogue`].
pub fn matvec_quantized_with(
    dev: &CudaDevice,
    y: &mut DeviceBuffer<f32>,
    w: &DeviceMatrix,
    acts: &DeviceActs,
    epi: Epilogue,
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
    epi.check(w.rows, y.len())?;
    if m == 0 || w.rows == 0 {
        return Ok(());
    }
    if crate::gemm::dequant_gemm_supported(w.dtype, m, w.cols) && !gemm_off() {
        if epilogue_fusion_off() {
            return with_epilogue(dev, y, epi, |y| {
                crate::gemm::gemm_dequantized(dev, y, w, acts)
            });
        }
        return crate::gemm::gemm_dequantized_epilogue(dev, y, w, acts, epi.bias, epi.residual);
    }
    if use_gemm(w.dtype, m, w.cols) {
        return with_epilogue(dev, y, epi, |y| {
            crate::gemm::gemm_quantized(dev, y, w, acts)
        });
    }
    if crate::gemm_k::gemm_k_supported(w.dtype, m, w.cols) && !crate::gemm_k::gemm_disabled() {
        return with_epilogue(dev, y, epi, |y| {
            crate::gemm_k::gemm_k_quantized(dev, y, w, acts)
        });
    }
    if m == 1 && matvec_q8s(dev, y, w, Q8sActs::Quantized(acts), epi, &mut [])? {
        return Ok(());
    }
    if gpu_block_len(w.dtype) == 32 && w.cols <= 1024 && m <= MV_COLS {
        return matvec_short(dev, y, w, acts, epi, &mut []);
    }
    if m == 1
        && use_rows_kernel(w)
        && matvec_rows(dev, y, w, RowActs::Quantized(acts), epi, &mut [], false)?
    {
        return Ok(());
    }
    if m == 1 && use_tile_kernel(w.dtype, w.rows) {
        return matvec_tile(dev, y, w, acts, epi, &mut []);
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
    let mut l = Launch::new(dev, &f);
    l.arg(y)
        .arg(&w.data)
        .arg(&acts.buf)
        .arg(meta)
        .arg(bsums)
        .arg(r32)
        .arg(c32)
        .arg(m32)
        .arg(wpr32);
    epilogue_args(&mut l, &epi);
    // SAFETY: the shapes were checked (the epilogue's too): `wpr` warps per weight row (8 / wpr rows per block; for
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

/// `part.y = rms_norm(x, norm, eps) · part.wᵀ (+ part.bias)` for each part, for one row `x`,
/// with the norm and the activation quantization done inside the k-quant row kernel (each
/// block normalises and quantizes the row itself): no launch for the norm and no normalised row
/// in memory. Bit for bit `fused::rms_norm_quantized` then [`matvec_many`]. Parts of one format
/// share a launch where the row kernel allows (Q4_K, Q5_K); Q6_K parts have their own. Ok(false),
/// with nothing launched, where it does not apply: several rows, formats other than Q4_K, Q5_K
/// and Q6_K, rows that are not whole super-blocks, `SYNAPTIX_NO_ROWS_KERNEL`, or an activation
/// row too long for the kernel's shared memory; the caller then normalises and multiplies
/// apart.
pub fn rms_norm_matvec_many(
    dev: &CudaDevice,
    parts: &mut [MatvecPart],
    x: &DeviceBuffer<f32>,
    norm: &DeviceBuffer<f32>,
    eps: f32,
) -> Result<bool> {
    let Some(first) = parts.first() else {
        return Ok(false);
    };
    let cols = first.w.cols;
    let applies = cols > 0
        && cols.is_multiple_of(256)
        && x.len() == cols
        && norm.len() == cols
        && parts
            .iter()
            .all(|p| p.w.cols == cols && mv_rows_whole(p.w.dtype) && use_rows_kernel(p.w));
    if !applies {
        return Ok(false);
    }
    check_one_row_parts(parts)?;
    for p in parts.iter() {
        if !rows_kernel_fits(dev, p.w.dtype, cols)? {
            return Ok(false);
        }
    }
    let acts = RowActs::Raw {
        x,
        norm: Some((norm, eps)),
    };
    if matvec_rows_mixed(dev, parts, acts)? {
        return Ok(true);
    }
    // Runs of up to three parts of one format that can share a launch; the runs after the
    // first (V in another format than Q and K) run beside the first (`rows_late`).
    let mut at = 0;
    while at < parts.len() {
        let dtype = parts[at].w.dtype;
        let end = format_run_end(parts, at, mv_rows_multi(dtype) && !rows_long(cols));
        let (first, rest) = parts[at..end].split_first_mut().expect("a non-empty run");
        let epi = Epilogue {
            bias: first.bias,
            residual: None,
        };
        let late = at > 0 && rows_late();
        if !matvec_rows(dev, first.y, first.w, acts, epi, rest, late)? {
            // rows_kernel_fits said yes above.
            return Err(CudaError::Invalid {
                op: "rms_norm_matvec_many",
                detail: format!("the row kernel refused [{}, {cols}] {dtype}", first.w.rows),
            });
        }
        at = end;
    }
    Ok(true)
}

/// Warps per block of `matvec_q8_rows_mixed_*`.
const MVR_MIXED_WARPS: usize = 6;

/// Whether three parts on one raw row, two of one format and the third of another (Q and K in
/// Q4_K or Q5_K, V in Q6_K), take one launch of `matvec_q8_rows_mixed_*` (each format on its own
/// blocks) instead of two (`SYNAPTIX_ROWS_MIXED=0`: never).
fn rows_mixed() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("SYNAPTIX_ROWS_MIXED").as_deref() != Ok("0"))
}

/// Q and K (one format) and V (another) against one raw row in one launch of
/// `matvec_q8_rows_mixed_*`: each format's rows on blocks of their own, as many rows a warp on
/// both sides. Ok(false), launching nothing, where it does not apply (other part layouts or
/// formats, long rows, shared memory); the caller then takes a launch per format.
fn matvec_rows_mixed(dev: &CudaDevice, parts: &mut [MatvecPart], acts: RowActs) -> Result<bool> {
    let (RowActs::Raw { x, norm }, [a0, a1, b]) = (acts, &*parts) else {
        return Ok(false);
    };
    let (da, db, cols) = (a0.w.dtype, b.w.dtype, a0.w.cols);
    let pair = match (da, db) {
        (DType::Q4K, DType::Q6K) => "q4_k_q6_k",
        (DType::Q5K, DType::Q6K) => "q5_k_q6_k",
        _ => return Ok(false),
    };
    if !rows_mixed() || a1.w.dtype != da || rows_long(cols) || many_disabled() {
        return Ok(false);
    }
    let warps = MVR_MIXED_WARPS;
    let f = dev.function("matvec", &format!("matvec_q8_rows_mixed_{pair}"))?;
    let smem = mv_rows_shared(da, cols, warps).max(mv_rows_shared(db, cols, warps));
    let per_sm = rows_blocks_per_sm(dev, &f, smem, warps)?;
    if per_sm == 0 {
        return Ok(false);
    }
    let rows_a = a0.w.rows + a1.w.rows;
    let rows_b = b.w.rows;
    let max_warps = (per_sm * warps).min(16) * sm_count(dev);
    let rows_per_warp = (rows_a + rows_b).div_ceil(max_warps);
    let blocks_a = rows_a.div_ceil(rows_per_warp).div_ceil(warps);
    let blocks_b = rows_b.div_ceil(rows_per_warp).div_ceil(warps);
    let (first, rest) = parts.split_first_mut().expect("three parts");
    let (r32, c32, ba32) = (
        i32_arg("matvec", "rows", rows_a + rows_b)?,
        i32_arg("matvec", "cols", cols)?,
        i32_arg("matvec", "blocks", blocks_a)?,
    );
    let epi = Epilogue {
        bias: first.bias,
        residual: None,
    };
    let mut l = Launch::new(dev, &f);
    l.arg(&mut *first.y)
        .arg(&first.w.data)
        .arg(None::<&DeviceBuffer<u8>>)
        .arg(0i64)
        .arg(0i64)
        .arg(r32)
        .arg(c32);
    epilogue_args(&mut l, &epi);
    segment_args(&mut l, first.w.rows, rest)?;
    l.arg(x)
        .arg(norm.map(|(g, _)| g))
        .arg(norm.map_or(0.0f32, |(_, eps)| eps))
        .arg(i32::from(rows_bulk(dev)))
        .arg(ba32);
    // SAFETY: as `matvec_rows` for each part: blocks [0, blocks_a) split the rows of matrices 0
    // and 1 (one format) between their warps, the other blocks those of matrix 2; each warp
    // writes y[row] of its own rows only, reads weights inside its rows' super-blocks (at most
    // 14 bytes past, inside WEIGHT_PAD) and the k values of x and of the norm weight (checked
    // by the caller); the dynamic shared memory is the larger of the two parts' layouts.
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: ((blocks_a + blocks_b) as u32, 1, 1),
            block_dim: ((warps * 32) as u32, 1, 1),
            shared_mem_bytes: smem as u32,
        })
    }?;
    Ok(true)
}

/// Whether [`rms_norm_matvec_many`]'s launches after its first take the row kernel's LATE
/// form, which waits for the launch before it at its end instead of its start (both read the
/// same row, complete before the first began), so that the two run side by side
/// (`SYNAPTIX_ROWS_LATE=0`: never).
fn rows_late() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("SYNAPTIX_ROWS_LATE").as_deref() != Ok("0"))
}

/// `part.y = x · part.wᵀ (+ part.bias)` for each part, with `acts` the rows of `x` quantized
/// for the parts' format (None for float weights). Up to three matrices of one format and row
/// length against one activation row (Q, K and V; gate and up) share one launch where the
/// kernel for their format allows it (legacy formats, Q4_K, Q5_K, F16/BF16/F32); otherwise, and
/// with `SYNAPTIX_NO_MATVEC_MANY` set, each part has its own. Bit for bit the separate products.
pub fn matvec_many(
    dev: &CudaDevice,
    parts: &mut [MatvecPart],
    x: &DeviceBuffer<f32>,
    acts: Option<&DeviceActs>,
) -> Result<()> {
    let Some((first, rest)) = parts.split_first_mut() else {
        return Ok(());
    };
    let (dtype, cols) = (first.w.dtype, first.w.cols);
    let m = x.len().checked_div(cols).unwrap_or(0);
    let shared = !rest.is_empty()
        && rest.len() <= 2
        && !many_disabled()
        && m == 1
        && rest.iter().all(|p| p.w.dtype == dtype && p.w.cols == cols);
    if shared {
        for p in std::iter::once(&*first).chain(rest.iter()) {
            check_matvec(p.w, p.y.len(), 1)?;
            Epilogue {
                bias: p.bias,
                residual: None,
            }
            .check(p.w.rows, p.y.len())?;
        }
        let rows = first.w.rows + rest.iter().map(|p| p.w.rows).sum::<usize>();
        let epi = Epilogue {
            bias: first.bias,
            residual: None,
        };
        match (activation_format(dtype), acts) {
            (None, _) if !use_gemm(dtype, 1, cols) => {
                check("matvec", x.len() == cols, || {
                    format!("x {} for {cols} columns", x.len())
                })?;
                return matvec_float_kernel(dev, first.y, first.w, x, epi, rest);
            }
            (Some(format), Some(acts)) if format == acts.dtype && acts.cols == cols => {
                check("matvec", acts.rows == 1, || {
                    format!("{} activation rows", acts.rows)
                })?;
                if matvec_q8s(dev, first.y, first.w, Q8sActs::Quantized(acts), epi, rest)? {
                    return Ok(());
                }
                if gpu_block_len(dtype) == 32 && cols <= 1024 {
                    return matvec_short(dev, first.y, first.w, acts, epi, rest);
                }
                if mv_rows_multi(dtype)
                    && use_rows_kernel(first.w)
                    && matvec_rows(
                        dev,
                        first.y,
                        first.w,
                        RowActs::Quantized(acts),
                        epi,
                        rest,
                        false,
                    )?
                {
                    return Ok(());
                }
                if use_tile_kernel(dtype, rows) {
                    return matvec_tile(dev, first.y, first.w, acts, epi, rest);
                }
            }
            _ => {}
        }
    }
    // Many activation rows against matrices of one format: one GEMM launch for all of them
    // (x rounded or expanded to halves once, biases in the epilogue).
    let uniform = parts.len() <= 3 && parts.iter().all(|p| p.w.dtype == dtype && p.w.cols == cols);
    if m > 1 && uniform && !gemm_off() {
        match (activation_format(dtype), acts) {
            (None, _) if use_gemm(dtype, m, cols) => {
                return crate::gemm::gemm_float_many(dev, parts, x);
            }
            (Some(format), Some(acts))
                if format == acts.dtype
                    && acts.rows == m
                    && crate::gemm::dequant_gemm_supported(dtype, m, cols) =>
            {
                return crate::gemm::gemm_dequantized_many(dev, parts, acts);
            }
            _ => {}
        }
    }
    for p in parts.iter_mut() {
        let epi = Epilogue {
            bias: p.bias,
            residual: None,
        };
        match acts {
            Some(acts) if activation_format(p.w.dtype).is_some() => {
                matvec_quantized_with(dev, p.y, p.w, acts, epi)?
            }
            _ => matvec_with(dev, p.y, p.w, x, epi)?,
        }
    }
    Ok(())
}

/// `SYNAPTIX_NO_MATVEC_MANY` set: every matrix of [`matvec_many`] gets its own launch.
fn many_disabled() -> bool {
    static DISABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *DISABLED.get_or_init(|| std::env::var_os("SYNAPTIX_NO_MATVEC_MANY").is_some())
}

/// `y: [m, rows] = x: [m, cols] · Wᵀ` with ggml's CPU arithmetic, bit for bit the CPU's
/// `matmul`: for quantized W, the rows of x are quantized once to W's [`activation_format`] (as
/// the CPU does) into a scratch buffer and multiplied with exact integer block sums
/// ([`matvec_quantized`]); F16 and BF16 weights see x rounded to their type, and the products
/// are summed in f64. Many activation rows (prefill) go to the tensor-core GEMM where it
/// supports the format (`crate::gemm`).
pub fn matvec(
    dev: &CudaDevice,
    y: &mut DeviceBuffer<f32>,
    w: &DeviceMatrix,
    x: &DeviceBuffer<f32>,
) -> Result<()> {
    matvec_with(dev, y, w, x, Epilogue::default())
}

/// [`matvec`] with an [`Epilogue`].
pub fn matvec_with(
    dev: &CudaDevice,
    y: &mut DeviceBuffer<f32>,
    w: &DeviceMatrix,
    x: &DeviceBuffer<f32>,
    epi: Epilogue,
) -> Result<()> {
    check(
        "matvec",
        w.cols > 0 && x.len().is_multiple_of(w.cols),
        || format!("x {} for [{}, {}]", x.len(), w.rows, w.cols),
    )?;
    let m = x.len() / w.cols;
    if activation_format(w.dtype).is_none() {
        return matvec_float(dev, y, w, x, epi);
    }
    check_matvec(w, y.len(), m)?;
    if m == 0 || w.rows == 0 {
        return Ok(());
    }
    if m == 1 && rows_take_raw(w) {
        epi.check(w.rows, y.len())?;
        if rows_kernel_fits(dev, w.dtype, w.cols)?
            && matvec_rows(
                dev,
                y,
                w,
                RowActs::Raw { x, norm: None },
                epi,
                &mut [],
                false,
            )?
        {
            return Ok(());
        }
    }

    let mut acts = DeviceActs::new(dev, w.dtype, m, w.cols)?;
    quantize_acts(dev, &mut acts, x)?;
    matvec_quantized_with(dev, y, w, &acts, epi)
}

/// Whether one f32 activation row against `w` goes to the k-quant row kernel as it is, the
/// kernel's blocks quantizing it to Q8_K themselves (the same bits as `quantize_acts`), so the
/// quantization takes no launch of its own: Q4_K, Q5_K and Q6_K rows of whole super-blocks, up
/// to [`ROWS_RAW_MAX_COLS`]. The attention of a decode step then leaves its output unquantized
/// for such an output projection. `SYNAPTIX_ROWS_RAW=0`: never, `=all`: any row length (for
/// comparisons).
pub fn rows_take_raw(w: &DeviceMatrix) -> bool {
    static MODE: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let max_cols = *MODE.get_or_init(|| match std::env::var("SYNAPTIX_ROWS_RAW").as_deref() {
        Ok("0") => None,
        Ok("all") => Some(usize::MAX),
        _ => Some(ROWS_RAW_MAX_COLS),
    });
    max_cols.is_some_and(|max| w.cols <= max)
        && mv_rows_whole(w.dtype)
        && use_rows_kernel(w)
        && w.cols.is_multiple_of(256)
}

/// The longest row [`rows_take_raw`] hands to the row kernel unquantized: every block quantizes
/// the whole row before its first product. On an H200 (tg128, A/B pairs), Qwen2.5 1.5B Q4_K_M
/// (1536 columns: the output projection, attention's Q8_K tail gone) 672.0 / 665.4 → 688.6 /
/// 681.9 t/s; at 7B (3584) it cost: 393.0 / 392.9 → 386.8 / 391.5.
const ROWS_RAW_MAX_COLS: usize = 2048;

/// Float weights (F32, F16, BF16): x rounded to the weight type, f32 products, f64 sums (per
/// lane, then across the warp; see kernels/matvec.cu on why that lands on the CPU's values).
fn matvec_float(
    dev: &CudaDevice,
    y: &mut DeviceBuffer<f32>,
    w: &DeviceMatrix,
    x: &DeviceBuffer<f32>,
    epi: Epilogue,
) -> Result<()> {
    let m = x.len() / w.cols;
    check_matvec(w, y.len(), m)?;
    epi.check(w.rows, y.len())?;
    if m == 0 || w.rows == 0 {
        return Ok(());
    }
    if use_gemm(w.dtype, m, w.cols) {
        if epilogue_fusion_off() {
            return with_epilogue(dev, y, epi, |y| crate::gemm::gemm_float(dev, y, w, x));
        }
        return crate::gemm::gemm_float_epilogue(dev, y, w, x, epi.bias, epi.residual);
    }
    matvec_float_kernel(dev, y, w, x, epi, &mut [])
}

/// `matvec_float_*` over `w` and up to two more matrices of its format and row length (those
/// only with one activation row and no residual; checked by the callers).
fn matvec_float_kernel(
    dev: &CudaDevice,
    y: &mut DeviceBuffer<f32>,
    w: &DeviceMatrix,
    x: &DeviceBuffer<f32>,
    epi: Epilogue,
    more: &mut [MatvecPart],
) -> Result<()> {
    let m = x.len() / w.cols;
    let rows = w.rows + more.iter().map(|p| p.w.rows).sum::<usize>();
    if m == 1 && matvec_bulk(dev, y, w, x, epi, more, RowPrologue::None)? {
        return Ok(());
    }
    // One activation row: the kernels that keep more weight loads in flight (and, for 16-bit
    // weights, stage the row rounded to their type in shared memory: k % 8 == 0).
    let staged = w.dtype != DType::F32;
    let kernel = if m == 1 && !float1_off() && (!staged || w.cols.is_multiple_of(8)) {
        "matvec_float1"
    } else {
        "matvec_float"
    };
    let f = dev.function(
        "matvec",
        &format!("{kernel}_{}", suffix("matvec", w.dtype)?),
    )?;
    let (r32, c32, m32) = (
        i32_arg("matvec", "rows", rows)?,
        i32_arg("matvec", "cols", w.cols)?,
        i32_arg("matvec", "m", m)?,
    );
    // One warp per (weight row, group of up to MV_COLS activation rows).
    let passes = m.div_ceil(MV_COLS);
    check("matvec", passes <= 65535, || {
        format!("{m} activation rows exceed the grid")
    })?;
    let mut l = Launch::new(dev, &f);
    l.arg(y).arg(&w.data).arg(x).arg(r32).arg(c32).arg(m32);
    epilogue_args(&mut l, &epi);
    segment_args(&mut l, w.rows, more)?;
    // SAFETY: one warp per weight row of the launch's matrices (warps past their rows return at
    // once, or after the staged kernels' last barrier) and group of up to MV_COLS activation
    // rows; reads and writes stay inside the checked shapes of each matrix (the staged kernels
    // read x in whole 8-value words: k % 8 == 0).
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: (rows.div_ceil(MV_WARPS) as u32, passes as u32, 1),
            block_dim: ((MV_WARPS * 32) as u32, 1, 1),
            shared_mem_bytes: 0,
        })
    }?;
    Ok(())
}

/// Rows shorter than this take the register kernels: with a block per SM, few short rows keep
/// too few copies in flight (H200: 9728×896 2,255 GB/s registers, 1,763 bulk; 896×4864 986 and
/// 1,488).
const MVB_MIN_COLS: usize = 2048;

/// The ring of `matvec_bulk_*`: each of `warps` warps (at most MVB_MAX_WARPS in
/// kernels/matvec.cu) keeps `stages` copies of `chunk` bytes in flight.
#[derive(Debug, Clone, Copy)]
struct BulkShape {
    stages: usize,
    chunk: usize,
    warps: usize,
}

/// The bulk kernel's ring, or None: `SYNAPTIX_BULK=off` takes the register kernels,
/// `SYNAPTIX_BULK=S,C[,W]` sets stages, chunk bytes and warps (for sweeps).
fn bulk_shape() -> Option<BulkShape> {
    static SHAPE: std::sync::OnceLock<Option<BulkShape>> = std::sync::OnceLock::new();
    const DEFAULT: BulkShape = BulkShape {
        stages: 2,
        chunk: 4096,
        warps: 16,
    };
    *SHAPE.get_or_init(|| match std::env::var("SYNAPTIX_BULK").ok().as_deref() {
        Some("off") | Some("0") => None,
        Some(v) => {
            let n: Vec<usize> = v.split(',').filter_map(|s| s.trim().parse().ok()).collect();
            match n[..] {
                [stages, chunk, ref rest @ ..]
                    if stages >= 1 && chunk >= 512 && chunk % 512 == 0 =>
                {
                    let warps = rest.first().copied().unwrap_or(DEFAULT.warps).clamp(1, 32);
                    Some(BulkShape {
                        stages,
                        chunk,
                        warps,
                    })
                }
                _ => Some(DEFAULT),
            }
        }
        None => Some(DEFAULT),
    })
}

/// Whether `matvec_bulk_*` sums its products in f32 (eight chains a lane per copy, each then
/// added in f64): `SYNAPTIX_BULK_SUMS=f32`. By default every product (exact in f32) is added in
/// f64, as the CPU adds them: the CPU's bits. On the H200 the f32 sums ran 7B F16 tg128 224.9 /
/// 224.4 → 229.9 / 230.3 in one machine session and 224.5 → 226.7 in another (1.5B F16 581.3 →
/// 591.3), but they change the decode logits (NMSE ~5e-7 at 0.5B and 1.5B F16) and so, under
/// sampling, the picks: not the default.
pub fn bulk_f32_sums() -> bool {
    static F32: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *F32.get_or_init(|| std::env::var("SYNAPTIX_BULK_SUMS").as_deref() == Ok("f32"))
}

/// Whether a bulk-kernel block whose rows hold `block_chunks` copies splits them evenly between
/// its `warps` warps in order (each warp streams one contiguous run; a row may span warps, its
/// parts added in order at the block's end) instead of dealing whole rows to the warps in turn.
/// By default where each warp gets at least four copies: on the H200 (GB/s, F16) 37888×3584
/// went 3,749 → 4,060, 152064×3584 3,991 → 4,376, 4608×3584 2,257 → 2,462 and 3584×18944
/// 3,319 → 3,442, while 3584×3584 (54 copies a block) went 2,234 → 2,165 and 1536×8960 (60)
/// 2,264 → 2,192. `SYNAPTIX_BULK_BALANCE=0` never splits, `=1` always does.
fn bulk_balance(block_chunks: usize, warps: usize) -> bool {
    static MODE: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    let forced = MODE.get_or_init(|| match std::env::var("SYNAPTIX_BULK_BALANCE").as_deref() {
        Ok("0") => Some(false),
        Ok("1") => Some(true),
        _ => None,
    });
    forced.unwrap_or(block_chunks >= 4 * warps)
}

/// What `matvec_bulk_*` does to the activation row before the product (`pro` in
/// kernels/matvec.cu): each block computes it for itself while its first weights stream in, which
/// saves the launch of a kernel of its own.
#[derive(Clone, Copy)]
pub enum RowPrologue<'a> {
    None,
    /// RMSNorm with this weight and epsilon.
    RmsNorm {
        weight: &'a DeviceBuffer<f32>,
        eps: f32,
    },
    /// The row is the gate projection: `act(gate) * up`.
    Glu {
        up: &'a DeviceBuffer<f32>,
        kind: Glu,
        /// ggml's GELU table for [`Glu::GeluTanh`].
        table: Option<&'a DeviceBuffer<u16>>,
    },
}

/// Whether one activation row against `w` takes `matvec_bulk_*` (before its shared memory is
/// checked).
pub fn bulk_applies(dev: &CudaDevice, w: &DeviceMatrix) -> bool {
    bulk_shape().is_some()
        && matches!(w.dtype, DType::F16 | DType::BF16)
        && dev.info.compute_capability.0 >= 9
        && w.cols >= MVB_MIN_COLS
        && w.cols.is_multiple_of(8)
        && w.rows > 0
}

/// One activation row against F16 / BF16 weights (and up to two more matrices of the same
/// format and row length, `more`) through `matvec_bulk_*`: Hopper's bulk copies stream the
/// weights into shared memory. Returns false, launching nothing, when the card, the shape or the
/// shared memory rule it out; the caller then takes the other kernels.
fn matvec_bulk(
    dev: &CudaDevice,
    y: &mut DeviceBuffer<f32>,
    w: &DeviceMatrix,
    x: &DeviceBuffer<f32>,
    epi: Epilogue,
    more: &mut [MatvecPart],
    pro: RowPrologue,
) -> Result<bool> {
    let Some(BulkShape {
        stages,
        chunk,
        warps,
    }) = bulk_shape()
    else {
        return Ok(false);
    };
    if !bulk_applies(dev, w)
        || x.len() != w.cols
        || more
            .iter()
            .any(|p| p.w.dtype != w.dtype || p.w.cols != w.cols)
    {
        return Ok(false);
    }
    let k = w.cols;
    let rows = w.rows + more.iter().map(|p| p.w.rows).sum::<usize>();
    // A block per SM (two of 8 warps or fewer, where shared memory allows).
    let blocks = rows.min(sm_count(dev) * (16 / warps).max(1));
    let f = dev.function(
        "matvec",
        &format!("matvec_bulk_{}", suffix("matvec", w.dtype)?),
    )?;
    let max_shared = dev.max_shared_memory(&f)?;
    // The ring, x rounded to 16 bits, the barriers. A ring too large for this row length's x
    // gives up stages, then halves its copies.
    let shared_of =
        |stages: usize, chunk: usize| warps * stages * chunk + k * 2 + warps * stages * 8;
    let (mut stages, mut chunk) = (stages, chunk);
    while shared_of(stages, chunk) > max_shared && (stages > 1 || chunk >= 1024) {
        if stages > 1 {
            stages -= 1;
        } else {
            chunk /= 2;
        }
    }
    let shared = shared_of(stages, chunk);
    if shared > max_shared {
        return Ok(false);
    }
    // Balanced: a block's chunks split evenly between its warps, one f64 per chunk for the parts.
    let block_chunks = rows.div_ceil(blocks) * (k * 2).div_ceil(chunk);
    let balance = bulk_balance(block_chunks, warps) && shared + block_chunks * 8 <= max_shared;
    let shared = shared + if balance { block_chunks * 8 } else { 0 };
    let (code, x2, norm, eps, table) = match pro {
        RowPrologue::None => (0i32, None, None, 0.0f32, None),
        RowPrologue::RmsNorm { weight, eps } => {
            check("matvec", weight.len() == k, || {
                format!("norm weight of {} for {k} columns", weight.len())
            })?;
            (1, None, Some(weight), eps, None)
        }
        RowPrologue::Glu { up, kind, table } => {
            check("matvec", up.len() == k, || {
                format!("up projection of {} for {k} columns", up.len())
            })?;
            match kind {
                Glu::Silu => (2, Some(up), None, 0.0, None),
                Glu::GeluTanh => {
                    let t = table.ok_or_else(|| CudaError::Invalid {
                        op: "matvec",
                        detail: "GeGLU needs the GELU table".into(),
                    })?;
                    check("matvec", t.len() > u16::MAX as usize, || {
                        format!("GELU table of {} entries", t.len())
                    })?;
                    (3, Some(up), None, 0.0, Some(t))
                }
            }
        }
    };
    let (r32, c32) = (
        i32_arg("matvec", "rows", rows)?,
        i32_arg("matvec", "cols", k)?,
    );
    let mut l = Launch::new(dev, &f);
    l.arg(y)
        .arg(&w.data)
        .arg(x)
        .arg(r32)
        .arg(c32)
        .arg(stages as i32)
        .arg(chunk as i32);
    epilogue_args(&mut l, &epi);
    segment_args(&mut l, w.rows, more)?;
    l.arg(code)
        .arg(x2)
        .arg(norm)
        .arg(eps)
        .arg(table)
        .arg(balance as i32)
        .arg(bulk_f32_sums() as i32);
    // SAFETY: each block copies whole rows (in pieces of 16-byte multiples: k % 8 == 0) of the
    // launch's matrices into its own shared memory, which `shared` covers (the ring, the row of
    // x rounded to 16 bits, the barriers); it reads k values of x (and of the up projection and
    // the norm weight, checked above; the table has 65536 entries) and writes one output per row
    // it owns.
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: ((warps * 32) as u32, 1, 1),
            shared_mem_bytes: shared as u32,
        })
    }?;
    Ok(true)
}

/// A product that normalises its one activation row itself (RMSNorm with a weight and an
/// epsilon) before multiplying it by the parts' matrices: `rms_norm_matvec_many`,
/// `rms_norm_matvec_float_many`, `rms_norm_matvec_q8s_many`. Ok(false), launching nothing,
/// where its kernel does not take the parts.
pub type NormedMatvec =
    fn(&CudaDevice, &mut [MatvecPart], &DeviceBuffer<f32>, &DeviceBuffer<f32>, f32) -> Result<bool>;

/// Checks the outputs and biases of one activation row's parts (`first` and `rest`) and returns
/// the first part's epilogue (its bias; the launch passes the others' as segments).
fn check_row_parts<'a>(first: &MatvecPart<'a>, rest: &[MatvecPart]) -> Result<Epilogue<'a>> {
    for p in std::iter::once(first).chain(rest.iter()) {
        check_matvec(p.w, p.y.len(), 1)?;
        Epilogue {
            bias: p.bias,
            residual: None,
        }
        .check(p.w.rows, p.y.len())?;
    }
    Ok(Epilogue {
        bias: first.bias,
        residual: None,
    })
}

/// Checks the outputs and biases of every part of a one-row product.
fn check_one_row_parts(parts: &[MatvecPart]) -> Result<()> {
    match parts.split_first() {
        Some((first, rest)) => check_row_parts(first, rest).map(|_| ()),
        None => Ok(()),
    }
}

/// The end of the run of parts from `at` that share one launch: up to three of one format where
/// the kernel takes several (`shared`) and shared launches are not switched off, else one.
fn format_run_end(parts: &[MatvecPart], at: usize, shared: bool) -> usize {
    let dtype = parts[at].w.dtype;
    let mut end = at + 1;
    if shared && !many_disabled() {
        while end < parts.len() && end - at < 3 && parts[end].w.dtype == dtype {
            end += 1;
        }
    }
    end
}

/// The first matrix of `parts` and the others, where one launch can take them all (at most
/// three, and shared launches not switched off); None otherwise.
fn one_launch_parts<'p, 'a>(
    parts: &'p mut [MatvecPart<'a>],
) -> Option<(&'p mut MatvecPart<'a>, &'p mut [MatvecPart<'a>])> {
    let (first, rest) = parts.split_first_mut()?;
    (rest.len() <= 2 && (rest.is_empty() || !many_disabled())).then_some((first, rest))
}

/// `parts[i].y = rms_norm(x, norm, eps) · W_iᵀ (+ bias_i)` for one row against up to three
/// F16 / BF16 matrices of one format and row length, in one launch that normalises inside
/// (`matvec_bulk_*`). Returns false, launching nothing, where that kernel does not apply.
pub fn rms_norm_matvec_float_many(
    dev: &CudaDevice,
    parts: &mut [MatvecPart],
    x: &DeviceBuffer<f32>,
    norm: &DeviceBuffer<f32>,
    eps: f32,
) -> Result<bool> {
    let Some((first, rest)) = one_launch_parts(parts) else {
        return Ok(false);
    };
    if !bulk_applies(dev, first.w) {
        return Ok(false);
    }
    let epi = check_row_parts(first, rest)?;
    let pro = RowPrologue::RmsNorm { weight: norm, eps };
    matvec_bulk(dev, first.y, first.w, x, epi, rest, pro)
}

/// `y = (act(gate) * up) · Wᵀ (+ residual)` for one row against F16 / BF16 weights, the
/// activation computed inside the product's launch (`matvec_bulk_*`). Returns false, launching
/// nothing, where that kernel does not apply.
#[allow(clippy::too_many_arguments)]
pub fn glu_matvec(
    dev: &CudaDevice,
    y: &mut DeviceBuffer<f32>,
    w: &DeviceMatrix,
    gate: &DeviceBuffer<f32>,
    up: &DeviceBuffer<f32>,
    kind: Glu,
    table: Option<&DeviceBuffer<u16>>,
    residual: Option<&DeviceBuffer<f32>>,
) -> Result<bool> {
    if !bulk_applies(dev, w) {
        return Ok(false);
    }
    check_matvec(w, y.len(), 1)?;
    let epi = Epilogue {
        bias: None,
        residual,
    };
    epi.check(w.rows, y.len())?;
    let pro = RowPrologue::Glu { up, kind, table };
    matvec_bulk(dev, y, w, gate, epi, &mut [], pro)
}

/// `parts[i].y = rms_norm(x, norm, eps) · W_iᵀ (+ bias_i)` for one row of at most 2048 values
/// against legacy-format matrices (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) through
/// `matvec_q8_short_norm_*` (rows of up to 1024 values: a block per lane) or `_norm2_*` (up to
/// 2048: two), whose blocks normalise and quantize the row themselves into shared memory: bit
/// for bit `fused::rms_norm_quantized` then [`matvec_many`], with no norm launch. Runs of up to
/// three parts of one format share a launch. Ok(false), launching nothing, where it does not
/// apply (other formats, longer rows, matrices with split copies, rows longer than
/// `SYNAPTIX_NORM_IN_SHORT`).
pub fn rms_norm_matvec_short_many(
    dev: &CudaDevice,
    parts: &mut [MatvecPart],
    x: &DeviceBuffer<f32>,
    norm: &DeviceBuffer<f32>,
    eps: f32,
) -> Result<bool> {
    let Some(first) = parts.first() else {
        return Ok(false);
    };
    let cols = first.w.cols;
    let applies = cols > 0
        && cols <= short_norm_max_cols()
        && cols.is_multiple_of(32)
        && x.len() == cols
        && norm.len() == cols
        && parts.iter().all(|p| {
            p.w.cols == cols && p.w.split.is_none() && short_norm_suffix(p.w.dtype).is_some()
        });
    if !applies {
        return Ok(false);
    }
    check_one_row_parts(parts)?;
    let mut at = 0;
    while at < parts.len() {
        let dtype = parts[at].w.dtype;
        let Some(name) = short_norm_suffix(dtype) else {
            return Err(CudaError::Invalid {
                op: "rms_norm_matvec_short_many",
                detail: format!("{dtype} weights"),
            });
        };
        let end = format_run_end(parts, at, true);
        let Some((first, rest)) = parts[at..end].split_first_mut() else {
            break;
        };
        let two = cols > 1024;
        let kernel = if two {
            "matvec_q8_short_norm2"
        } else {
            "matvec_q8_short_norm"
        };
        let f = dev.function("matvec", &format!("{kernel}_{name}"))?;
        let rows = first.w.rows + rest.iter().map(|p| p.w.rows).sum::<usize>();
        // A block per SM where that leaves each warp at most SHORT_NORM_ROWS rows (their
        // weights requested before the PDL wait), more blocks otherwise.
        let most = MV_WARPS * SHORT_NORM_ROWS / if two { 2 } else { 1 };
        let per_block = rows
            .div_ceil(sm_count(dev))
            .clamp(1, short_norm_block_rows().unwrap_or(most).clamp(1, most));
        let (r32, c32, p32) = (
            i32_arg("matvec", "rows", rows)?,
            i32_arg("matvec", "cols", cols)?,
            i32_arg("matvec", "rows per block", per_block)?,
        );
        let mut l = Launch::new(dev, &f);
        l.arg(&mut *first.y)
            .arg(&first.w.data)
            .arg(x)
            .arg(norm)
            .arg(eps)
            .arg(r32)
            .arg(c32)
            .arg(p32)
            .arg(first.bias);
        segment_args(&mut l, first.w.rows, rest)?;
        // SAFETY: block i takes rows [i·per_block, (i + 1)·per_block) of the launch's
        // matrices, at most MV_WARPS · SN_ROWS / NBL (the kernel's limit, NBL = 2 for the
        // `norm2` form); thread t reads float4s t and t + 256 of x and of the norm weights below
        // cols / 4 (both `cols` long, checked); lane b reads blocks b and b + 32 of its rows below
        // cols / 32 (word reads may pass the last block by less than WEIGHT_PAD); each warp
        // writes y[row] of its matrix for its rows only.
        unsafe {
            l.launch(LaunchConfig {
                grid_dim: (rows.div_ceil(per_block) as u32, 1, 1),
                block_dim: ((MV_WARPS * 32) as u32, 1, 1),
                shared_mem_bytes: 0,
            })
        }?;
        at = end;
    }
    Ok(true)
}

/// Rows per warp of `matvec_q8_short_norm_*` whose weights are requested before its PDL wait
/// (SN_ROWS in kernels/matvec.cu): the most rows a warp gets.
const SHORT_NORM_ROWS: usize = 4;

/// `SYNAPTIX_SHORT_NORM_BLOCK_ROWS=N`: `matvec_q8_short_norm_*` blocks take at most N rows
/// (and at most the kernel's limit) instead of at most the limit (sweeps; same bits).
fn short_norm_block_rows() -> Option<usize> {
    static ROWS: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *ROWS.get_or_init(|| {
        std::env::var("SYNAPTIX_SHORT_NORM_BLOCK_ROWS")
            .ok()
            .and_then(|v| v.parse().ok())
    })
}

/// The kernel name suffix of `matvec_q8_short_norm_*` for `dtype` (legacy formats only).
fn short_norm_suffix(dtype: DType) -> Option<&'static str> {
    match dtype {
        DType::Q4_0 => Some("q4_0"),
        DType::Q4_1 => Some("q4_1"),
        DType::Q5_0 => Some("q5_0"),
        DType::Q5_1 => Some("q5_1"),
        DType::Q8_0 => Some("q8_0"),
        DType::IQ4NL => Some("iq4_nl"),
        _ => None,
    }
}

/// The longest row [`rms_norm_matvec_short_many`] takes: 2048, or `SYNAPTIX_NORM_IN_SHORT=N`
/// (comparisons; 0: never). On the H200, Qwen2.5 0.5B (896 values a row: Q/K/V and gate/up)
/// tg128 Q8_0 1,284.5 / 1,283.6 → 1,365.5 / 1,366.6, Q4_K_M 1,243.6 / 1,242.3 → 1,324.0 /
/// 1,324.7 (its Q5_0 and Q8_0 matrices).
fn short_norm_max_cols() -> usize {
    static COLS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *COLS.get_or_init(|| {
        std::env::var("SYNAPTIX_NORM_IN_SHORT")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(2048)
            .min(2048)
    })
}

/// Where `matvec_q8s_bulk` takes its activation row from: quantized already, or the raw row
/// that each block normalises (RMSNorm) and quantizes itself.
#[derive(Clone, Copy)]
enum Q8sActs<'a> {
    Quantized(&'a DeviceActs),
    Norm {
        x: &'a DeviceBuffer<f32>,
        weight: &'a DeviceBuffer<f32>,
        eps: f32,
    },
}

/// Whether one activation row against `w` can take `matvec_q8s_bulk` (it has a split copy).
pub fn q8s_applies(w: &DeviceMatrix) -> bool {
    w.split.is_some()
}

/// `parts[i].y = rms_norm(x, norm, eps) · W_iᵀ (+ bias_i)` for one row against up to three
/// Q8_0 matrices with split copies and one row length, in one launch whose blocks normalise and
/// quantize the row themselves (`matvec_q8s_bulk`): bit for bit `fused::rms_norm_quantized`
/// then [`matvec_many`]. Returns false, launching nothing, where that kernel does not apply.
pub fn rms_norm_matvec_q8s_many(
    dev: &CudaDevice,
    parts: &mut [MatvecPart],
    x: &DeviceBuffer<f32>,
    norm: &DeviceBuffer<f32>,
    eps: f32,
) -> Result<bool> {
    let Some((first, rest)) = one_launch_parts(parts) else {
        return Ok(false);
    };
    let epi = check_row_parts(first, rest)?;
    let acts = Q8sActs::Norm {
        x,
        weight: norm,
        eps,
    };
    matvec_q8s(dev, first.y, first.w, acts, epi, rest)
}

/// `y = rms_norm(x, norm, eps) · Wᵀ` for one row against one Q8_0 matrix with a split copy (an
/// output head), and `pick[0]` = the index of y's largest value (lowest on ties, NaN never), in
/// one launch (`matvec_q8p_pick`; rows of more than 1024 values since the twenty-third pass):
/// y bit for bit [`rms_norm_matvec_q8s_many`]'s, the pick [`argmax`]'s on that y, with no argmax
/// launch. Ok(false), launching nothing, where it does not apply (no split copy, another ring
/// than the default's).
pub fn rms_norm_matvec_pick(
    dev: &CudaDevice,
    y: &mut DeviceBuffer<f32>,
    w: &DeviceMatrix,
    x: &DeviceBuffer<f32>,
    norm: &DeviceBuffer<f32>,
    eps: f32,
    pick: &mut DeviceBuffer<i32>,
) -> Result<bool> {
    let Some(split) = w.split.as_ref() else {
        return Ok(false);
    };
    let k = w.cols;
    let shape = q8s_shape();
    if w.dtype != DType::Q8_0
        || k == 0
        || !k.is_multiple_of(32)
        || shape.stages != 1
        || shape.groups != 4
    {
        return Ok(false);
    }
    check("matvec_pick", x.len() == k && norm.len() == k, || {
        format!(
            "x {} and norm {} values for rows of {k}",
            x.len(),
            norm.len()
        )
    })?;
    check("matvec_pick", y.len() == w.rows && !pick.is_empty(), || {
        format!("y {} for {} rows, pick {}", y.len(), w.rows, pick.len())
    })?;
    let warps = shape.warps;
    let shared = q8s_shared_bytes(k, shape);
    let f = dev.function(
        "matvec",
        if q8s_quad_takes(k, warps * 32) {
            "matvec_q8s_pick_quad"
        } else {
            "matvec_q8p_pick"
        },
    )?;
    if shared > dev.max_shared_memory(&f)? {
        return Ok(false);
    }
    let blocks = w.rows.min(sm_count(dev) * (16 / warps).max(1)).max(1);
    let (r32, c32) = (
        i32_arg("matvec_pick", "rows", w.rows)?,
        i32_arg("matvec_pick", "cols", k)?,
    );
    let (mut pv, mut pi, counter) = argmax_scratch(dev, blocks)?;
    let mut l = Launch::new(dev, &f);
    l.arg(y)
        .arg(split)
        .arg(None::<&DeviceBuffer<u8>>)
        .arg(0i64)
        .arg(r32)
        .arg(c32)
        .arg(x)
        .arg(norm)
        .arg(eps)
        .arg(pick)
        .arg(&mut pv)
        .arg(&mut pi)
        .arg(counter);
    // SAFETY: as `matvec_q8s_bulk` with one matrix and the raw row (each block copies whole rows
    // of the split copy into its own shared memory, which `shared` covers, reads k values of x
    // and of the norm weight, writes one output per row it owns); then each block writes its
    // partial, counts itself in the device's zeroed counter (left at zero), and the last writes
    // pick[0].
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: ((warps * 32) as u32, 1, 1),
            shared_mem_bytes: shared as u32,
        })
    }?;
    Ok(true)
}

/// Dynamic shared memory of `matvec_q8s_bulk` / `matvec_q8p_pick` for rows of k values and
/// ring `s`, as kernels/matvec.cu lays it out: the ring, the activation quants and their f32
/// scales (padded to 16 bytes), one mbarrier a copy, a chunk's terms a warp (groups taken in
/// pairs).
fn q8s_shared_bytes(k: usize, s: Q8sShape) -> usize {
    s.warps * s.stages * s.groups * Q8S_GROUP_BYTES
        + k
        + (k / 32 * 4).next_multiple_of(16)
        + s.warps * s.stages * 8
        + s.warps * s.groups.next_multiple_of(2) * Q8S_GROUP_BLOCKS * 4
}

/// The ring of `matvec_q8s_bulk`: `stages` copies of `groups` × 544 bytes in flight per warp,
/// `warps` warps per block. `SYNAPTIX_Q8S=S,G[,W]` sets them (sweeps). By default one copy of
/// four groups for each of 32 warps (a 70 KB ring): on the H200, 7B Q8_0 tg128 (gate/up, down
/// and the head on this kernel) 335.0 / 335.1 → 339.9 / 339.8 (328.7 / 328.4 → 340.4 in another
/// machine session) against two copies of eight groups for 16 warps (139 KB); fewer warps with
/// the small copies lost (two copies of four groups for 16 warps 298.2, eight or twelve groups
/// for 24 warps 313-315).
#[derive(Debug, Clone, Copy)]
struct Q8sShape {
    stages: usize,
    groups: usize,
    warps: usize,
}

fn q8s_shape() -> Q8sShape {
    static SHAPE: std::sync::OnceLock<Q8sShape> = std::sync::OnceLock::new();
    const DEFAULT: Q8sShape = Q8sShape {
        stages: 1,
        groups: 4,
        warps: 32,
    };
    *SHAPE.get_or_init(|| {
        let v = std::env::var("SYNAPTIX_Q8S").unwrap_or_default();
        let n: Vec<usize> = v.split(',').filter_map(|s| s.trim().parse().ok()).collect();
        match n[..] {
            [stages, groups, ref rest @ ..] if stages >= 1 && groups >= 1 => Q8sShape {
                stages,
                groups,
                warps: rest.first().copied().unwrap_or(DEFAULT.warps).clamp(1, 32),
            },
            _ => DEFAULT,
        }
    })
}

/// Raw rows longer than this (and of at most four values a thread) take the split-copy kernels'
/// one-round prologue, `matvec_q8s_quad` / `matvec_q8s_pick_quad` (kernels/matvec.cu, Q8S_QUAD).
/// H200, tg128 7B Q8_0 (3584): 356.7 → 366.6; 1.5B's 1536 (20 of 32 warps idle) measured 813
/// against 817 with the rounds, so shorter rows keep them.
const Q8S_QUAD_MIN_K: usize = 2048;

/// Whether a raw row of k values, normalised by a block of `threads`, takes the one-round
/// prologue (the kernel checks the same and otherwise runs the rounds).
fn q8s_quad_takes(k: usize, threads: usize) -> bool {
    k > Q8S_QUAD_MIN_K && k <= 4 * threads
}

/// Launches of already-quantized rows that take `matvec_q8s_quad` too (its prologue then does
/// what `matvec_q8s_bulk`'s does), by row length: the two kernels differ only in the code the
/// compiler makes of the same loop, and on the H200 each ran some launches faster. tg128 7B
/// Q8_0 (O 3584, down 18944), the bulk kernel → the quad kernel for O: 362.5 → 363.7, for down:
/// 362.5 → 366.3, for both: 362.5 → 370.5; 1.5B Q8_0's down (8960): 810.0 → 774.6 (the
/// twenty-fourth pass's single kernel held both prologues and read 771); 0.5B's down (4864): even.
const Q8S_QUAD_QUANTIZED_ROWS: [(usize, usize); 2] = [(2049, 4096), (10000, usize::MAX)];

/// `SYNAPTIX_Q8S_QUAD_KERNEL=A-B` (an A/B switch): launches of quantized rows of A to B values
/// take the quad kernel instead of those of Q8S_QUAD_QUANTIZED_ROWS; `none`: none of them.
fn q8s_quad_quantized_rows() -> &'static [(usize, usize)] {
    static RANGE: std::sync::OnceLock<Option<Vec<(usize, usize)>>> = std::sync::OnceLock::new();
    let set = RANGE.get_or_init(|| {
        let v = std::env::var("SYNAPTIX_Q8S_QUAD_KERNEL").ok()?;
        if v == "none" {
            return Some(Vec::new());
        }
        let (a, b) = v.split_once('-')?;
        Some(vec![(a.trim().parse().ok()?, b.trim().parse().ok()?)])
    });
    set.as_deref().unwrap_or(&Q8S_QUAD_QUANTIZED_ROWS)
}

/// Whether a split-copy launch of rows of k values, with blocks of `threads`, takes
/// `matvec_q8s_quad`: raw rows its one-round prologue takes, and quantized rows of the lengths
/// `quantized_rows` lists.
fn q8s_quad_kernel(
    k: usize,
    threads: usize,
    raw_row: bool,
    quantized_rows: &[(usize, usize)],
) -> bool {
    if raw_row {
        q8s_quad_takes(k, threads)
    } else {
        quantized_rows.iter().any(|&(a, b)| (a..=b).contains(&k))
    }
}

/// Warps per block of a ring of whole rows (`q8s_whole`).
const Q8S_WHOLE_WARPS: usize = 16;

/// Which `matvec_q8s_bulk` launches take a ring of whole rows as deep as each warp's rows (16
/// warps a block), so that the whole matrix is requested before the PDL wait: by default those
/// of at most one row a warp; `SYNAPTIX_Q8S_WHOLE=all` any where it fits in shared memory (the
/// sixteenth pass's rule), `=0` none. The H200 ran 1.5B Q8_0's down projection (1536×8960: one
/// row of 9,792 bytes a warp, two copies of 4,352 in the default ring) faster that way: tg128
/// 730 → 743; with several rows a warp (7B's Q/K/V and O from split copies) the 32 warps of the
/// default ring ran faster (7B Q8_0 342.8 → 354.7).
#[derive(Clone, Copy, PartialEq)]
enum Q8sWhole {
    Never,
    OneRowPerWarp,
    WhereItFits,
}

fn q8s_whole() -> Q8sWhole {
    static RULE: std::sync::OnceLock<Q8sWhole> = std::sync::OnceLock::new();
    *RULE.get_or_init(|| match std::env::var("SYNAPTIX_Q8S_WHOLE").as_deref() {
        Ok("0") => Q8sWhole::Never,
        Ok("all") => Q8sWhole::WhereItFits,
        _ => Q8sWhole::OneRowPerWarp,
    })
}

/// One activation row against Q8_0 weights (and up to two more Q8_0 matrices of the same row
/// length, `more`) through `matvec_q8s_bulk`, from the matrices' split copies: the CPU's bits,
/// as the other Q8_0 kernels. Returns false, launching nothing, where a matrix has no split
/// copy or shared memory rules the kernel out; the caller then takes the other kernels.
fn matvec_q8s(
    dev: &CudaDevice,
    y: &mut DeviceBuffer<f32>,
    w: &DeviceMatrix,
    acts: Q8sActs,
    epi: Epilogue,
    more: &mut [MatvecPart],
) -> Result<bool> {
    let Some(split) = w.split.as_ref() else {
        return Ok(false);
    };
    let k = w.cols;
    let acts_fit = match acts {
        Q8sActs::Quantized(a) => a.rows == 1 && a.cols == k && a.dtype == DType::Q8_0,
        Q8sActs::Norm { x, weight, .. } => x.len() == k && weight.len() == k,
    };
    if !acts_fit
        || more
            .iter()
            .any(|p| p.w.split.is_none() || p.w.dtype != w.dtype || p.w.cols != k)
    {
        return Ok(false);
    }
    let shape = q8s_shape();
    let rows = w.rows + more.iter().map(|p| p.w.rows).sum::<usize>();
    let shared_of = |s: Q8sShape| q8s_shared_bytes(k, s);
    let quad = q8s_quad_kernel(
        k,
        shape.warps * 32,
        matches!(acts, Q8sActs::Norm { .. }),
        q8s_quad_quantized_rows(),
    );
    let f = dev.function(
        "matvec",
        if quad {
            "matvec_q8s_quad"
        } else {
            "matvec_q8s_bulk"
        },
    )?;
    let max_shared = dev.max_shared_memory(&f)?;
    let blocks_of = |s: Q8sShape| rows.min(sm_count(dev) * (16 / s.warps).max(1));
    // A ring of whole rows deep enough for every row of the warp where shared memory allows
    // (`q8s_whole`), the configured ring otherwise.
    let whole_rule = q8s_whole();
    let whole = {
        let warps = Q8S_WHOLE_WARPS.min(shape.warps);
        let rows_per_warp = rows.div_ceil(blocks_of(shape)).div_ceil(warps);
        let wanted = match whole_rule {
            Q8sWhole::Never => false,
            Q8sWhole::OneRowPerWarp => rows_per_warp <= 1,
            Q8sWhole::WhereItFits => true,
        };
        wanted.then_some(Q8sShape {
            stages: rows_per_warp.max(1),
            groups: (k / 32).div_ceil(Q8S_GROUP_BLOCKS),
            warps,
        })
    };
    let Q8sShape {
        stages,
        groups,
        warps,
    } = match whole {
        Some(s) if shared_of(s) <= max_shared => s,
        _ => {
            // A ring too large for this row length gives up stages, then groups.
            let mut s = shape;
            while shared_of(s) > max_shared && (s.stages > 1 || s.groups > 1) {
                if s.stages > 1 {
                    s.stages -= 1;
                } else {
                    s.groups = s.groups.div_ceil(2);
                }
            }
            s
        }
    };
    let chunk = groups * Q8S_GROUP_BYTES;
    let blocks = blocks_of(shape);
    let shared = shared_of(Q8sShape {
        stages,
        groups,
        warps,
    });
    if shared > max_shared {
        return Ok(false);
    }
    let (r32, c32) = (
        i32_arg("matvec", "rows", rows)?,
        i32_arg("matvec", "cols", k)?,
    );
    let (quantized, meta, x, norm, eps) = match acts {
        Q8sActs::Quantized(a) => (Some(&a.buf), a.meta_offset as i64, None, None, 0.0f32),
        Q8sActs::Norm { x, weight, eps } => (None, 0, Some(x), Some(weight), eps),
    };
    let mut l = Launch::new(dev, &f);
    l.arg(y)
        .arg(split)
        .arg(quantized)
        .arg(meta)
        .arg(r32)
        .arg(c32)
        .arg(stages as i32)
        .arg(chunk as i32);
    epilogue_args(&mut l, &epi);
    segment_args_of(&mut l, w.rows, more, |m| m.split.as_ref())?;
    l.arg(x).arg(norm).arg(eps);
    // SAFETY: each block copies whole rows of the launch's split copies (`q8s_row_bytes(k)` per
    // row, pieces of 16-byte multiples) into its own shared memory, which `shared` covers (the
    // ring, the activation row's quants and scales, the barriers, the terms); it reads one
    // activation row (checked: Q8_0 of k columns, or k values of x and of the norm weight) and
    // writes one output per row it owns.
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: ((warps * 32) as u32, 1, 1),
            shared_mem_bytes: shared as u32,
        })
    }?;
    Ok(true)
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
    let mut l = Launch::new(dev, &f);
    l.arg(y).arg(&w.data).arg(x).arg(r32).arg(c32);
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

// The KV cache and attention live in `attention.rs`.
pub use crate::attention::{
    attention, attention_flash, attention_quantized, attention_quantizes_inside, attention_rows,
    attention_single_block, attention_tiled, kv_store, rope_in_attention, rope_qk_store,
    rope_store_attention, short_max as attention_one_pass_max, AttentionParams, DeviceKv, NewRow,
    ATTN_SPAN, DECODE_ROWS, FLASH_MIN_ROWS, KV_PAGE,
};

/// A multi-block argmax's scratch (`argmax_blocks_end` in kernels/common.cuh): per-block best
/// values and indices, and the device's zeroed block counter.
fn argmax_scratch(
    dev: &CudaDevice,
    blocks: usize,
) -> Result<(DeviceBuffer<f32>, DeviceBuffer<i32>, &DeviceBuffer<u32>)> {
    // SAFETY: each block writes its own partial before the last block reads them all.
    let partials = unsafe { (dev.uninit::<f32>(blocks)?, dev.uninit::<i32>(blocks)?) };
    Ok((partials.0, partials.1, dev.block_counter()?))
}

/// Index of the largest value (lowest on ties), computed on the GPU.
pub fn argmax(dev: &CudaDevice, x: &DeviceBuffer<f32>, out: &mut DeviceBuffer<i32>) -> Result<()> {
    check("argmax", !x.is_empty() && !out.is_empty(), || {
        format!("{} values into {}", x.len(), out.len())
    })?;
    // Blocks of 256 threads over slices of at least 2048 values, at most 1024 blocks.
    let blocks = x.len().div_ceil(2048).clamp(1, 1024);
    let f = dev.function("sample", "argmax_blocks_f32")?;
    let n32 = i32_arg("argmax", "n", x.len())?;
    let (mut pv, mut pi, counter) = argmax_scratch(dev, blocks)?;
    let mut l = Launch::new(dev, &f);
    l.arg(out)
        .arg(x)
        .arg(n32)
        .arg(&mut pv)
        .arg(&mut pi)
        .arg(counter);
    // SAFETY: `blocks` blocks of 256 threads read x[0..n) in disjoint slices, write partial
    // [blockIdx] (of `blocks`), count themselves in the device's zeroed counter (left at zero),
    // and the last writes out[0].
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        })
    }?;
    Ok(())
}

#[cfg(test)]
mod q8s_rule_tests {
    use super::*;

    /// The one-round prologue's rule: 7B's 3584 and rows up to four values a thread of the
    /// default block (32 warps) take it; 1.5B's 1536, rows past 4096 and blocks too small for
    /// the row do not.
    #[test]
    fn quad_prologue_rows() {
        for k in [2080, 3584, 4096] {
            assert!(q8s_quad_takes(k, 1024), "{k} values");
        }
        for k in [896, 1536, 2048, 4128, 8960, 18944] {
            assert!(!q8s_quad_takes(k, 1024), "{k} values");
        }
        assert!(!q8s_quad_takes(3584, 512));
    }

    /// Which launches take the quad kernel by default: Qwen2.5 7B's all (raw Q/K/V and gate/up
    /// rows of 3584, O of 3584 and down of 18944 quantized), 1.5B's and 0.5B's none (raw rows of
    /// 1536 and 896; O of 1536 and 896, down of 8960 and 4864).
    #[test]
    fn quad_kernel_launches() {
        let rows = &Q8S_QUAD_QUANTIZED_ROWS;
        assert!(q8s_quad_kernel(3584, 1024, true, rows));
        assert!(q8s_quad_kernel(3584, 1024, false, rows));
        assert!(q8s_quad_kernel(18944, 1024, false, rows));
        for (k, raw) in [
            (1536, true),
            (896, true),
            (1536, false),
            (896, false),
            (8960, false),
            (4864, false),
        ] {
            assert!(
                !q8s_quad_kernel(k, 1024, raw, rows),
                "{k} values, raw {raw}"
            );
        }
        // A raw row too long for the prologue keeps the bulk kernel.
        assert!(!q8s_quad_kernel(18944, 1024, true, rows));
        assert!(!q8s_quad_kernel(3584, 1024, false, &[]));
    }
}

#[cfg(test)]
mod iq4_xs_layout_tests {
    use super::*;

    /// The GPU's IQ4_XS blocks of 32 mean what the stored super-blocks mean: every value
    /// `(d · (l - 32)) · T[code]` equals the CPU's dequantization, bit for bit, over random
    /// super-blocks (every 6-bit scale, both nibbles).
    #[test]
    fn blocks_of_32_dequantize_as_the_super_blocks() {
        const T: [i8; 16] = [
            -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
        ];
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut bytes = vec![0u8; 136 * 64];
        for b in bytes.iter_mut() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            *b = state as u8;
        }
        for sb in bytes.chunks_exact_mut(136) {
            sb[..2].copy_from_slice(&half::f16::from_f32(0.0123).to_le_bytes());
        }
        let mut want = vec![0f32; 256 * 64];
        synaptix_kernels_cpu::quant::dequantize(DType::IQ4XS, &bytes, &mut want).unwrap();
        let blocks = iq4_xs_blocks_of_32(&bytes);
        assert_eq!(blocks.len(), 64 * 8 * IQ4XS_GPU_BLOCK_BYTES);
        for (i, blk) in blocks.chunks_exact(IQ4XS_GPU_BLOCK_BYTES).enumerate() {
            let d = half::f16::from_le_bytes([blk[0], blk[1]]).to_f32();
            let scale = d * (blk[2] as i8) as f32;
            assert_eq!(blk[3], 0);
            for j in 0..32 {
                let q = blk[4 + j % 16];
                let code = if j < 16 { q & 15 } else { q >> 4 };
                let got = scale * T[code as usize] as f32;
                assert_eq!(
                    got.to_bits(),
                    want[32 * i + j].to_bits(),
                    "block {i} value {j}"
                );
            }
        }
    }
}
