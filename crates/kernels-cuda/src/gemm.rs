//! Tensor-core GEMM for prefill (many activation rows): `y: [m, rows] = x · Wᵀ` with `mma.sync`
//! (`kernels/gemm.cu`, sm_80+).
//!
//! - [`gemm_quantized`]: Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 weights times activations quantized by
//!   [`ops::quantize_acts`](crate::ops::quantize_acts). Bit for bit the CPU's `matmul` (and
//!   [`ops::matvec_quantized`](crate::ops::matvec_quantized)): the tensor cores compute each
//!   32-element block's exact integer dot product, and one thread per output adds the blocks'
//!   f32 terms (ggml's per-format formula and operation order) in increasing k from 0.0.
//! - [`gemm_float`]: F16 and BF16 weights, activations rounded to the weight's type (as the CPU
//!   rounds them), f16 / bf16 products accumulated in f32. Not bit-exact: the CPU sums in f64
//!   (normalised squared error ~1e-14).
//!
//! [`gemm_supported`] says which (format, m, k) these handle; the caller picks between them and
//! the matvec kernels ([`ops::matvec`](crate::ops::matvec)).

use cudarc::driver::{CudaFunction, LaunchConfig};
use synaptix_core::DType;

use crate::launch::Launch;
use crate::ops::{
    activation_format, check, i32_arg, sm_count, suffix, DeviceActs, DeviceMatrix, MatvecPart,
};
use crate::{CudaDevice, DeviceBuffer, Result};

/// The fewest activation rows for which [`gemm_supported`] recommends the GEMM (one 16-row mma
/// tile's worth; below it the matvec kernels, which pass over the weights 8 rows at a time, are
/// the better choice). The kernels themselves are correct for any m.
pub const GEMM_MIN_ROWS: usize = 16;

/// Shared-memory row of a staged tile: `GM_KSTEPS` (2) mma k steps of 32 bytes, plus 16 bytes
/// of padding (`GM_ROW` in kernels/gemm.cu).
const GM_KSTEPS: usize = 2;
const GM_ROW: usize = 32 * GM_KSTEPS + 16;
/// Ring stages of the quantized and float kernels (`GM_NSTAGE_Q`, `GM_NSTAGE_F`).
const NSTAGE_Q: usize = 3;
const NSTAGE_F: usize = 4;
/// Dynamic shared memory a block may use without opting in.
const DEFAULT_SHARED: usize = 48 * 1024;

/// A thread-block configuration: `bm` weight rows × `bn` activation rows of y per block.
#[derive(Debug, Clone, Copy)]
struct Tile {
    bm: usize,
    bn: usize,
    threads: u32,
    /// Kernel-name suffix.
    name: &'static str,
}

/// `gemm_q8_*_l`: 8 warps of 32 × 32, two blocks per SM; `_s`: 4 warps.
const Q_LARGE: Tile = Tile {
    bm: 128,
    bn: 64,
    threads: 256,
    name: "l",
};
const Q_SMALL: Tile = Tile {
    bm: 64,
    bn: 64,
    threads: 128,
    name: "s",
};
/// `gemm_{f16,bf16}_l`: 8 warps of 64 × 32; `_s`: 4 warps of 32 × 32.
const F_LARGE: Tile = Tile {
    bm: 128,
    bn: 128,
    threads: 256,
    name: "l",
};
const F_SMALL: Tile = Tile {
    bm: 64,
    bn: 64,
    threads: 128,
    name: "s",
};

fn is_legacy_quant(dtype: DType) -> bool {
    use DType::*;
    matches!(dtype, Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0)
}

fn is_half(dtype: DType) -> bool {
    matches!(dtype, DType::F16 | DType::BF16)
}

/// Whether [`gemm_quantized`] (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: `k` a multiple of 32) or
/// [`gemm_float`] (F16, BF16: `k` a multiple of 16) handles `m` activation rows of `k` values
/// with weights of `dtype`, and is worth it (`m >= GEMM_MIN_ROWS`). Everything else (other
/// formats, small m, odd k) stays with `ops::matvec`.
pub fn gemm_supported(dtype: DType, m: usize, k: usize) -> bool {
    let k_ok = if is_legacy_quant(dtype) {
        k.is_multiple_of(32)
    } else if is_half(dtype) {
        k.is_multiple_of(16)
    } else {
        return false;
    };
    k_ok && k > 0
        && m >= GEMM_MIN_ROWS
        && m.div_ceil(F_SMALL.bn.min(Q_SMALL.bn)) <= 65535
        && m.checked_mul(k).is_some_and(|n| n <= i32::MAX as usize)
}

/// Bytes of dynamic shared memory of `gemm_q8_*` for blocks of `block_bytes` (`gm_qlayout` in
/// kernels/gemm.cu): NSTAGE_Q ring slots of raw weights (per row the 16-byte words covering
/// GM_KSTEPS blocks from any 2-byte offset, + 16 bytes of slack), activation quants (GM_ROW per
/// row) and activation metadata (8 bytes per block); then the unpacked weights (GM_ROW per row)
/// and the f32 scales and minima of weights and activations.
fn q_shared_bytes(block_bytes: usize, t: Tile) -> usize {
    let raw = (GM_KSTEPS * block_bytes + 14).div_ceil(16) * 16;
    let slot = t.bm * raw + 16 + t.bn * GM_ROW + t.bn * GM_KSTEPS * 8;
    NSTAGE_Q * slot + t.bm * GM_ROW + 2 * GM_KSTEPS * 4 * (t.bm + t.bn)
}

