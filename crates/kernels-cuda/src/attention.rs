//! The paged f16 KV cache and causal attention over it (kernels/attention.cu), re-exported from
//! [`crate::ops`].
//!
//! Launch paths:
//! - prefill of [`FLASH_MIN_ROWS`] rows or more, head dimension 32, 64, 128 or 256:
//!   `attention_flash_hd*` on tensor cores (below); `SYNAPTIX_ATTENTION=exact` keeps the exact
//!   kernels for every prompt;
//! - prefill of fewer rows (more than [`DECODE_ROWS`]), head dimension 32, 64, 128 or 256:
//!   `attention_rows_f32`, one block per (row, head) computing the head in one pass with
//!   16-byte cache reads (the decode path's short-range code), while the scores fit its shared
//!   memory; other head dimensions: the single-block kernel below while the
//!   prompt's scores fit its shared memory; then (head dimension 16, 32, 64, 128 or 256)
//!   `attention_tiled_f32`, tiled like flash attention (16 query rows per block share each K/V
//!   tile; max, sum of exps and probabilities · V in three passes over the tiles) with the
//!   CPU's exact arithmetic (f64 sums of exact products): bit for bit `attention_f32`
//!   (`SYNAPTIX_ATTENTION=tiled` takes it for every prompt);
//! - `attention_flash_hd*` (`SYNAPTIX_ATTENTION=mma` for every prompt): two passes over the
//!   cache tiles on tensor cores (row max and exp sum; normalised f16 probabilities · V), f16
//!   products, f32 sums; within ~1e-10 of the exact kernels, not bit-equal. Taken for every
//!   prompt, it changed 5 of Gemma 3 270M's 10 greedy continuations (prompts of 10-40
//!   tokens), so short prompts keep the exact kernels; from 64 rows it is the default (the
//!   exact per-row kernel took 30% of a 7B F16 pp512);
//! - the single-block kernel `attention_f32`, one block per (head, row) holding every score
//!   in shared memory sized by the largest position: the reference the others are tested
//!   against;
//! - decode (at most [`DECODE_ROWS`] rows): two kernels split over spans of
//!   [`DeviceKv::decode_span`] positions (chosen per cache from its capacity) whose grids, shared
//!   memory and arguments depend only on the cache's shapes, so a decode step can be captured in
//!   a CUDA graph (the kernels read the positions on the device). Ranges of at most
//!   [`ATTN_SHORT`] positions are computed in one pass by one block per head of the second
//!   kernel (the first returns at once).

use cudarc::driver::LaunchConfig;

use synaptix_core::DType;

use crate::launch::Launch;
use crate::ops::{DeviceActs, RopeParams};
use crate::{CudaDevice, CudaError, DeviceBuffer, Result};

/// Positions per KV page (`KV_PAGE` in `kernels/attention.cu`).
pub const KV_PAGE: usize = 16;
/// The longest span of the decode kernels (`ATTN_MAX_SPAN` in `kernels/attention.cu`); see
/// [`decode_span`] for the span a cache gets.
pub const ATTN_SPAN: usize = 256;
/// The shortest span of the decode kernels (one KV page).
pub const ATTN_MIN_SPAN: usize = 16;
/// Spans a cache is cut into at most, below [`ATTN_SPAN`]-position spans: short contexts get
/// many blocks, while the scratch stays bounded for long caches.
const ATTN_TARGET_SPANS: usize = 64;
/// Attended positions up to which a decode step computes each head in one pass (see
/// `short_max`). On the H200, tg1024 (Qwen2.5 0.5B Q8_0 / 1.5B Q4_K_M) ran 910 / 481 t/s with
/// the split kernels only, 928 / 488 with 256, 930 / 474 with 512 and 861 / 412 with 1024.
pub const ATTN_SHORT: usize = 256;
/// The most `SYNAPTIX_ATTN_SHORT` may ask for: its scores then take 17 KiB of dynamic shared
/// memory, which with the kernel's 16 KiB reduction array stays within the 48 KiB a launch gets
/// without opting in.
const MAX_ATTN_SHORT: usize = 4096;
/// [`attention`] takes the decode path up to this many query rows.
pub const DECODE_ROWS: usize = 4;
/// Threads per block of the span kernels (`ATTN_THREADS`).
const ATTN_THREADS: u32 = 256;
/// The largest head dimension of the decode path (one thread per `d` in `attention_pv_f32`).
const DECODE_MAX_HEAD_DIM: usize = ATTN_THREADS as usize;

/// Query rows per block of the flash kernels (`FA_ROWS`), and their threads.
const FLASH_ROWS: usize = 64;
const FLASH_THREADS: u32 = 128;

/// The flash kernel for a head dimension, and its cache positions per tile.
fn flash_kernel(head_dim: usize) -> Option<(&'static str, usize)> {
    match head_dim {
        32 => Some(("attention_flash_hd32", 64)),
        64 => Some(("attention_flash_hd64", 64)),
        128 => Some(("attention_flash_hd128", 64)),
        256 => Some(("attention_flash_hd256", 32)),
        _ => None,
    }
}

/// From this many query rows, prefill attention takes the tensor-core kernel by default (where
/// it covers the head dimension); shorter prompts keep the exact kernels, whose cost is small
/// there. Measured on the H200 (pp512, Qwen2.5 7B F16): the exact per-row kernel took 30% of the
/// prefill (766 µs per layer).
pub const FLASH_MIN_ROWS: usize = 64;

/// The prefill kernel `SYNAPTIX_ATTENTION` asks for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum PrefillKernel {
    /// `Mma` from [`FLASH_MIN_ROWS`] rows, `Exact` below (the default).
    Auto,
    /// The per-row or single-block kernel while its scores fit in shared memory, then the tiled
    /// one (`exact`; all bit for bit the CPU's arithmetic).
    Exact,
    /// `attention_tiled_f32` always (`tiled`).
    Tiled,
    /// `attention_flash_hd*` on tensor cores (`mma`).
    Mma,
}

