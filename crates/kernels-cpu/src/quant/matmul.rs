//! `y = x · Wᵀ` for a quantized (or float) weight matrix W.

use rayon::prelude::*;
use synaptix_core::{DType, Error, Result};

use super::{checked_kernels, quantize_acts_on, Kernels, QuantizedActs};
use crate::cpu::{path, Path};

/// A row-major weight matrix of `rows` (n, output features) × `cols` (k, input features) stored
/// in `dtype`: each row is `cols / dtype.block_len()` consecutive blocks, rows are contiguous.
#[derive(Debug, Clone, Copy)]
pub struct WeightView<'a> {
    pub dtype: DType,
    pub data: &'a [u8],
    pub rows: usize,
    pub cols: usize,
}

/// Below this many weight bytes × activation rows the matmul runs on the calling thread: the
/// work would not repay rayon's scheduling.
const SERIAL_WORK_BYTES: usize = 96 * 1024;

/// Activation rows processed together against each weight row when m > 1, so the rows' quants
/// (up to `TILE_M * k` bytes) stay in cache while a chunk of weight rows streams through.
const TILE_M: usize = 32;

/// `y[m×n] = x[m×k] · Wᵀ` where `W` is `w` (n×k). Each row of `x` is quantized once to the
/// activation format of `w.dtype` ([`quantize_acts`](super::quantize_acts)), and every output is
/// exactly [`vec_dot`](super::vec_dot) of its weight row and activation row, i.e. bit-identical
/// with ggml's portable build whatever the thread count. Output rows are split into chunks over
/// the ambient rayon pool, and within a chunk every weight row is read (and its blocks unpacked)
/// once per tile of up to 32 `x` rows.
///
/// Errors: unsupported weight type, `w.data` not `rows` rows of `cols` elements, `x.len() !=
/// m * cols`, `y.len() != m * rows`, or `cols` not a multiple of the block length.
pub fn matmul(w: WeightView, x: &[f32], m: usize, y: &mut [f32]) -> Result<()> {
    matmul_on(path(), w, x, m, y)
}

/// [`matmul`] with the kernels for `path` (which the CPU must support).
pub(crate) fn matmul_on(
    path: Path,
    w: WeightView,
    x: &[f32],
    m: usize,
    y: &mut [f32],
) -> Result<()> {
    const OP: &str = "matmul";
    let (n, k) = (w.rows, w.cols);
    let row_bytes = checked_row_bytes(OP, &w)?;
    let mismatch = |detail: String| Error::ShapeMismatch { op: OP, detail };
    if m.checked_mul(k) != Some(x.len()) {
        return Err(mismatch(format!(
            "x has {} values, expected {m}×{k}",
            x.len()
        )));
    }
    if m.checked_mul(n) != Some(y.len()) {
        return Err(mismatch(format!(
            "y has {} values, expected {m}×{n}",
            y.len()
        )));
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        y.fill(0.0);
        return Ok(());
    }

    let parallel = is_parallel(w.data.len(), m);
    let acts: Vec<QuantizedActs> = if parallel && m > 1 {
        x.par_chunks(k)
            .map(|r| quantize_acts_on(path, w.dtype, r))
            .collect::<Result<_>>()?
    } else {
        x.chunks(k)
            .map(|r| quantize_acts_on(path, w.dtype, r))
            .collect::<Result<_>>()?
    };
    run(OP, path, w, row_bytes, &acts, y)
}

/// [`matmul`] with activation rows already quantized by [`quantize_acts`](super::quantize_acts)
/// for `w.dtype` (`acts.len()` = m), so one quantization can serve several weight matrices that
/// read the same input (e.g. Q/K/V or gate/up projections of the same type).
pub fn matmul_quantized(w: WeightView, acts: &[QuantizedActs], y: &mut [f32]) -> Result<()> {
    matmul_quantized_on(path(), w, acts, y)
}