/// Bytes of dynamic shared memory of `gemm_{f16,bf16}_*`: NSTAGE_F slots of (bm + bn) rows.
fn f_shared_bytes(t: Tile) -> usize {
    NSTAGE_F * (t.bm + t.bn) * GM_ROW
}

/// Which thread-block tile the kernels use. The choice never changes a result (each output is
/// computed the same way in every tile); it is exposed for tests and benchmarks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GemmTile {
    /// Large when its grid fills the GPU (a full wave of blocks), else small.
    #[default]
    Auto,
    /// Quantized: 128 weight rows × 64 activation rows per block; float: 128 × 128.
    Large,
    /// 64 × 64 (more blocks for small problems).
    Small,
    /// Hopper only: the float GEMM on warpgroup tensor cores (`kernels/gemm_wg.cu`) with this
    /// tile. `Auto` takes these on sm_90 cards for F16 / BF16 products.
    Wgmma(WgTile),
}

/// A thread-block tile of the wgmma float GEMM (`gemm_wg_{f16,bf16}_{name}`): weight rows ×
/// activation rows per block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WgTile {
    /// 128 × 256: two warpgroups, 3 stages (145 KiB of shared memory, one block per SM).
    W2N256,
    /// 128 × 128: two warpgroups, 4 stages (129 KiB, one block per SM).
    W2N128,
    /// 128 × 192: two warpgroups, 4 stages (161 KiB, one block per SM).
    W2N192,
    /// 192 × 128: three warpgroups, 4 stages (161 KiB, one block per SM).
    W3N128,
    /// 64 × 128: one warpgroup, 4 stages (97 KiB, two blocks per SM).
    W1N128,
    /// 64 × 64: one warpgroup, 4 stages (65 KiB, three blocks per SM).
    W1N64,
}

/// What the host needs of a [`WgTile`]: its shape, threads, ring stages, blocks resident per SM
/// (by shared memory), kernel-name suffix, and its relative rate (tensor-core work per unit of
/// time when the GPU is full, the fastest tile 1.0) for the tile choice.
struct WgSpec {
    bm: usize,
    bn: usize,
    threads: u32,
    nstage: usize,
    per_sm: usize,
    name: &'static str,
    rate: f64,
}

impl WgTile {
    /// Every tile, in the order the automatic choice prefers on equal estimates.
    pub const ALL: [WgTile; 6] = [
        WgTile::W3N128,
        WgTile::W2N128,
        WgTile::W2N192,
        WgTile::W2N256,
        WgTile::W1N128,
        WgTile::W1N64,
    ];

    fn spec(self) -> WgSpec {
        let (bm, bn, nstage, per_sm, name, rate) = match self {
            // Rates from cuda_gemm_bench on the H200 (m = 512, F16, TFLOPS on shapes whose
            // grid fills whole waves): w3n128 454, w2n128 437, w2n192 ~340, w1n128 ~330,
            // w1n64 ~270, w2n256 ~270.
            WgTile::W3N128 => (192, 128, 4, 1, "w3n128", 1.0),
            WgTile::W2N128 => (128, 128, 4, 1, "w2n128", 0.96),
            WgTile::W2N192 => (128, 192, 4, 1, "w2n192", 0.75),
            WgTile::W2N256 => (128, 256, 3, 1, "w2n256", 0.6),
            WgTile::W1N128 => (64, 128, 4, 2, "w1n128", 0.72),
            WgTile::W1N64 => (64, 64, 4, 3, "w1n64", 0.6),
        };
        WgSpec {
            bm,
            bn,
            threads: (bm / 64 * 128) as u32,
            nstage,
            per_sm,
            name,
            rate,
        }
    }

    /// Dynamic shared memory: `nstage` slots of (bm + bn) rows of 128 bytes, plus 1 KiB to
    /// align the slots to the 128-byte swizzle's 1 KiB period.
    fn shared_bytes(self) -> usize {
        let s = self.spec();
        s.nstage * (s.bm + s.bn) * 128 + 1024
    }

    fn name(self) -> &'static str {
        self.spec().name
    }

    /// The tile for matrices of `rows` weight rows (one launch) × `m` activation rows on `sms`
    /// SMs: the least estimated time of the busiest SM, its blocks × a block's work / (rate ×
    /// the share of the SM's tensor cores its resident warpgroups keep busy: two warpgroups
    /// fill them).
    fn pick(rows: &[usize], m: usize, sms: usize) -> WgTile {
        let cost = |t: WgTile| {
            let s = t.spec();
            let tiles: usize = rows.iter().map(|r| r.div_ceil(s.bm)).sum();
            let blocks = tiles * m.div_ceil(s.bn);
            let load = blocks.div_ceil(sms.max(1));
            let resident = load.min(s.per_sm);
            let busy = ((resident * s.bm / 64) as f64 / 2.0).min(1.0);
            load as f64 * (s.bm * s.bn) as f64 / (s.rate * busy)
        };
        let mut best = WgTile::ALL[0];
        for t in WgTile::ALL {
            if cost(t) < cost(best) {
                best = t;
            }
        }
        best
    }
}