fn prefill_kernel() -> PrefillKernel {
    static CHOICE: std::sync::OnceLock<PrefillKernel> = std::sync::OnceLock::new();
    *CHOICE.get_or_init(|| match std::env::var("SYNAPTIX_ATTENTION").as_deref() {
        Ok("mma") => PrefillKernel::Mma,
        Ok("tiled") => PrefillKernel::Tiled,
        Ok("exact") => PrefillKernel::Exact,
        _ => PrefillKernel::Auto,
    })
}

/// Query rows and threads per block of `attention_tiled_f32`, and its positions per tile.
const TILED_ROWS: usize = 16;
const TILED_THREADS: u32 = 256;
const TILED_T: usize = 32;

/// Whether `attention_tiled_f32` covers a head dimension (one thread per `d` of a row group:
/// `head_dim` must divide its 256 threads, and 16 rows must split over the groups).
fn tiled_supported(head_dim: usize) -> bool {
    (16..=256).contains(&head_dim) && 256 % head_dim == 0
}

/// Threads per block of `kv_store_f32`.
const STORE_THREADS: u32 = 256;

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

/// The span length of the decode kernels for a cache of `capacity` positions: the power of two
/// nearest above `capacity / 64`, within 16..=256 (a multiple of the KV page, so also of the
/// aligned groups of four the softmax sums). Up to 1024 positions: 16-position spans (a short
/// context already spreads over several blocks per head); 32768 positions: 256 (128 spans).
pub fn decode_span(capacity: usize) -> usize {
    capacity
        .div_ceil(ATTN_TARGET_SPANS)
        .next_power_of_two()
        .clamp(ATTN_MIN_SPAN, ATTN_SPAN)
}

/// Scratch of the decode path, sized for a number of query heads and rows and then reused by
/// every step (fixed device pointers, nothing allocated per step). `n_spans = ceil(capacity /
/// span)`; shapes row-major:
/// - `scores`: f32 `[rows, n_heads, n_spans * span]`, the scaled `q·k`;
/// - `smax`: f32 `[rows, n_heads, n_spans]`, each span's max score;
/// - `stats`: f32 `[rows, n_heads, 2]`, the global max and `1 / sum of exps`;
/// - `partial`: f64 `[rows, n_heads, n_spans, head_dim]`, each span's share of probs · V;
/// - `tickets_scores`, `tickets_pv`: u32 `[rows, n_heads]`, the last-block counters of the two
///   kernels, zero between launches (the last block wraps its counter back to zero);
/// - `tickets_quant`: u32, one per Q8_K block of the output (at most `rows × n_heads`), the
///   counters of the heads sharing it when the output is quantized to Q8_K.
struct DecodeScratch {
    n_heads: usize,
    rows: usize,
    scores: DeviceBuffer<f32>,
    smax: DeviceBuffer<f32>,
    stats: DeviceBuffer<f32>,
    partial: DeviceBuffer<f64>,
    tickets_scores: DeviceBuffer<u32>,
    tickets_pv: DeviceBuffer<u32>,
    tickets_quant: DeviceBuffer<u32>,
}

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
    /// The decode path's scratch, allocated by the first decode step (or
    /// [`DeviceKv::reserve_decode`]) once the number of query heads is known.
    scratch: Option<DecodeScratch>,
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
            scratch: None,
        })
    }

    /// Positions per span of this cache's decode kernels ([`decode_span`] of the capacity).
    pub fn decode_span(&self) -> usize {
        decode_span(self.capacity)
    }

    /// Spans of [`DeviceKv::decode_span`] positions covering the capacity.
    fn n_spans(&self) -> usize {
        self.capacity.div_ceil(self.decode_span())
    }

    /// Bytes of decode scratch [`DeviceKv::reserve_decode`] allocates for `n_heads` query heads
    /// and `rows` query rows: `rows × n_heads × (n_spans × (span × 4 + 4 + head_dim × 8) + 20)`.
    pub fn decode_scratch_bytes(&self, n_heads: usize, rows: usize) -> usize {
        let (span, spans) = (self.decode_span(), self.n_spans());
        rows * n_heads * (spans * (span * 4 + 4 + self.head_dim * 8) + 2 * 4 + 3 * 4)
    }

    /// Allocates the decode path's scratch for `n_heads` query heads and up to `rows` query rows
    /// (at most [`DECODE_ROWS`]), unless it already has room. Call it before capturing a decode
    /// step in a CUDA graph, so that the capture allocates nothing. Memory:
    /// [`DeviceKv::decode_scratch_bytes`].
    pub fn reserve_decode(&mut self, dev: &CudaDevice, n_heads: usize, rows: usize) -> Result<()> {
        check("attention", (1..=DECODE_ROWS).contains(&rows), || {
            format!("decode scratch for {rows} rows (1..={DECODE_ROWS})")
        })?;
        let rows = match &self.scratch {
            Some(s) if s.n_heads == n_heads && s.rows >= rows => return Ok(()),
            Some(s) if s.n_heads == n_heads => rows.max(s.rows),
            _ => rows,
        };
        let heads = rows * n_heads;
        let spans = self.n_spans();
        // Zeroed once (not per step): the kernels write every entry they read, this only keeps
        // stale memory out of reach; the tickets must start at zero.
        self.scratch = Some(DecodeScratch {
            n_heads,
            rows,
            scores: dev.zeros(heads * spans * self.decode_span())?,
            smax: dev.zeros(heads * spans)?,
            stats: dev.zeros(heads * 2)?,
            partial: dev.zeros(heads * spans * self.head_dim)?,
            tickets_scores: dev.zeros(heads)?,
            tickets_pv: dev.zeros(heads)?,
            tickets_quant: dev.zeros(heads)?,
        });
        Ok(())
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
    let mut l = Launch::new(dev, &f);
    l.arg(&mut kv.k)
        .arg(&mut kv.v)
        .arg(k)
        .arg(v)
        .arg(&kv.block_table)
        .arg(positions)
        .arg(h)
        .arg(d);
    // SAFETY: positions are below the capacity (the caller's KV bookkeeping guarantees it).
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: (
                width.div_ceil(STORE_THREADS as usize) as u32,
                rows as u32,
                1,
            ),
            block_dim: (STORE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        })
    }?;
    Ok(())
}