/// [`matmul_quantized`] with the kernels for `path` (which the CPU must support).
pub(crate) fn matmul_quantized_on(
    path: Path,
    w: WeightView,
    acts: &[QuantizedActs],
    y: &mut [f32],
) -> Result<()> {
    const OP: &str = "matmul_quantized";
    let (n, k, m) = (w.rows, w.cols, acts.len());
    let row_bytes = checked_row_bytes(OP, &w)?;
    let mismatch = |detail: String| Error::ShapeMismatch { op: OP, detail };
    if let Some(a) = acts.iter().find(|a| a.len() != k) {
        return Err(mismatch(format!(
            "activation row of {} values, expected {k}",
            a.len()
        )));
    }
    if m.checked_mul(n) != Some(y.len()) {
        return Err(mismatch(format!(
            "y has {} values, expected {m}×{n}",
            y.len()
        )));
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    run(OP, path, w, row_bytes, acts, y)
}

/// Several products of the same input, `ys[i][m×n_i] = x[m×k] · W_iᵀ` (the Q/K/V or gate/up
/// projections of a layer): each output exactly what [`matmul`] gives for its matrix. `x` is
/// quantized once per activation format the matrices need (once in all when they share it). For
/// one activation row (decode), all matrices' rows run in one parallel region instead of one per
/// matrix, which saves a fork-join of the thread pool (and often a wake-up) per matrix.
///
/// Errors: as [`matmul`] for any matrix, or `ys.len() != ws.len()`.
pub fn matmul_many(ws: &[WeightView], x: &[f32], m: usize, ys: &mut [&mut [f32]]) -> Result<()> {
    matmul_many_on(path(), ws, x, m, ys)
}

/// [`matmul_many`] with the kernels for `path` (which the CPU must support).
pub(crate) fn matmul_many_on(
    path: Path,
    ws: &[WeightView],
    x: &[f32],
    m: usize,
    ys: &mut [&mut [f32]],
) -> Result<()> {
    const OP: &str = "matmul_many";
    let mismatch = |detail: String| Error::ShapeMismatch { op: OP, detail };
    if ws.len() != ys.len() {
        return Err(mismatch(format!(
            "{} matrices, {} outputs",
            ws.len(),
            ys.len()
        )));
    }
    // Quantized inputs, one set per activation format, and each matrix's row bytes.
    let mut acts_by_format: Vec<(DType, Vec<QuantizedActs>)> = Vec::new();
    let mut row_bytes = Vec::with_capacity(ws.len());
    for (w, y) in ws.iter().zip(ys.iter()) {
        let (n, k) = (w.rows, w.cols);
        row_bytes.push(checked_row_bytes(OP, w)?);
        if m.checked_mul(k) != Some(x.len()) || m.checked_mul(n) != Some(y.len()) {
            return Err(mismatch(format!(
                "x has {} values and y {} for {m} rows of [{n}, {k}]",
                x.len(),
                y.len()
            )));
        }
        let format = super::activation_dtype(w.dtype)?;
        if k > 0 && !acts_by_format.iter().any(|(f, _)| *f == format) {
            let quantize = |r: &[f32]| quantize_acts_on(path, w.dtype, r);
            let acts = if m > 1 && is_parallel(w.data.len(), m) {
                x.par_chunks(k).map(quantize).collect::<Result<Vec<_>>>()?
            } else {
                x.chunks(k).map(quantize).collect::<Result<Vec<_>>>()?
            };
            acts_by_format.push((format, acts));
        }
    }
    if m == 0 {
        return Ok(());
    }
    let acts_for = |w: &WeightView| -> Result<&[QuantizedActs]> {
        let format = super::activation_dtype(w.dtype)?;
        Ok(acts_by_format
            .iter()
            .find(|(f, _)| *f == format)
            .map_or(&[][..], |(_, a)| a.as_slice()))
    };
    let total_bytes: usize = ws.iter().map(|w| w.data.len()).sum();
    // Decode: every matrix's rows in one job of the team; otherwise each product on its own.
    let one_region = m == 1 && is_parallel(total_bytes, 1);
    let mut jobs: Vec<(RowJob, &mut [f32])> = Vec::new();
    for ((w, y), &rb) in ws.iter().zip(ys.iter_mut()).zip(&row_bytes) {
        if w.rows == 0 {
            continue;
        }
        if w.cols == 0 {
            y.fill(0.0);
            continue;
        }
        let acts = acts_for(w)?;
        if !one_region {
            run(OP, path, *w, rb, acts, y)?;
            continue;
        }
        let kernels = checked_kernels(OP, path, w.dtype, rb, &acts[0])?;
        let job = RowJob {
            kernels,
            data: w.data,
            row_bytes: rb,
            acts,
        };
        jobs.push((job, &mut **y));
    }
    if !jobs.is_empty() {
        run_on_team(&mut jobs);
    }
    Ok(())
}

/// An output pointer the team's threads write disjoint ranges of.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: each team thread writes only its own rows' outputs (see `run_on_team`).
unsafe impl Sync for OutPtr {}
unsafe impl Send for OutPtr {}

/// One activation row against each job's matrix, on the decode team: thread `t` of `T` takes
/// rows `[t·p, (t+1)·p)` of every matrix, `p = ceil(n / T)` rounded up to [`ROW_ALIGN`]. Each
/// output is still exactly its row's dot, so the split never changes a value.
fn run_on_team(jobs: &mut [(RowJob, &mut [f32])]) {
    let team = crate::team::team();
    let threads = team.threads();
    let outs: Vec<(RowJob, OutPtr, usize)> = jobs
        .iter_mut()
        .map(|(job, y)| (*job, OutPtr(y.as_mut_ptr()), y.len()))
        .collect();
    team.run(&|t| {
        for &(job, out, n) in &outs {
            let per = n.div_ceil(threads).next_multiple_of(ROW_ALIGN);
            let r0 = t * per;
            if r0 >= n {
                continue;
            }
            let rows = per.min(n - r0);
            // SAFETY: `out` points at `n` outputs borrowed mutably by the caller for this call;
            // the ranges [r0, r0 + rows) of different `t` are disjoint.
            let ys = unsafe { std::slice::from_raw_parts_mut(out.0.add(r0), rows) };
            job.rows(r0, ys);
        }
    });
}

/// Bytes per weight row, after checking `w.data` holds exactly `rows` such rows.
fn checked_row_bytes(op: &'static str, w: &WeightView) -> Result<usize> {
    let (n, k) = (w.rows, w.cols);
    let row_bytes = w
        .dtype
        .bytes_for(k as u64)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| Error::ShapeMismatch {
            op,
            detail: format!("{k} columns is not a whole number of {} blocks", w.dtype),
        })?;
    if n.checked_mul(row_bytes) != Some(w.data.len()) {
        return Err(Error::ShapeMismatch {
            op,
            detail: format!(
                "{n}×{k} {} weights need {n}×{row_bytes} bytes, got {}",
                w.dtype,
                w.data.len()
            ),
        });
    }
    Ok(row_bytes)
}