/// Whether the float GEMM runs on wgmma here: a compute capability 9.0 card, unless
/// `SYNAPTIX_WGMMA=0`.
pub fn wgmma_available(dev: &CudaDevice) -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let off = *OFF.get_or_init(|| std::env::var("SYNAPTIX_WGMMA").as_deref() == Ok("0"));
    !off && dev.info.compute_capability == (9, 0)
}

/// `SYNAPTIX_WG_TILE=w2n128|w3n128|w2n192|w2n256|w1n128|w1n64` forces the wgmma tile (for
/// comparisons).
fn forced_wg_tile() -> Option<WgTile> {
    static FORCED: std::sync::OnceLock<Option<WgTile>> = std::sync::OnceLock::new();
    *FORCED.get_or_init(|| {
        let name = std::env::var("SYNAPTIX_WG_TILE").ok()?;
        WgTile::ALL.into_iter().find(|t| t.name() == name)
    })
}

/// The large tile when `choice` says so, or for `Auto` when its grid gives every SM at least
/// `per_sm` blocks, else the small one.
fn pick_tile(
    dev: &CudaDevice,
    choice: GemmTile,
    (large, small): (Tile, Tile),
    rows: usize,
    m: usize,
    per_sm: usize,
) -> Tile {
    static FORCED: std::sync::OnceLock<GemmTile> = std::sync::OnceLock::new();
    // `SYNAPTIX_GEMM_TILE=large|small` overrides the automatic choice (for comparisons).
    let forced = *FORCED.get_or_init(|| match std::env::var("SYNAPTIX_GEMM_TILE").as_deref() {
        Ok("large") => GemmTile::Large,
        Ok("small") => GemmTile::Small,
        _ => GemmTile::Auto,
    });
    let choice = if choice == GemmTile::Auto {
        forced
    } else {
        choice
    };
    match choice {
        GemmTile::Large => large,
        GemmTile::Small => small,
        GemmTile::Auto | GemmTile::Wgmma(_) => {
            let blocks = rows.div_ceil(large.bm) * m.div_ceil(large.bn);
            if blocks >= per_sm * sm_count(dev) {
                large
            } else {
                small
            }
        }
    }
}

/// Opts `f` into `bytes` of dynamic shared memory when that exceeds the default 48 KiB.
fn reserve_shared(dev: &CudaDevice, f: &CudaFunction, bytes: usize) -> Result<()> {
    if bytes <= DEFAULT_SHARED {
        return Ok(());
    }
    let limit = dev.max_shared_memory(f)?;
    check("gemm", bytes <= limit, || {
        format!("the kernel needs {bytes} bytes of shared memory, this GPU allows {limit}")
    })
}

/// The grid of `t` over `rows` weight rows and `m` activation rows (checked against the 65535
/// limit of grid.y).
fn grid(t: Tile, rows: usize, m: usize) -> Result<(u32, u32, u32)> {
    let (gx, gy) = (rows.div_ceil(t.bm), m.div_ceil(t.bn));
    check("gemm", gy <= 65535 && gx <= i32::MAX as usize, || {
        format!("{m} activation rows × {rows} weight rows exceed the grid")
    })?;
    Ok((gx as u32, gy as u32, 1))
}

/// The weight bytes `w` must hold for its shape, if representable.
fn weight_bytes(w: &DeviceMatrix) -> Option<usize> {
    w.rows
        .checked_mul(w.cols / w.dtype.block_len())?
        .checked_mul(w.dtype.block_bytes())
}

/// `y: [m, rows] = acts · Wᵀ` on the tensor cores, for Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 weights
/// and activations quantized for them by [`ops::quantize_acts`](crate::ops::quantize_acts) (m =
/// `acts.rows()`): every output bit for bit the CPU's `matmul` (and
/// [`ops::matvec_quantized`](crate::ops::matvec_quantized)). Correct for any m; meant for
/// m >= [`GEMM_MIN_ROWS`] (see [`gemm_supported`]).
pub fn gemm_quantized(
    dev: &CudaDevice,
    y: &mut DeviceBuffer<f32>,
    w: &DeviceMatrix,
    acts: &DeviceActs,
) -> Result<()> {
    gemm_quantized_with(dev, y, w, acts, GemmTile::Auto)
}