/// `ops::rope_qk` of `q` (`p.n_heads` heads) and `k` (the cache's kv heads), then
/// [`kv_store`] of the rotated `k` and of `v` at `positions`, in one launch (same values as the
/// two ops). `q_scale` as for `ops::rope_qk` (it needs `n_rot == head_dim`).
#[allow(clippy::too_many_arguments)]
pub fn rope_qk_store(
    dev: &CudaDevice,
    q: &mut DeviceBuffer<f32>,
    k: &mut DeviceBuffer<f32>,
    v: &DeviceBuffer<f32>,
    kv: &mut DeviceKv,
    cos_sin: &DeviceBuffer<f32>,
    p: RopeParams,
    positions: &DeviceBuffer<i32>,
    q_scale: Option<f32>,
) -> Result<()> {
    let half = p.n_rot / 2;
    let rows = positions.len();
    let (qw, kw) = (p.n_heads * p.head_dim, kv.n_kv_heads * kv.head_dim);
    check(
        "rope_qk_store",
        p.head_dim == kv.head_dim
            && p.n_rot <= p.head_dim
            && p.n_rot.is_multiple_of(2)
            && half > 0
            && qw > 0
            && q.len() == rows * qw
            && k.len() == rows * kw
            && v.len() == rows * kw
            && cos_sin.len() == rows * half * 2
            && (q_scale.is_none() || p.n_rot == p.head_dim),
        || {
            format!(
                "q {} k {} v {} rows {rows} heads {}/{} head_dim {}/{} n_rot {} table {} scale {q_scale:?}",
                q.len(),
                k.len(),
                v.len(),
                p.n_heads,
                kv.n_kv_heads,
                p.head_dim,
                kv.head_dim,
                p.n_rot,
                cos_sin.len()
            )
        },
    )?;
    if rows == 0 {
        return Ok(());
    }
    let threads = (p.n_heads + kv.n_kv_heads) * half + kw;
    let f = dev.function("attention", "rope_qk_store_f32")?;
    let nq = i32_arg("rope_qk_store", "n_heads", p.n_heads)?;
    let nk = i32_arg("rope_qk_store", "n_kv_heads", kv.n_kv_heads)?;
    let hd = i32_arg("rope_qk_store", "head_dim", p.head_dim)?;
    let nr = i32_arg("rope_qk_store", "n_rot", p.n_rot)?;
    let neox = p.neox as i32;
    let (scale, use_scale) = (q_scale.unwrap_or(1.0), q_scale.is_some() as i32);
    let mut l = Launch::new(dev, &f);
    l.arg(q)
        .arg(k)
        .arg(v)
        .arg(&mut kv.k)
        .arg(&mut kv.v)
        .arg(cos_sin)
        .arg(&kv.block_table)
        .arg(positions)
        .arg(nq)
        .arg(nk)
        .arg(hd)
        .arg(nr)
        .arg(neox)
        .arg(scale)
        .arg(use_scale);
    // SAFETY: one thread per (head, pair) of the query then key heads of each row and per kv
    // element of each row, inside q, k, v and the table (checked above); positions are below
    // the capacity (the caller's KV bookkeeping guarantees it), so the cache writes land in
    // pages of the block table.
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: (
                threads.div_ceil(STORE_THREADS as usize) as u32,
                rows as u32,
                1,
            ),
            block_dim: (STORE_THREADS, 1, 1),
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
    /// The largest position in `positions`: checked against the capacity, and sizes the
    /// prefill kernel's score buffer (the decode path's launch does not depend on it).
    pub max_pos: usize,
}

/// Checks the shapes common to both paths.
fn check_attention(
    out: &DeviceBuffer<f32>,
    q: &DeviceBuffer<f32>,
    kv: &DeviceKv,
    rows: usize,
    p: &AttentionParams,
) -> Result<()> {
    let width = p.n_heads * kv.head_dim;
    check(
        "attention",
        q.len() == rows * width
            && out.len() == q.len()
            && kv.n_kv_heads > 0
            && p.n_heads > 0
            && p.n_heads.is_multiple_of(kv.n_kv_heads)
            && p.max_pos < kv.capacity,
        || {
            format!(
                "q {} out {} rows {rows} heads {}/{} max_pos {} capacity {}",
                q.len(),
                out.len(),
                p.n_heads,
                kv.n_kv_heads,
                p.max_pos,
                kv.capacity
            )
        },
    )
}

/// Dynamic shared memory of `attention_scores_f32` (head_dim query values, span scores, span /
/// KV_PAGE page numbers: at most 2.1 KiB) and of `attention_pv_f32` (span probabilities and page
/// numbers, or for the one-pass path head_dim query values and `short_max + 8` scores: 2.1 KiB
/// by default, at most 17 KiB).
fn decode_shared(span: usize, head_dim: usize, short_max: usize) -> (usize, usize) {
    let pages = span / KV_PAGE;
    let short = if short_max > 0 {
        (head_dim + short_max + 8) * 4
    } else {
        0
    };
    (
        (head_dim + span + pages) * 4,
        ((span + pages) * 4).max(short),
    )
}

/// Dynamic shared memory of `attention_one_pass_f32`: the one-pass floats (hd query values and
/// `stage_rows + 8` scores, rounded up to 16 bytes), then K and V rows `[stage_rows][hd]` f16.
fn one_pass_shared(head_dim: usize, stage_rows: usize) -> usize {
    (head_dim + stage_rows + 8).next_multiple_of(4) * 4 + 2 * stage_rows * head_dim * 2
}