fn is_parallel(weight_bytes: usize, m: usize) -> bool {
    rayon::current_num_threads() > 1 && weight_bytes.saturating_mul(m) >= SERIAL_WORK_BYTES
}

/// Weight rows per parallel chunk are rounded up to a multiple of this (the row-group size of
/// the multi-row kernels).
const ROW_ALIGN: usize = 16;

/// The shared body: shapes are valid and `acts` is non-empty.
fn run(
    op: &'static str,
    path: Path,
    w: WeightView,
    row_bytes: usize,
    acts: &[QuantizedActs],
    y: &mut [f32],
) -> Result<()> {
    let (n, m) = (w.rows, acts.len());
    let parallel = is_parallel(w.data.len(), m);
    // Every row must match the weight type; the first one also picks the kernels.
    let kernels = checked_kernels(op, path, w.dtype, row_bytes, &acts[0])?;
    if let Some(a) = acts.iter().find(|a| a.dtype() != acts[0].dtype()) {
        return Err(Error::Invalid {
            op,
            detail: format!(
                "mixed activation formats {} and {}",
                acts[0].dtype(),
                a.dtype()
            ),
        });
    }
    let job = RowJob {
        kernels,
        data: w.data,
        row_bytes,
        acts,
    };

    let chunk_rows = if parallel {
        n.div_ceil(rayon::current_num_threads() * 4)
            .max(4)
            .next_multiple_of(ROW_ALIGN)
    } else {
        n
    };

    if m == 1 {
        if parallel {
            run_on_team(&mut [(job, y)]);
        } else {
            job.rows(0, y);
        }
        return Ok(());
    }

    // Results are produced weight-row-major (yt[j*m + i]) so each chunk owns a contiguous
    // slice, then transposed into y[i*n + j]. The kernels write every value of yt, so it is a
    // per-thread scratch buffer reused from call to call: neither allocated nor zeroed each time
    // (zeroing it was about 1% of a Gemma 3 prefill).
    let mut yt = TRANSPOSED.with(|t| std::mem::take(&mut *t.borrow_mut()));
    yt.resize(n * m, 0.0);
    let run = |(c, yts): (usize, &mut [f32])| job.rows(c * chunk_rows, yts);
    if parallel {
        yt.par_chunks_mut(chunk_rows * m).enumerate().for_each(run);
    } else {
        yt.chunks_mut(chunk_rows * m).enumerate().for_each(run);
    }
    // In bands of TRANSPOSE_ROWS output rows: each yt row segment read is one cache line that
    // feeds that many output rows, instead of one strided load per output value.
    let transpose = |(b, band): (usize, &mut [f32])| {
        let i0 = b * TRANSPOSE_ROWS;
        let rows = band.len() / n;
        // Square tiles through a local buffer: 16 reads of one yt line each, then 16 contiguous
        // 64-byte writes, instead of 16 writes per yt line into 16 different output lines.
        let mut tile = [[0f32; TRANSPOSE_ROWS]; TRANSPOSE_ROWS];
        let mut j = 0;
        // Full bands (all but the last) get fixed-length copies the compiler turns into vector
        // moves.
        while rows == TRANSPOSE_ROWS && j + TRANSPOSE_ROWS <= n {
            for (jj, t) in tile.iter_mut().enumerate() {
                let src: &[f32; TRANSPOSE_ROWS] = yt[(j + jj) * m + i0..][..TRANSPOSE_ROWS]
                    .try_into()
                    .expect("a full band");
                *t = *src;
            }
            for ii in 0..TRANSPOSE_ROWS {
                let dst: &mut [f32; TRANSPOSE_ROWS] = (&mut band[ii * n + j..][..TRANSPOSE_ROWS])
                    .try_into()
                    .expect("a full tile row");
                for (d, t) in dst.iter_mut().zip(&tile) {
                    *d = t[ii];
                }
            }
            j += TRANSPOSE_ROWS;
        }
        while j + TRANSPOSE_ROWS <= n {
            for (jj, t) in tile.iter_mut().enumerate() {
                t[..rows].copy_from_slice(&yt[(j + jj) * m + i0..][..rows]);
            }
            for ii in 0..rows {
                let dst = &mut band[ii * n + j..][..TRANSPOSE_ROWS];
                for (d, t) in dst.iter_mut().zip(&tile) {
                    *d = t[ii];
                }
            }
            j += TRANSPOSE_ROWS;
        }
        for j in j..n {
            let src = &yt[j * m + i0..j * m + i0 + rows];
            for (ii, &v) in src.iter().enumerate() {
                band[ii * n + j] = v;
            }
        }
    };
    if parallel {
        y.par_chunks_mut(TRANSPOSE_ROWS * n)
            .enumerate()
            .for_each(transpose);
    } else {
        y.chunks_mut(TRANSPOSE_ROWS * n)
            .enumerate()
            .for_each(transpose);
    }
    TRANSPOSED.with(|t| *t.borrow_mut() = yt);
    Ok(())
}