/// [`gemm_quantized`] with the thread-block tile chosen by the caller (same results).
pub fn gemm_quantized_with(
    dev: &CudaDevice,
    y: &mut DeviceBuffer<f32>,
    w: &DeviceMatrix,
    acts: &DeviceActs,
    tile: GemmTile,
) -> Result<()> {
    const OP: &str = "gemm";
    check(
        OP,
        is_legacy_quant(w.dtype)
            && activation_format(w.dtype) == Some(acts.dtype)
            && acts.cols == w.cols
            && w.cols > 0
            && w.cols.is_multiple_of(32),
        || {
            format!(
                "{} [{}, {}] weights, activations {} × {} (the GEMM takes Q4_0, Q4_1, Q5_0, \
                 Q5_1 and Q8_0 weights with their activation format)",
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
    let tile = pick_tile(dev, tile, (Q_LARGE, Q_SMALL), w.rows, m, 2);
    let grid_dim = grid(tile, w.rows, m)?;
    let f = dev.function(
        "gemm",
        &format!("gemm_q8_{}_{}", suffix(OP, w.dtype)?, tile.name),
    )?;
    let smem = q_shared_bytes(w.dtype.block_bytes(), tile);
    reserve_shared(dev, &f, smem)?;
    let meta = acts.meta_offset as i64;
    let mut l = Launch::new(dev, &f);
    l.arg(y)
        .arg(&w.data)
        .arg(&acts.buf)
        .arg(meta)
        .arg(r32)
        .arg(k32)
        .arg(m32);
    // SAFETY: shapes checked above: W holds `rows` rows of `cols / 32` blocks (its byte length
    // matches), the activation buffer `m` rows of `cols` quants with 8 bytes of metadata per
    // block at `meta_offset` (DeviceActs::new sized it for this format). The kernel reads only
    // inside those (weight copies are cut at the buffer's end, rows past `rows` / `m` are not
    // read) and writes y[i][r] for i < m, r < rows only; the dynamic shared memory is the
    // kernel's layout for this format and tile (`q_shared_bytes`), opted into above 48 KiB.
    unsafe {
        l.launch(LaunchConfig {
            grid_dim,
            block_dim: (tile.threads, 1, 1),
            shared_mem_bytes: smem as u32,
        })
    }?;
    Ok(())
}

/// `y: [m, rows] = x: [m, cols] · Wᵀ` on the tensor cores for F16 and BF16 weights (`cols` a
/// multiple of 16): x rounded to the weight's type into a scratch buffer (as the CPU rounds it),
/// then f16 / bf16 products accumulated in f32. Close to, not bit-equal with, the CPU's f64 sums.
pub fn gemm_float(
    dev: &CudaDevice,
    y: &mut DeviceBuffer<f32>,
    w: &DeviceMatrix,
    x: &DeviceBuffer<f32>,
) -> Result<()> {
    gemm_float_with(dev, y, w, x, GemmTile::Auto)
}

/// [`gemm_float`] with the thread-block tile chosen by the caller (same results: every output
/// accumulates the same mma steps in k order whatever the tile).
pub fn gemm_float_with(
    dev: &CudaDevice,
    y: &mut DeviceBuffer<f32>,
    w: &DeviceMatrix,
    x: &DeviceBuffer<f32>,
    tile: GemmTile,
) -> Result<()> {
    const OP: &str = "gemm";
    check(
        OP,
        is_half(w.dtype)
            && w.cols > 0
            && w.cols.is_multiple_of(16)
            && x.len().is_multiple_of(w.cols),
        || {
            format!(
                "{} [{}, {}] weights, x of {} values (the GEMM takes F16 and BF16 weights with \
                 rows of a multiple of 16)",
                w.dtype,
                w.rows,
                w.cols,
                x.len()
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
    let m = x.len() / w.cols;
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
    let (r32, k32, m32, n32) = (
        i32_arg(OP, "rows", w.rows)?,
        i32_arg(OP, "cols", w.cols)?,
        i32_arg(OP, "m", m)?,
        i32_arg(OP, "m × cols", x.len())?,
    );
    let name = suffix(OP, w.dtype)?;
    let xh = round_to_half(dev, name, x, n32)?;
    launch_half(dev, y, &w.data, name, (r32, k32, m32), &xh, tile)
}

/// `x` (`n` f32 values) rounded to `name`'s half type ("f16" or "bf16") as the CPU rounds them.
fn round_to_half(
    dev: &CudaDevice,
    name: &str,
    x: &DeviceBuffer<f32>,
    n: i32,
) -> Result<DeviceBuffer<u16>> {
    // SAFETY: gemm_round_* writes all `n` elements before anything reads them.
    let mut xh = unsafe { dev.uninit::<u16>(x.len()) }?;
    let round = dev.function("gemm", &format!("gemm_round_{name}"))?;
    let mut l = Launch::new(dev, &round);
    l.arg(&mut xh).arg(x).arg(n);
    // SAFETY: one thread per 4 elements of `x` and `xh` (both `n` long, n a multiple of 16);
    // threads past the end return.
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: ((x.len() / 4).div_ceil(256) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        })
    }?;
    Ok(xh)
}

/// Checks the parts of a multi-matrix GEMM: 1 to 3 matrices of one dtype and row length `k`,
/// each `y` holding `m × rows`, and a residual only with one matrix; returns m.
fn check_parts(
    parts: &[MatvecPart],
    k: usize,
    m_len: usize,
    residual: Option<&DeviceBuffer<f32>>,
) -> Result<usize> {
    const OP: &str = "gemm";
    check(OP, residual.is_none() || parts.len() == 1, || {
        "a residual with several matrices".to_string()
    })?;
    check(OP, (1..=3).contains(&parts.len()), || {
        format!("{} matrices in one launch (1 to 3)", parts.len())
    })?;
    let dtype = parts[0].w.dtype;
    for p in parts {
        check(
            OP,
            p.w.dtype == dtype
                && p.w.cols == k
                && weight_bytes(p.w).is_some_and(|b| b <= p.w.data.len())
                && m_len.checked_mul(p.w.rows) == Some(p.y.len())
                && p.bias.is_none_or(|b| b.len() == p.w.rows),
            || {
                format!(
                    "{} [{}, {}] weights in {} bytes, y {}, {m_len} activation rows of {k}",
                    p.w.dtype,
                    p.w.rows,
                    p.w.cols,
                    p.w.data.len(),
                    p.y.len()
                )
            },
        )?;
    }
    Ok(m_len)
}

/// `y_p: [m, rows_p] = x · W_pᵀ (+ bias_p)` for 1 to 3 F16 / BF16 matrices of one row length
/// (Q, K and V; gate and up): x rounded once, then on Hopper one wgmma launch for all of them
/// with the biases added in its epilogue; elsewhere a GEMM and a bias pass per matrix. Each
/// output is what [`gemm_float`] then a bias addition give.
pub fn gemm_float_many(
    dev: &CudaDevice,
    parts: &mut [MatvecPart],
    x: &DeviceBuffer<f32>,
) -> Result<()> {
    float_parts(dev, parts, x, None)
}

/// The parts of [`gemm_float_many`]; `residual` (one part only) is added to part 0.
fn float_parts(
    dev: &CudaDevice,
    parts: &mut [MatvecPart],
    x: &DeviceBuffer<f32>,
    residual: Option<&DeviceBuffer<f32>>,
) -> Result<()> {
    const OP: &str = "gemm";
    let Some(first) = parts.first() else {
        return Ok(());
    };
    let (dtype, k) = (first.w.dtype, first.w.cols);
    check(
        OP,
        is_half(dtype) && k > 0 && k.is_multiple_of(16) && x.len().is_multiple_of(k),
        || format!("{dtype} weights of {k} columns, x of {} values", x.len()),
    )?;
    let m = check_parts(parts, k, x.len() / k, residual)?;
    if m == 0 {
        return Ok(());
    }
    let (k32, m32, n32) = (
        i32_arg(OP, "cols", k)?,
        i32_arg(OP, "m", m)?,
        i32_arg(OP, "m × cols", x.len())?,
    );
    let name = suffix(OP, dtype)?;
    let xh = round_to_half(dev, name, x, n32)?;
    let mut halves: Vec<HalfPart<u8>> = parts
        .iter_mut()
        .map(|p| HalfPart {
            rows: p.w.rows,
            w: &p.w.data,
            y: &mut *p.y,
            bias: p.bias,
            residual,
        })
        .collect();
    launch_half_many(dev, &mut halves, name, (k32, m32), &xh)
}

/// [`gemm_float`] followed by `+ bias` and then `+ residual` (same shape as y), as separate
/// passes would add them; on Hopper in the GEMM's epilogue.
pub fn gemm_float_epilogue(
    dev: &CudaDevice,
    y: &mut DeviceBuffer<f32>,
    w: &DeviceMatrix,
    x: &DeviceBuffer<f32>,
    bias: Option<&DeviceBuffer<f32>>,
    residual: Option<&DeviceBuffer<f32>>,
) -> Result<()> {
    check_residual(residual, y.len())?;
    let mut part = [MatvecPart { w, y, bias }];
    float_parts(dev, &mut part, x, residual)
}

/// A residual, when given, has y's length.
fn check_residual(residual: Option<&DeviceBuffer<f32>>, y_len: usize) -> Result<()> {
    check("gemm", residual.is_none_or(|r| r.len() == y_len), || {
        format!(
            "residual of {} values for y of {y_len}",
            residual.map_or(0, |r| r.len())
        )
    })
}

/// One matrix of a multi-part half GEMM: `y: [m, rows] = xh · whᵀ (+ bias)`.
struct HalfPart<'a, W> {
    y: &'a mut DeviceBuffer<f32>,
    w: &'a DeviceBuffer<W>,
    rows: usize,
    bias: Option<&'a DeviceBuffer<f32>>,
    /// Added last (`y = residual + (product + bias)`), same shape as y.
    residual: Option<&'a DeviceBuffer<f32>>,
}

/// The parts on Hopper's wgmma kernels in one launch, else each on [`launch_half`] followed by
/// its bias.
fn launch_half_many<W>(
    dev: &CudaDevice,
    parts: &mut [HalfPart<W>],
    name: &str,
    (k32, m32): (i32, i32),
    xh: &DeviceBuffer<u16>,
) -> Result<()> {
    if wgmma_available(dev) {
        let rows: Vec<usize> = parts.iter().map(|p| p.rows).collect();
        let tile =
            forced_wg_tile().unwrap_or_else(|| WgTile::pick(&rows, m32 as usize, sm_count(dev)));
        return launch_wgmma(dev, parts, name, (k32, m32), xh, tile);
    }
    for p in parts.iter_mut() {
        let r32 = i32_arg("gemm", "rows", p.rows)?;
        match p.residual {
            None => {
                launch_half(dev, p.y, p.w, name, (r32, k32, m32), xh, GemmTile::Auto)?;
                if let Some(b) = p.bias {
                    crate::ops::add_bias(dev, p.y, b)?;
                }
            }
            Some(residual) => {
                // SAFETY: the GEMM writes every element of the scratch product.
                let mut prod = unsafe { dev.uninit::<f32>(p.y.len()) }?;
                launch_half(
                    dev,
                    &mut prod,
                    p.w,
                    name,
                    (r32, k32, m32),
                    xh,
                    GemmTile::Auto,
                )?;
                if let Some(b) = p.bias {
                    crate::ops::add_bias(dev, &mut prod, b)?;
                }
                crate::ops::add(dev, p.y, residual, &prod)?;
            }
        }
    }
    Ok(())
}

/// `y: [m, rows] = xh · whᵀ` with `gemm_{name}_*` (`name` "f16" or "bf16"): `wh` holds at
/// least `rows × k` halves, `xh` exactly `m × k`, `k` a multiple of 16, `y` `m × rows` (the
/// callers check all of it).
fn launch_half<W>(
    dev: &CudaDevice,
    y: &mut DeviceBuffer<f32>,
    wh: &DeviceBuffer<W>,
    name: &str,
    (r32, k32, m32): (i32, i32, i32),
    xh: &DeviceBuffer<u16>,
    tile: GemmTile,
) -> Result<()> {
    let (rows, m) = (r32 as usize, m32 as usize);
    let wg = match tile {
        GemmTile::Wgmma(t) => Some(t),
        GemmTile::Auto if wgmma_available(dev) => {
            Some(forced_wg_tile().unwrap_or_else(|| WgTile::pick(&[rows], m, sm_count(dev))))
        }
        _ => None,
    };
    if let Some(t) = wg {
        let mut part = [HalfPart {
            y,
            w: wh,
            rows,
            bias: None,
            residual: None,
        }];
        return launch_wgmma(dev, &mut part, name, (k32, m32), xh, t);
    }
    let tile = pick_tile(dev, tile, (F_LARGE, F_SMALL), rows, m, 1);
    let grid_dim = grid(tile, rows, m)?;
    let f = dev.function("gemm", &format!("gemm_{name}_{}", tile.name))?;
    let smem = f_shared_bytes(tile);
    reserve_shared(dev, &f, smem)?;
    let mut l = Launch::new(dev, &f);
    l.arg(y).arg(wh).arg(xh).arg(r32).arg(k32).arg(m32);
    // SAFETY: W holds `rows × cols` halves, `xh` `m × cols`, `cols` a multiple of 16 (checked
    // by the callers; every 16-byte copy stays inside a row; rows past `rows` / `m` are not
    // read); the kernel writes y[i][r] for i < m, r < rows only, and y holds m × rows. The
    // dynamic shared memory is the kernel's layout for this tile (`f_shared_bytes`), opted
    // into above 48 KiB.
    unsafe {
        l.launch(LaunchConfig {
            grid_dim,
            block_dim: (tile.threads, 1, 1),
            shared_mem_bytes: smem as u32,
        })
    }?;
    Ok(())
}

/// [`launch_half`] on the wgmma kernels (`gemm_wg_{name}_{tile}`, sm_90a) for 1 to 3 parts of
/// one row length `k` (their biases added in the epilogue): same contract per part.
fn launch_wgmma<W>(
    dev: &CudaDevice,
    parts: &mut [HalfPart<W>],
    name: &str,
    (k32, m32): (i32, i32),
    xh: &DeviceBuffer<u16>,
    tile: WgTile,
) -> Result<()> {
    check("gemm", dev.info.compute_capability == (9, 0), || {
        format!(
            "the wgmma GEMM needs a compute capability 9.0 GPU, this one is {}",
            dev.info.arch()
        )
    })?;
    check("gemm", (1..=3).contains(&parts.len()), || {
        format!("{} matrices in one launch (1 to 3)", parts.len())
    })?;
    let m = m32 as usize;
    let s = tile.spec();
    let gx: usize = parts.iter().map(|p| p.rows.div_ceil(s.bm)).sum();
    let gy = m.div_ceil(s.bn);
    check("gemm", gy <= 65535 && gx <= i32::MAX as usize, || {
        format!("{m} activation rows × {gx} row tiles exceed the grid")
    })?;
    if gx == 0 || m == 0 {
        return Ok(());
    }
    let rows32 = parts
        .iter()
        .map(|p| i32_arg("gemm", "rows", p.rows))
        .collect::<Result<Vec<i32>>>()?;
    let f = dev.function("gemm_wg", &format!("gemm_wg_{name}_{}", s.name))?;
    let smem = tile.shared_bytes();
    reserve_shared(dev, &f, smem)?;
    let mut l = Launch::new(dev, &f);
    let mut iter = parts.iter_mut().zip(rows32);
    for _ in 0..3 {
        match iter.next() {
            Some((p, r)) => {
                l.arg(&mut *p.y).arg(p.w).arg(p.bias).arg(p.residual).arg(r);
            }
            None => {
                l.arg(None::<&DeviceBuffer<f32>>)
                    .arg(None::<&DeviceBuffer<W>>)
                    .arg(None::<&DeviceBuffer<f32>>)
                    .arg(None::<&DeviceBuffer<f32>>)
                    .arg(0i32);
            }
        }
    }
    l.arg(xh).arg(k32).arg(m32);
    // SAFETY: each part's W holds `rows × cols` halves, `xh` `m × cols`, `cols` a multiple of
    // 16 (checked by the callers; every 16-byte copy lies inside a row; rows past a part's
    // `rows` or `m` and chunks past `cols` are zero-filled, not read); the kernel writes
    // y[i][r] for i < m, r < rows only and reads bias[r] for r < rows (a bias holds `rows`
    // values) and residual[i][r] at the same indices as y (a residual has y's shape, and does
    // not alias it: distinct borrows); absent parts have 0 rows and no blocks. The dynamic shared memory is the tile's
    // layout (`WgTile::shared_bytes`).
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: (gx as u32, gy as u32, 1),
            block_dim: (s.threads, 1, 1),
            shared_mem_bytes: smem as u32,
        })
    }?;
    Ok(())
}