/// The largest staging of `attention_one_pass_f32` (hd 128 at 256 positions: 130 KiB); larger
/// heads (Gemma 3's 256 at 256 positions) keep `attention_pv_f32`'s passes over global memory.
const ONE_PASS_MAX_SHARED: usize = 160 * 1024;

/// Whether one-pass decode steps stage K and V in shared memory (`attention_one_pass_f32`).
/// `SYNAPTIX_NO_STAGED_ATTN` set: never, for comparisons.
fn staged_attention() -> bool {
    static DISABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    !*DISABLED.get_or_init(|| std::env::var_os("SYNAPTIX_NO_STAGED_ATTN").is_some())
}

/// The one-pass decode kernel for a head dimension: for hd 64 and 128 the forms compiled for that
/// size (the head size a constant, so the index arithmetic has no divisions; same arithmetic
/// otherwise: tg128 on the H200 0.5B Q8_0 1,253 → 1,284, 1.5B Q8_0 716 → 730, 7B F16 221.7 →
/// 222.9); the general one for other sizes and with `SYNAPTIX_ATTN_HD=0`.
fn one_pass_kernel(head_dim: usize) -> &'static str {
    static PER_HD: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let per_hd = *PER_HD.get_or_init(|| std::env::var("SYNAPTIX_ATTN_HD").as_deref() != Ok("0"));
    match (per_hd, head_dim) {
        (true, 64) => "attention_one_pass_hd64_f32",
        (true, 128) => "attention_one_pass_hd128_f32",
        _ => "attention_one_pass_f32",
    }
}

/// The longest attended range the decode path computes in one pass, one block per head
/// (`attention_short` in kernels/attention.cu): `SYNAPTIX_ATTN_SHORT` positions (0: never),
/// by default [`ATTN_SHORT`]. Longer ranges take the split kernels. A decode step whose
/// `max_pos` is below it launches the one-pass kernel alone, so a recorded step is valid only
/// for positions on the same side of it (the step recorder keys its recordings by that side).
pub fn short_max() -> usize {
    static SHORT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *SHORT.get_or_init(|| {
        std::env::var("SYNAPTIX_ATTN_SHORT")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(ATTN_SHORT)
            .min(MAX_ATTN_SHORT)
    })
}

/// Attention of `q: [rows, n_heads * head_dim]` at `positions` over `kv` (already holding them).
///
/// Up to [`DECODE_ROWS`] rows take the decode path, whose launches depend only on the cache's
/// shapes, `n_heads`, `rows`, `scale` and `window` (graph-capturable; its scratch lives in `kv`,
/// allocated on the first decode step or by [`DeviceKv::reserve_decode`]). More rows, or shapes
/// the decode kernels do not cover (head_dim > 256, or more query heads per kv head than their
/// shared memory holds), take the single-block kernel. Both give the same values: the decode
/// path only regroups f64 additions.
///
/// The one-pass decode kernel starts copying cache rows below the smallest of `positions` before
/// the previous kernel has finished (programmatic dependent launch): the kernel launched just
/// before this call must not write those rows (the decode step's RoPE-and-store writes only the
/// rows at `positions`; uploads and earlier kernels are complete).
pub fn attention(
    dev: &CudaDevice,
    out: &mut DeviceBuffer<f32>,
    q: &DeviceBuffer<f32>,
    kv: &mut DeviceKv,
    positions: &DeviceBuffer<i32>,
    p: AttentionParams,
) -> Result<()> {
    let rows = positions.len();
    check_attention(out, q, kv, rows, &p)?;
    if rows == 0 {
        return Ok(());
    }
    if rows <= DECODE_ROWS && kv.head_dim <= DECODE_MAX_HEAD_DIM {
        return attention_decode(dev, out, None, q, kv, positions, p, None);
    }
    let tiled = tiled_supported(kv.head_dim);
    let choice = match prefill_kernel() {
        PrefillKernel::Auto if rows >= FLASH_MIN_ROWS => PrefillKernel::Mma,
        PrefillKernel::Auto => PrefillKernel::Exact,
        c => c,
    };
    match choice {
        PrefillKernel::Mma if flash_kernel(kv.head_dim).is_some() => {
            attention_flash(dev, out, q, kv, positions, p)
        }
        PrefillKernel::Tiled if tiled => attention_tiled(dev, out, q, kv, positions, p),
        PrefillKernel::Exact
            if rows_supported(kv.head_dim) && rows_fit(dev, kv.head_dim, p.max_pos)? =>
        {
            attention_rows(dev, out, q, kv, positions, p)
        }
        // The single-block kernel measured faster than the tiled one on the H200 (Qwen2.5 0.5B
        // F16 pp512: 30,112 vs 21,974 t/s; Q8_0 pp2048: 12,815 vs 10,209), so it serves every
        // prompt whose scores fit its shared memory; the tiled kernel has no such limit.
        _ if tiled && !single_block_fits(dev, kv.head_dim, p.max_pos)? => {
            attention_tiled(dev, out, q, kv, positions, p)
        }
        _ => attention_single_block(dev, out, q, kv, positions, p),
    }
}

/// Whether [`attention_quantized`] quantizes inside the attention launch for `acts` of
/// `n_heads` heads of `head_dim` and `rows` query rows (the decode path, Q8_0 / Q8_1 blocks
/// within a head); otherwise it quantizes in a launch of its own.
pub fn attention_quantizes_inside(head_dim: usize, rows: usize, act: DType) -> bool {
    let fits = match act {
        DType::Q8_0 | DType::Q8_1 => head_dim.is_multiple_of(32),
        // A Q8_K block holds 256 / head_dim heads.
        DType::Q8K => head_dim > 0 && 256 % head_dim == 0,
        _ => false,
    };
    rows <= DECODE_ROWS && head_dim <= DECODE_MAX_HEAD_DIM && fits
}