thread_local! {
    /// The calling thread's scratch for [`run`]'s weight-row-major results (its values are
    /// stale between calls and overwritten before they are read).
    static TRANSPOSED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Output rows written together when the weight-row-major results are transposed.
const TRANSPOSE_ROWS: usize = 16;

/// Everything a chunk of output rows needs; lengths were validated by `matmul`.
#[derive(Clone, Copy)]
struct RowJob<'a> {
    kernels: Kernels,
    data: &'a [u8],
    row_bytes: usize,
    acts: &'a [QuantizedActs],
}

impl RowJob<'_> {
    /// `yts[j*m + i]` = row `r0 + j` · x_i for the chunk's rows, x rows taken in tiles of
    /// TILE_M.
    fn rows(&self, r0: usize, yts: &mut [f32]) {
        let m = self.acts.len();
        let nr = yts.len() / m;
        let w = &self.data[r0 * self.row_bytes..(r0 + nr) * self.row_bytes];
        for t0 in (0..m).step_by(TILE_M) {
            let t1 = (t0 + TILE_M).min(m);
            // SAFETY: matmul checked that every row has `row_bytes` bytes for `acts[*].k`
            // elements and checked_kernels matched the activation format to the weight type;
            // `w` holds `nr` rows and `yts[t0..]` the outputs at stride m.
            unsafe {
                self.kernels
                    .run_block(w, self.row_bytes, nr, &self.acts[t0..t1], &mut yts[t0..], m)
            };
        }
    }
}