/// The fewest activation rows for which [`dequant_gemm_supported`] recommends the f16 route for
/// quantized weights: below it, dequantizing the whole matrix costs more than it saves.
pub const DEQUANT_MIN_ROWS: usize = 64;

/// `SYNAPTIX_DEQUANT_GEMM=0` keeps every quantized prefill product on the exact integer GEMMs
/// (bit-equal with the CPU); otherwise quantized weights take the f16 route from
/// [`DEQUANT_MIN_ROWS`] rows. Measured on the H200 (pp512, t/s, f16 route vs exact): Qwen2.5
/// 0.5B Q8_0 52,691 vs 42,934, Q4_K_M 53,002 vs 47,112; 1.5B Q8_0 21,681 vs 17,757; 7B Q8_0
/// 7,087 vs 6,319, Q4_K_M 6,515 vs 4,869.
fn dequant_policy() -> bool {
    static EXACT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    !*EXACT.get_or_init(|| std::env::var("SYNAPTIX_DEQUANT_GEMM").as_deref() == Ok("0"))
}

/// Whether `m` activation rows of `k` values against quantized weights of `dtype` take
/// [`gemm_dequantized`]: `m >= DEQUANT_MIN_ROWS`, `k` a multiple of 16, a format the GPU reads,
/// and the policy of [`dequant_policy`].
pub fn dequant_gemm_supported(dtype: DType, m: usize, k: usize) -> bool {
    activation_format(dtype).is_some()
        && dequant_policy()
        && m >= DEQUANT_MIN_ROWS
        && k > 0
        && k.is_multiple_of(16)
        && m.div_ceil(F_SMALL.bn) <= 65535
        && m.checked_mul(k).is_some_and(|n| n <= i32::MAX as usize)
}