/// [`attention`], and `acts` = its output quantized for the output projection (bit for bit
/// `ops::quantize_acts` of it). The decode path quantizes each head's output in its last
/// launch where [`attention_quantizes_inside`] says so.
pub fn attention_quantized(
    dev: &CudaDevice,
    out: &mut DeviceBuffer<f32>,
    acts: &mut DeviceActs,
    q: &DeviceBuffer<f32>,
    kv: &mut DeviceKv,
    positions: &DeviceBuffer<i32>,
    p: AttentionParams,
) -> Result<()> {
    let rows = positions.len();
    check_attention(out, q, kv, rows, &p)?;
    check(
        "attention",
        acts.rows == rows && acts.cols == p.n_heads * kv.head_dim,
        || {
            format!(
                "activations [{}, {}] for {rows} rows of {} heads × {}",
                acts.rows, acts.cols, p.n_heads, kv.head_dim
            )
        },
    )?;
    if rows == 0 {
        return Ok(());
    }
    if attention_quantizes_inside(kv.head_dim, rows, acts.dtype) {
        return attention_decode(dev, out, Some(acts), q, kv, positions, p, None);
    }
    attention(dev, out, q, kv, positions, p)?;
    crate::ops::quantize_acts(dev, acts, out)
}

/// The decode step's new key and value for [`rope_store_attention`], before RoPE, and what
/// rotates them.
pub struct NewRow<'a> {
    /// `[1, n_kv_heads * head_dim]` keys, unrotated.
    pub k: &'a DeviceBuffer<f32>,
    /// `[1, n_kv_heads * head_dim]` values.
    pub v: &'a DeviceBuffer<f32>,
    /// Receives the rotated keys, as `rope_qk_store` leaves them in `k`.
    pub k_rot: &'a mut DeviceBuffer<f32>,
    /// The row's RoPE (cos, sin) table: `n_rot / 2` pairs.
    pub cos_sin: &'a DeviceBuffer<f32>,
    pub rope: RopeParams,
    pub q_scale: Option<f32>,
}

/// Whether the CUDA backend's decode steps take [`rope_store_attention`] where it applies (one
/// launch less per layer); `SYNAPTIX_ROPE_IN_ATTN=0` or `SYNAPTIX_NO_FUSION` keep RoPE + store
/// and attention apart.
pub fn rope_in_attention() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        std::env::var("SYNAPTIX_ROPE_IN_ATTN").as_deref() != Ok("0")
            && std::env::var_os("SYNAPTIX_NO_FUSION").is_none()
    })
}

/// [`rope_qk_store`] then [`attention`] (or [`attention_quantized`] with `acts`) in one launch
/// for one decode row, where the one-pass kernel applies (head dimension 32..256, every position
/// within the one-pass limit, K and V of the staged rows in shared memory): the kernel rotates
/// q in place and the new key, stores the new row in the cache and attends. Returns false,
/// launching nothing, where it does not apply; the caller then runs the two steps.
#[allow(clippy::too_many_arguments)]
pub fn rope_store_attention(
    dev: &CudaDevice,
    out: &mut DeviceBuffer<f32>,
    acts: Option<&mut DeviceActs>,
    q: &mut DeviceBuffer<f32>,
    new: NewRow,
    kv: &mut DeviceKv,
    positions: &DeviceBuffer<i32>,
    p: AttentionParams,
) -> Result<bool> {
    let rows = positions.len();
    let hd = kv.head_dim;
    if rows != 1
        || !matches!(hd, 32 | 64 | 128 | 256)
        || !staged_attention()
        || p.max_pos >= short_max()
    {
        return Ok(false);
    }
    check_attention(out, q, kv, rows, &p)?;
    let (r, half, kw) = (new.rope, new.rope.n_rot / 2, kv.n_kv_heads * hd);
    check(
        "rope_store_attention",
        r.head_dim == hd
            && r.n_heads == p.n_heads
            && r.n_rot <= hd
            && r.n_rot.is_multiple_of(2)
            && half > 0
            && new.k.len() == kw
            && new.v.len() == kw
            && new.k_rot.len() == kw
            && new.cos_sin.len() == half * 2
            && (new.q_scale.is_none() || r.n_rot == hd),
        || {
            format!(
                "k {} v {} k_rot {} table {} for {} kv heads × {hd}, n_rot {}, scale {:?}",
                new.k.len(),
                new.v.len(),
                new.k_rot.len(),
                new.cos_sin.len(),
                kv.n_kv_heads,
                r.n_rot,
                new.q_scale
            )
        },
    )?;
    if let Some(a) = acts.as_ref() {
        if !attention_quantizes_inside(hd, rows, a.dtype)
            || a.rows != rows
            || a.cols != p.n_heads * hd
        {
            return Ok(false);
        }
    }
    let f = dev.function("attention", one_pass_kernel(hd))?;
    let smem = one_pass_shared(hd, short_max().min(kv.capacity));
    if smem > ONE_PASS_MAX_SHARED || dev.max_shared_memory(&f)? < smem {
        return Ok(false);
    }
    attention_decode(dev, out, acts, q, kv, positions, p, Some(new))?;
    Ok(true)
}

/// Whether `attention_rows_f32` covers a head dimension (hd / 8 lanes per cache row, 4..=32).
fn rows_supported(head_dim: usize) -> bool {
    matches!(head_dim, 32 | 64 | 128 | 256)
}

/// Dynamic shared memory of `attention_rows_f32` up to `max_pos`: the f16-rounded query, then
/// the scores of the aligned groups of four holding the attended positions.
fn rows_shared(head_dim: usize, max_pos: usize) -> usize {
    (head_dim + max_pos + 8) * 4
}

/// Whether `attention_rows_f32` can hold the scores up to `max_pos` on this GPU.
fn rows_fit(dev: &CudaDevice, head_dim: usize, max_pos: usize) -> Result<bool> {
    let f = dev.function("attention", "attention_rows_f32")?;
    Ok(rows_shared(head_dim, max_pos) <= dev.max_shared_memory(&f)?)
}

/// [`attention`] with `attention_rows_f32` whatever the number of rows (head dimension 32, 64,
/// 128 or 256): one block per (row, head) computing the head in one pass over its positions,
/// as the decode path's short ranges do. Bit for bit [`attention_single_block`].
pub fn attention_rows(
    dev: &CudaDevice,
    out: &mut DeviceBuffer<f32>,
    q: &DeviceBuffer<f32>,
    kv: &DeviceKv,
    positions: &DeviceBuffer<i32>,
    p: AttentionParams,
) -> Result<()> {
    let rows = positions.len();
    check_attention(out, q, kv, rows, &p)?;
    let hd = kv.head_dim;
    check("attention", rows_supported(hd), || {
        format!("no one-pass kernel for head dimension {hd}")
    })?;
    if rows == 0 {
        return Ok(());
    }
    launch_prefill(
        dev,
        "attention_rows_f32",
        (rows_shared(hd, p.max_pos), 1, ATTN_THREADS),
        (out, q, kv, positions),
        p,
    )
}

/// Dynamic shared memory of `attention_f32` up to `max_pos`: the scores of positions
/// `0..=max_pos` rounded up to groups of four, then the f16-rounded query.
fn single_block_shared(head_dim: usize, max_pos: usize) -> usize {
    ((max_pos + 1).next_multiple_of(4) + head_dim) * 4
}

/// Whether `attention_f32` can hold the scores up to `max_pos` on this GPU.
fn single_block_fits(dev: &CudaDevice, head_dim: usize, max_pos: usize) -> Result<bool> {
    let f = dev.function("attention", "attention_f32")?;
    Ok(single_block_shared(head_dim, max_pos) <= dev.max_shared_memory(&f)?)
}

/// [`attention`] with the exact tiled kernel whatever the number of rows (head dimension 16,
/// 32, 64, 128 or 256): one block per 16 query rows and head, tiles of 32 cache positions from
/// the smallest first position to the largest position of the block's rows, visited three times
/// (row max, sum of exps, probabilities · V). Bit for bit [`attention_single_block`].
pub fn attention_tiled(
    dev: &CudaDevice,
    out: &mut DeviceBuffer<f32>,
    q: &DeviceBuffer<f32>,
    kv: &DeviceKv,
    positions: &DeviceBuffer<i32>,
    p: AttentionParams,
) -> Result<()> {
    let rows = positions.len();
    check_attention(out, q, kv, rows, &p)?;
    let hd = kv.head_dim;
    check("attention", tiled_supported(hd), || {
        format!("no tiled kernel for head dimension {hd}")
    })?;
    if rows == 0 {
        return Ok(());
    }
    // Q [16][hd] f64, K [32][hd + 1] f32, V [32][hd] f32, P [16][32] f32.
    let smem =
        TILED_ROWS * hd * 8 + TILED_T * (hd + 1) * 4 + TILED_T * hd * 4 + TILED_ROWS * TILED_T * 4;
    launch_prefill(
        dev,
        "attention_tiled_f32",
        (smem, TILED_ROWS, TILED_THREADS),
        (out, q, kv, positions),
        p,
    )
}