/// `y: [m, rows] = acts · Wᵀ` through f16 for quantized weights (any format the GPU reads):
/// W dequantized into a scratch matrix of halves, the activations' quantized values (as
/// [`ops::quantize_acts`](crate::ops::quantize_acts) left them, the CPU's own) expanded to
/// halves, then the f16 tensor-core GEMM with f32 sums. Not bit-equal with the CPU (each weight
/// and activation is rounded to f16 once, and the sums are f32 in another order); NMSE ~1e-7.
pub fn gemm_dequantized(
    dev: &CudaDevice,
    y: &mut DeviceBuffer<f32>,
    w: &DeviceMatrix,
    acts: &DeviceActs,
) -> Result<()> {
    let mut part = [MatvecPart { w, y, bias: None }];
    gemm_dequantized_many(dev, &mut part, acts)
}

/// [`gemm_dequantized`] for 1 to 3 matrices of one format and row length against the same
/// activations (Q, K and V; gate and up), biases added: the activations expanded to halves
/// once, each matrix dequantized, then one wgmma launch for all of them on Hopper (elsewhere a
/// GEMM and a bias pass per matrix).
pub fn gemm_dequantized_many(
    dev: &CudaDevice,
    parts: &mut [MatvecPart],
    acts: &DeviceActs,
) -> Result<()> {
    dequantized_parts(dev, parts, acts, None)
}