/// Launches a prefill kernel of `kernels/attention.cu` (parameters `out, q, k, v, table, pos,
/// rows, n_heads, n_kv_heads, hd, scale, window, capacity`) with one block of `threads` per
/// `rows_per_block` query rows and head and `smem` bytes of dynamic shared memory (opted into
/// above 48 KiB). The caller has checked the shapes.
fn launch_prefill(
    dev: &CudaDevice,
    name: &str,
    (smem, rows_per_block, threads): (usize, usize, u32),
    (out, q, kv, positions): (
        &mut DeviceBuffer<f32>,
        &DeviceBuffer<f32>,
        &DeviceKv,
        &DeviceBuffer<i32>,
    ),
    p: AttentionParams,
) -> Result<()> {
    let rows = positions.len();
    let f = dev.function("attention", name)?;
    // Static shared memory counts against the 48 KiB a launch gets without opting in.
    if smem + f.shared_size_bytes()? as usize > 48 * 1024 {
        let limit = dev.max_shared_memory(&f)?;
        check("attention", smem <= limit, || {
            format!("{name} needs {smem} bytes of shared memory, this GPU gives {limit}")
        })?;
    }
    let rows32 = i32_arg("attention", "rows", rows)?;
    let nh = i32_arg("attention", "n_heads", p.n_heads)?;
    let nkv = i32_arg("attention", "n_kv_heads", kv.n_kv_heads)?;
    let hd32 = i32_arg("attention", "head_dim", kv.head_dim)?;
    let cap = i32_arg("attention", "capacity", kv.capacity)?;
    let win = p.window.map_or(0, |w| w.min(i32::MAX as usize) as i32);
    let mut l = Launch::new(dev, &f);
    l.arg(out)
        .arg(q)
        .arg(&kv.k)
        .arg(&kv.v)
        .arg(&kv.block_table)
        .arg(positions)
        .arg(rows32)
        .arg(nh)
        .arg(nkv)
        .arg(hd32)
        .arg(p.scale)
        .arg(win)
        .arg(cap);
    // SAFETY: grid (ceil(rows / rows_per_block), n_heads) over q, out: [rows, n_heads, hd]
    // (checked by the caller, with a head dimension the kernel covers); the kernels read K and V
    // only at positions in [first, max position] of their rows, below the capacity (positions
    // outside it are skipped on the device), and the dynamic shared memory holds their staged
    // tiles, sized by the caller for this kernel.
    unsafe {
        l.launch(LaunchConfig {
            grid_dim: (rows.div_ceil(rows_per_block) as u32, p.n_heads as u32, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: smem as u32,
        })
    }?;
    Ok(())
}

/// The tensor-core variant of [`attention_tiled`] (`SYNAPTIX_ATTENTION=mma`), whatever the
/// number of rows (head dimension 32, 64, 128 or 256): one block per 64 query rows and head,
/// tiles of cache positions from the smallest first position to the largest position of the
/// block's rows, visited three times (row max, sum of exps, probabilities · V) so that the
/// probabilities are the CPU's, normalised and then rounded to f16. f16 products with f32 sums
/// on tensor cores: close to [`attention_single_block`], not bit-equal.
pub fn attention_flash(
    dev: &CudaDevice,
    out: &mut DeviceBuffer<f32>,
    q: &DeviceBuffer<f32>,
    kv: &DeviceKv,
    positions: &DeviceBuffer<i32>,
    p: AttentionParams,
) -> Result<()> {
    let rows = positions.len();
    check_attention(out, q, kv, rows, &p)?;
    let Some((name, tile)) = flash_kernel(kv.head_dim) else {
        return Err(CudaError::Invalid {
            op: "attention",
            detail: format!("no flash kernel for head dimension {}", kv.head_dim),
        });
    };
    if rows == 0 {
        return Ok(());
    }
    let hd = kv.head_dim;
    // Q [FLASH_ROWS][hd + 8], K [tile][hd + 8], Vᵀ [hd][tile + 8], halves.
    let smem = ((FLASH_ROWS + tile) * (hd + 8) + hd * (tile + 8)) * 2;
    launch_prefill(
        dev,
        name,
        (smem, FLASH_ROWS, FLASH_THREADS),
        (out, q, kv, positions),
        p,
    )
}

/// The decode path of [`attention`] (shapes already checked, `1 <= rows <= DECODE_ROWS`,
/// `head_dim <= DECODE_MAX_HEAD_DIM`; `acts`, when given, checked by
/// [`attention_quantized`]: Q8_0 or Q8_1 of `[rows, n_heads * head_dim]`, head_dim a
/// multiple of 32).
#[allow(clippy::too_many_arguments)]
fn attention_decode(
    dev: &CudaDevice,
    out: &mut DeviceBuffer<f32>,
    acts: Option<&mut DeviceActs>,
    q: &DeviceBuffer<f32>,
    kv: &mut DeviceKv,
    positions: &DeviceBuffer<i32>,
    p: AttentionParams,
    new: Option<NewRow>,
) -> Result<()> {
    let rows = positions.len();
    kv.reserve_decode(dev, p.n_heads, rows)?;
    let (n_heads, n_kv, hd) = (p.n_heads, kv.n_kv_heads, kv.head_dim);
    let (span, spans) = (kv.decode_span(), kv.n_spans());
    // The one-pass kernel reads 8 halves per lane, hd / 8 lanes per cache row (4..=32).
    let short = if matches!(hd, 32 | 64 | 128 | 256) {
        short_max()
    } else {
        0
    };
    let (scores_bytes, pv_bytes) = decode_shared(span, hd, short);
    let short32 = i32_arg("attention", "short range", short)?;
    let nh = i32_arg("attention", "n_heads", n_heads)?;
    let nkv = i32_arg("attention", "n_kv_heads", n_kv)?;
    let hd32 = i32_arg("attention", "head_dim", hd)?;
    let cap = i32_arg("attention", "capacity", kv.capacity)?;
    let sl = i32_arg("attention", "span", span)?;
    let ns = i32_arg("attention", "spans", spans)?;
    // Score indices reach rows × n_heads × spans × span (i64 in the kernels); the span positions
    // must fit an i32.
    i32_arg("attention", "span positions", spans * span)?;
    // 0: no window (as in the single-block kernel); a window beyond i32 covers any cache.
    let win = p.window.map_or(0, |w| w.min(i32::MAX as usize) as i32);
    let scale = p.scale;
    let Some(s) = kv.scratch.as_mut() else {
        return Err(CudaError::Invalid {
            op: "attention",
            detail: "decode scratch missing".into(),
        });
    };
    // The launches depend only on (capacity, n_heads, rows, head_dim) and on which side of
    // `short` max_pos lies: one block per (span, query head, row), whether or not the span holds
    // attended positions at this step.
    let span_grid = LaunchConfig {
        grid_dim: (spans as u32, n_heads as u32, rows as u32),
        block_dim: (ATTN_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };

    // Every row's range fits the one-pass kernel (range <= pos + 1 <= max_pos + 1): the scores
    // kernel would return at once, so it is not launched.
    let one_pass = short > 0 && p.max_pos < short;
    if !one_pass {
        let f = dev.function("attention", "attention_scores_f32")?;
        let mut l = Launch::new(dev, &f);
        l.arg(&mut s.scores)
            .arg(&mut s.smax)
            .arg(&mut s.stats)
            .arg(&mut s.tickets_scores)
            .arg(q)
            .arg(&kv.k)
            .arg(&kv.block_table)
            .arg(positions)
            .arg(nh)
            .arg(nkv)
            .arg(hd32)
            .arg(scale)
            .arg(win)
            .arg(cap)
            .arg(sl)
            .arg(ns)
            .arg(short32);
        // SAFETY: grid (spans, n_heads, rows) over q: [rows, n_heads, hd] and the scratch sized for
        // at least `rows` rows of n_heads heads × spans × span (stats: 2, tickets: 1 per head, zero
        // between launches); shared memory holds hd query values, span scores and span / KV_PAGE
        // page numbers (about 2 KiB); the kernel reads K only at positions in [first, pos[row]],
        // pos[row] < capacity (checked on the device), and the block table below the capacity.
        unsafe {
            l.launch(LaunchConfig {
                shared_mem_bytes: scores_bytes as u32,
                ..span_grid
            })
        }?;
    }

    let acts_format: i32 = match acts.as_ref().map(|a| a.dtype) {
        None => 0,
        Some(DType::Q8_1) => 2,
        Some(DType::Q8K) => 3,
        Some(_) => 1,
    };
    let acts_meta = acts.as_ref().map_or(0, |a| a.meta_offset as i64);
    let acts_bsums = acts.as_ref().map_or(0, |a| a.bsums_offset as i64);

    if one_pass && staged_attention() {
        let f = dev.function("attention", one_pass_kernel(hd))?;
        let stage_rows = short.min(kv.capacity);
        let smem = one_pass_shared(hd, stage_rows);
        // The kernel's static 16 KiB count against the default 48 KiB too: always opt in.
        if smem <= ONE_PASS_MAX_SHARED && dev.max_shared_memory(&f)? >= smem {
            let mut l = Launch::new(dev, &f);
            l.arg(out)
                .arg(q)
                .arg(&mut kv.k)
                .arg(&mut kv.v)
                .arg(&kv.block_table)
                .arg(positions)
                .arg(nh)
                .arg(nkv)
                .arg(hd32)
                .arg(win)
                .arg(cap)
                .arg(i32_arg("attention", "staged rows", stage_rows)?)
                .arg(scale)
                .arg(acts.map(|a| &mut a.buf))
                .arg(acts_meta)
                .arg(acts_bsums)
                .arg(acts_format)
                .arg(&mut s.tickets_quant);
            match new {
                Some(n) => {
                    l.arg(n.k)
                        .arg(n.v)
                        .arg(n.k_rot)
                        .arg(n.cos_sin)
                        .arg(i32_arg("attention", "n_rot", n.rope.n_rot)?)
                        .arg(n.rope.neox as i32)
                        .arg(n.q_scale.unwrap_or(1.0))
                        .arg(n.q_scale.is_some() as i32);
                }
                None => {
                    let none: Option<&DeviceBuffer<f32>> = None;
                    l.arg(none)
                        .arg(none)
                        .arg(None::<&mut DeviceBuffer<f32>>)
                        .arg(none)
                        .arg(0i32)
                        .arg(0i32)
                        .arg(1.0f32)
                        .arg(0i32);
                }
            }
            // With a new row: the query heads rotated in place (q is the caller's to change:
            // `rope_store_attention` holds it mutably), the new row read from k and v ([1, n_kv
            // × hd], checked there) and written at the row's position through the block table,
            // and the rotated keys into k_rot of the same shape.
            // SAFETY: grid (1, n_heads, rows), ATTN_THREADS threads, hd / 8 lanes per cache row
            // (hd in 32..=256, checked above); every row attends at most max_pos + 1 <= short
            // positions, all below the capacity, so at most stage_rows (the kernel checks it and
            // writes NaN otherwise); K and V are read at positions [first, pos[row]] through the
            // block table, copied into the dynamic shared memory sized by `one_pass_shared` (opted
            // into above when over the default); out[row, head, 0..hd] written, and with
            // activations the head's blocks of `acts` as in attention_pv_f32.
            unsafe {
                l.launch(LaunchConfig {
                    grid_dim: (1, n_heads as u32, rows as u32),
                    block_dim: (ATTN_THREADS, 1, 1),
                    shared_mem_bytes: smem as u32,
                })
            }?;
            return Ok(());
        }
    }
    if new.is_some() {
        return Err(CudaError::Invalid {
            op: "attention",
            detail: "the new row needs the one-pass kernel, which does not apply here".into(),
        });
    }

    let f = dev.function("attention", "attention_pv_f32")?;
    let mut l = Launch::new(dev, &f);
    l.arg(out)
        .arg(&mut s.partial)
        .arg(&mut s.tickets_pv)
        .arg(&s.scores)
        .arg(&s.stats)
        .arg(&kv.v)
        .arg(&kv.block_table)
        .arg(positions)
        .arg(nh)
        .arg(nkv)
        .arg(hd32)
        .arg(win)
        .arg(cap)
        .arg(sl)
        .arg(ns);
    l.arg(acts.map(|a| &mut a.buf))
        .arg(acts_meta)
        .arg(acts_bsums)
        .arg(acts_format)
        .arg(&mut s.tickets_quant)
        .arg(q)
        .arg(&kv.k)
        .arg(scale)
        .arg(short32);
    // SAFETY: same grid, ATTN_THREADS threads (the kernel's reduction array) and hd <=
    // ATTN_THREADS (checked by `attention`); reads what the previous launch wrote for spans
    // [lo, hi] and V at positions [first, pos[row]]; writes hd f64 per (row, head, span) into
    // `partial` (rows × n_heads × spans × hd) and out[row, head, 0..hd] (out: [rows, n_heads, hd],
    // checked); shared memory holds span probabilities and page numbers, or for a range of at
    // most `short` positions (one block per head reads q, K and V at positions [first,
    // pos[row]]) hd + short + 8 floats. With activations, the block that writes a head's output
    // quantizes its hd / 32 blocks of out into their slots of `acts`.
    unsafe {
        l.launch(LaunchConfig {
            shared_mem_bytes: pv_bytes as u32,
            ..span_grid
        })
    }?;
    Ok(())
}

/// [`attention`] with the single-block kernel whatever the number of rows: one block per
/// (head, row) holding the scores of positions `0..=max_pos` in shared memory (so the launch
/// follows `max_pos`). The prefill path, and the reference the decode path is tested against.
pub fn attention_single_block(
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
    check_attention(out, q, kv, rows, &p)?;
    if rows == 0 {
        return Ok(());
    }
    let smem = single_block_shared(kv.head_dim, max_pos) as u32;
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
    let mut l = Launch::new(dev, &f);
    l.arg(out)
        .arg(q)
        .arg(&kv.k)
        .arg(&kv.v)
        .arg(&kv.block_table)
        .arg(positions)
        .arg(nh)
        .arg(nkv)
        .arg(hd)
        .arg(scale)
        .arg(win);
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