/// [`gemm_dequantized`] followed by `+ bias` and then `+ residual` (same shape as y), as
/// separate passes would add them; on Hopper in the GEMM's epilogue.
pub fn gemm_dequantized_epilogue(
    dev: &CudaDevice,
    y: &mut DeviceBuffer<f32>,
    w: &DeviceMatrix,
    acts: &DeviceActs,
    bias: Option<&DeviceBuffer<f32>>,
    residual: Option<&DeviceBuffer<f32>>,
) -> Result<()> {
    check_residual(residual, y.len())?;
    let mut part = [MatvecPart { w, y, bias }];
    dequantized_parts(dev, &mut part, acts, residual)
}

/// The parts of [`gemm_dequantized_many`]; `residual` (one part only) is added to part 0.
fn dequantized_parts(
    dev: &CudaDevice,
    parts: &mut [MatvecPart],
    acts: &DeviceActs,
    residual: Option<&DeviceBuffer<f32>>,
) -> Result<()> {
    const OP: &str = "gemm";
    let Some(first) = parts.first() else {
        return Ok(());
    };
    let (dtype, k, m) = (first.w.dtype, first.w.cols, acts.rows);
    check(
        OP,
        activation_format(dtype) == Some(acts.dtype)
            && acts.cols == k
            && k > 0
            && k.is_multiple_of(16)
            && k.is_multiple_of(dtype.block_len()),
        || {
            format!(
                "{dtype} weights of {k} columns, activations {} × {} ({})",
                acts.rows, acts.cols, acts.dtype
            )
        },
    )?;
    check_parts(parts, k, m, residual)?;
    if m == 0 {
        return Ok(());
    }
    let (k32, m32) = (i32_arg(OP, "cols", k)?, i32_arg(OP, "m", m)?);
    let n_acts = i32_arg(OP, "m × cols", m * k)?;
    let fmt = suffix(OP, dtype)?;
    let mut scratch = Vec::with_capacity(parts.len());
    for p in parts.iter() {
        scratch.push(dequantize_to_half(dev, p.w, fmt)?);
    }

    // SAFETY: gemm_acts_f16 writes all m × cols halves.
    let mut xh = unsafe { dev.uninit::<u16>(m * k) }?;
    let f = dev.function("gemm", "gemm_acts_f16")?;
    let block = acts.dtype.block_len() as i32;
    let f32_scale = i32::from(acts.dtype == DType::Q8K);
    let mut l = Launch::new(dev, &f);
    l.arg(&mut xh)
        .arg(&acts.buf)
        .arg(acts.meta_offset as i64)
        .arg(n_acts)
        .arg(block)
        .arg(f32_scale);
    // SAFETY: one thread per 8 activations (m × cols is a multiple of 8, threads past the end
    // return); the quants and per-block scales lie inside `acts.buf` by its construction for
    // m × cols values.
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: ((m * k / 8).div_ceil(256) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        })
    }?;
    let mut halves: Vec<HalfPart<u16>> = parts
        .iter_mut()
        .zip(&scratch)
        .map(|(p, wh)| HalfPart {
            rows: p.w.rows,
            w: wh,
            y: &mut *p.y,
            bias: p.bias,
            residual,
        })
        .collect();
    launch_half_many(dev, &mut halves, "f16", (k32, m32), &xh)
}

/// The weights of `w` (format suffix `fmt`) dequantized into a scratch matrix of halves.
fn dequantize_to_half(dev: &CudaDevice, w: &DeviceMatrix, fmt: &str) -> Result<DeviceBuffer<u16>> {
    const OP: &str = "gemm";
    let (r32, k32) = (i32_arg(OP, "rows", w.rows)?, i32_arg(OP, "cols", w.cols)?);
    let n_weights = w
        .rows
        .checked_mul(w.cols)
        .ok_or_else(|| crate::CudaError::Invalid {
            op: OP,
            detail: format!("[{}, {}] weights overflow", w.rows, w.cols),
        })?;
    // SAFETY: gemm_dequant_f16_* writes all rows × cols halves (grid-stride loop).
    let mut wh = unsafe { dev.uninit::<u16>(n_weights) }?;
    let f = dev.function("gemm", &format!("gemm_dequant_f16_{fmt}"))?;
    let mut l = Launch::new(dev, &f);
    l.arg(&mut wh).arg(&w.data).arg(r32).arg(k32);
    let blocks = n_weights.div_ceil(256).min(sm_count(dev) * 16);
    // SAFETY: the weights hold rows × cols / block_len blocks (checked by the callers); the
    // loop covers exactly rows × cols outputs.
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        })
    }?;
    Ok(wh)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn supported_shapes() {
        for dtype in [
            DType::Q4_0,
            DType::Q4_1,
            DType::Q5_0,
            DType::Q5_1,
            DType::Q8_0,
        ] {
            assert!(gemm_supported(dtype, 16, 896));
            assert!(gemm_supported(dtype, 4096, 32));
            assert!(!gemm_supported(dtype, 15, 896));
            assert!(!gemm_supported(dtype, 64, 48));
            assert!(!gemm_supported(dtype, 64, 0));
        }
        for dtype in [DType::F16, DType::BF16] {
            assert!(gemm_supported(dtype, 512, 48));
            assert!(!gemm_supported(dtype, 512, 40));
        }
        for dtype in [DType::F32, DType::Q4K, DType::Q6K] {
            assert!(!gemm_supported(dtype, 512, 4096));
        }
    }

    #[test]
    fn wgmma_tiles_fit_hopper_and_pick_the_measured_best() {
        for t in WgTile::ALL {
            let s = t.spec();
            // Per block at most 227 KiB; `per_sm` blocks within an SM's 228 KiB (1 KiB each
            // reserved by the driver).
            assert!(t.shared_bytes() <= 227 * 1024, "{t:?}");
            assert!(s.per_sm * (t.shared_bytes() + 1024) <= 228 * 1024, "{t:?}");
        }
        // The fastest tile cuda_gemm_bench measured on the H200 (132 SMs, m = 512): rows of
        // Qwen2.5 0.5B (896, 4864) and 7B (3584, 4608, 18944).
        for (rows, want) in [
            (896, WgTile::W1N64),
            (4864, WgTile::W3N128),
            (3584, WgTile::W2N128),
            (4608, WgTile::W3N128),
            (18944, WgTile::W3N128),
        ] {
            assert_eq!(WgTile::pick(&[rows], 512, 132), want, "{rows} rows");
        }
        // Q, K and V of 7B in one launch; gate and up.
        assert_eq!(WgTile::pick(&[3584, 512, 512], 512, 132), WgTile::W3N128);
        assert_eq!(WgTile::pick(&[18944, 18944], 512, 132), WgTile::W3N128);
    }

    #[test]
    fn shared_memory_fits_two_blocks_per_hopper_sm() {
        // The largest quantized layout (Q8_0, 34-byte blocks) and the float one: two blocks of
        // each fit the 228 KiB of an H100 / H200 SM, one fits the 99 KiB per block of sm_120.
        for t in [Q_LARGE, Q_SMALL] {
            for bytes in [18, 20, 22, 24, 34] {
                let b = q_shared_bytes(bytes, t);
                assert!(
                    b.is_multiple_of(16) && 2 * b <= 227 * 1024 && b <= 99 * 1024,
                    "{b}"
                );
            }
        }
        assert_eq!(q_shared_bytes(34, Q_LARGE), 68_656);
        for t in [F_LARGE, F_SMALL] {
            assert!(2 * f_shared_bytes(t) <= 227 * 1024);
        }
    }
}
