//! f32 products of many rows, `C[m×n] = A[m×k] · Bᵀ` with `B: [n, k]` (activations times a
//! weight as stored), for encoders that run whole sequences (Whisper's 1500 frames). `B` is
//! packed once into panels of `NR` columns, k-major (`panel[kk][j] = B[p·NR + j][kk]`, zeros past
//! `n`), then register tiles of `MR` rows × `NR` columns accumulate over the whole k: per k step
//! one or two vector loads of the panel and `MR` broadcasts of A feed `MR · NR / lanes` FMAs.
//! Rows are split into chunks over the rayon pool; each output is one f32 sum in k order per
//! lane, so results do not depend on the thread count (they differ from a dot product's order
//! in the last bits).

use rayon::prelude::*;

use crate::cpu::path;
#[cfg(target_arch = "x86_64")]
use crate::cpu::Path;

/// A weight `[n, k]` as the dense products read it: f32, or IEEE half bits (converted exactly to
/// f32 inside the products, so an f16 weight gives the results of its f32 copy with half the
/// bytes to read).
#[derive(Debug, Clone, Copy)]
pub enum WeightRef<'a> {
    F32(&'a [f32]),
    F16(&'a [u16]),
}

impl WeightRef<'_> {
    pub fn len(&self) -> usize {
        match self {
            WeightRef::F32(w) => w.len(),
            WeightRef::F16(w) => w.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Row `j` of `k` values as f32: borrowed, or converted into `buf`.
    #[inline]
    fn row<'b>(&'b self, j: usize, k: usize, buf: &'b mut [f32]) -> &'b [f32] {
        match self {
            WeightRef::F32(w) => &w[j * k..(j + 1) * k],
            WeightRef::F16(w) => {
                f16_to_f32_slice(&w[j * k..(j + 1) * k], &mut buf[..k]);
                &buf[..k]
            }
        }
    }
}

/// Half bits to f32, exactly (F16C or AVX-512 conversions where the CPU has them).
pub(crate) fn f16_to_f32_slice(src: &[u16], dst: &mut [f32]) {
    debug_assert_eq!(src.len(), dst.len());
    #[cfg(target_arch = "x86_64")]
    if matches!(path(), Path::Avx2 | Path::Avx512) {
        // SAFETY: both paths require F16C (Path::Avx2's definition) and AVX.
        unsafe { x86::f16_to_f32_f16c(src, dst) };
        return;
    }
    for (d, &h) in dst.iter_mut().zip(src) {
        *d = crate::quant::float::f16_to_f32(h);
    }
}

/// Row chunks per parallel task: a multiple of every kernel's MR (6 and 8).
const ROWS_PER_TASK: usize = 48;

/// `c = a · bᵀ`: `a: [m, k]`, `b: [n, k]`, `c: [m, n]`, all row-major. The caller checks the
/// lengths.
pub(crate) fn gemm_nt(a: &[f32], m: usize, b: WeightRef, n: usize, k: usize, c: &mut [f32]) {
    debug_assert!(a.len() == m * k);
    gemm_nt_strided(a, k, m, b, n, k, c)
}

/// [`gemm_nt`] with row `i` of `a` starting at `a[i·lda]` (`k` values from there; `lda < k`
/// makes rows overlap, as a convolution's sliding windows over time-major rows do).
pub(crate) fn gemm_nt_strided(
    a: &[f32],
    lda: usize,
    m: usize,
    b: WeightRef,
    n: usize,
    k: usize,
    c: &mut [f32],
) {
    debug_assert!(b.len() == n * k);
    if m == 0 || n == 0 {
        return;
    }
    gemm_packed(a, lda, m, &PackedWeight::new(b, n, k), c);
}

/// A weight `[n, k]` packed once for the register tiles of the CPU's kernel path: panels of
/// `NR` columns, k-major (`panel[kk][j] = B[p·NR + j][kk]`, zeros past `n`). Packing costs a
/// pass over the weight; layers that multiply by the same weight many times (convolutions over
/// many steps, dilated ones in several phases) pack it once at load.
#[derive(Debug, Clone)]
pub struct PackedWeight {
    panels: Vec<f32>,
    n: usize,
    k: usize,
    /// The panel width this was packed for (the path's NR).
    nr: usize,
}

/// The panel width of the current kernel path's tile.
fn path_nr() -> usize {
    match path() {
        #[cfg(target_arch = "x86_64")]
        Path::Avx512 => 32,
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 => 16,
        _ => 8,
    }
}

impl PackedWeight {
    /// Packs `b: [n, k]` (f32, or f16 converted exactly).
    pub fn new(b: WeightRef, n: usize, k: usize) -> PackedWeight {
        PackedWeight::with_width(b, n, k, path_nr())
    }

    /// Packed in panels of `nr` columns (the tests drive every tile on one CPU).
    pub(crate) fn with_width(b: WeightRef, n: usize, k: usize, nr: usize) -> PackedWeight {
        debug_assert_eq!(b.len(), n * k);
        let mut panels = vec![0f32; n.div_ceil(nr) * k * nr];
        if k > 0 {
            panels
                .par_chunks_mut(k * nr)
                .enumerate()
                .for_each(|(p, panel)| {
                    let mut buf = vec![0f32; if matches!(b, WeightRef::F16(_)) { k } else { 0 }];
                    for j in 0..nr.min(n - p * nr) {
                        let row = b.row(p * nr + j, k, &mut buf);
                        for (kk, &v) in row.iter().enumerate() {
                            panel[kk * nr + j] = v;
                        }
                    }
                });
        }
        PackedWeight { panels, n, k, nr }
    }
}

/// What a product does with each output value `v` of row `i`, column `j`: store `v (+ bias[j])`
/// at `c[i·ldc + j]`, or add it there.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Epilogue<'a> {
    pub accumulate: bool,
    pub bias: Option<&'a [f32]>,
}

/// `c[m×n] = a · bᵀ` with a packed weight; row `i` of `a` starts at `a[i·lda]`. The caller
/// checks the lengths (`a` holds `(m - 1)·lda + k` values, `c` holds `m·n`).
pub(crate) fn gemm_packed(a: &[f32], lda: usize, m: usize, w: &PackedWeight, c: &mut [f32]) {
    gemm_packed_into(a, lda, m, w, c, w.n, Epilogue::default());
}

/// [`gemm_packed`] into rows `ldc` apart (`c[i·ldc + j]`, other values untouched) with an
/// [`Epilogue`] (bias, accumulation).
///
/// Panics when `c` is shorter than `(m - 1)·ldc + n`, `ldc < n`, a bias is not `n` values or
/// `a` is too short (the writes go through a raw pointer).
pub(crate) fn gemm_packed_into(
    a: &[f32],
    lda: usize,
    m: usize,
    w: &PackedWeight,
    c: &mut [f32],
    ldc: usize,
    epilogue: Epilogue,
) {
    let (n, k) = (w.n, w.k);
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        ldc >= n && c.len() >= (m - 1) * ldc + n,
        "gemm output too short"
    );
    assert!(a.len() >= (m - 1) * lda + k, "gemm input too short");
    assert!(
        epilogue.bias.is_none_or(|b| b.len() == n),
        "gemm bias length"
    );
    assert_eq!(w.nr, path_nr(), "packed for another kernel path");
    let out = OutPtr(c.as_mut_ptr());
    match path() {
        #[cfg(target_arch = "x86_64")]
        Path::Avx512 => run::<8, 32>(
            a,
            lda,
            m,
            w,
            out,
            ldc,
            epilogue,
            |a, lda, rows, bp, k, c, ldc, cols| {
                // SAFETY: the path is only chosen on CPUs with AVX-512F; pointers as `tile` documents.
                unsafe { x86::tile_avx512(a, lda, rows, bp, k, c, ldc, cols) }
            },
        ),
        #[cfg(target_arch = "x86_64")]
        Path::Avx2 => run::<6, 16>(
            a,
            lda,
            m,
            w,
            out,
            ldc,
            epilogue,
            |a, lda, rows, bp, k, c, ldc, cols| {
                // SAFETY: the path is only chosen on CPUs with AVX2 and FMA.
                unsafe { x86::tile_avx2(a, lda, rows, bp, k, c, ldc, cols) }
            },
        ),
        _ => run::<4, 8>(a, lda, m, w, out, ldc, epilogue, tile_portable::<4, 8>),
    }
}

/// An output pointer the team's threads write disjoint ranges of.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: each thread writes only its own rows' outputs (see `gemv_nt` and `run`).
unsafe impl Sync for OutPtr {}
unsafe impl Send for OutPtr {}

impl OutPtr {
    /// The pointer at offset `i` (a method, so closures capture the `Sync` wrapper).
    fn at(self, i: usize) -> *mut f32 {
        self.0.wrapping_add(i)
    }
}

/// `c = a · bᵀ` for few rows of `a` (decode steps): each weight row is read once, converted if
/// f16, and dotted with every row of `a` ([`dot`]); the weight rows are split between the decode
/// team's threads, so every output is the same whatever the thread count.
pub(crate) fn gemv_nt(a: &[f32], m: usize, b: WeightRef, n: usize, k: usize, c: &mut [f32]) {
    debug_assert!(a.len() == m * k && b.len() == n * k && c.len() == m * n);
    if m == 0 || n == 0 {
        return;
    }
    let team = crate::team::team();
    let threads = team.threads();
    let per = n.div_ceil(threads).next_multiple_of(16);
    let out = OutPtr(c.as_mut_ptr());
    let dot = dot_fn();
    team.run(&|t| {
        let r0 = t * per;
        let mut buf = vec![0f32; if matches!(b, WeightRef::F16(_)) { k } else { 0 }];
        for j in r0..n.min(r0 + per) {
            let row = b.row(j, k, &mut buf);
            for i in 0..m {
                // SAFETY: output (i, j) belongs to this thread's rows [r0, r0 + per); `c` holds
                // m × n outputs borrowed mutably by the caller for this call.
                unsafe { *out.at(i * n + j) = dot(row, &a[i * k..(i + 1) * k]) };
            }
        }
    });
}

/// The dot product of two equal-length f32 slices for the CPU: 64 partial sums (four vectors of
/// 16 lanes), combined in a fixed order.
fn dot_fn() -> fn(&[f32], &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    match path() {
        // SAFETY (both): the paths are only chosen on CPUs with these features.
        Path::Avx512 => return |w, a| unsafe { x86::dot_avx512(w, a) },
        Path::Avx2 => return |w, a| unsafe { x86::dot_avx2(w, a) },
        _ => {}
    }
    dot_portable
}

#[inline(always)]
fn dot_body(w: &[f32], a: &[f32]) -> f32 {
    const LANES: usize = 64;
    let mut acc = [0f32; LANES];
    let mut wc = w.chunks_exact(LANES);
    let mut ac = a.chunks_exact(LANES);
    for (wv, av) in (&mut wc).zip(&mut ac) {
        for l in 0..LANES {
            acc[l] += wv[l] * av[l];
        }
    }
    let mut tail = 0f32;
    for (x, y) in wc.remainder().iter().zip(ac.remainder()) {
        tail += x * y;
    }
    // Pairwise: 64 → 1.
    let mut width = LANES / 2;
    while width > 0 {
        for l in 0..width {
            acc[l] += acc[l + width];
        }
        width /= 2;
    }
    acc[0] + tail
}

fn dot_portable(w: &[f32], a: &[f32]) -> f32 {
    dot_body(w, a)
}

/// One register tile: rows `a[r·lda ..]` for r < rows (≤ MR), the packed panel `bp` (`k` steps
/// of NR values), into `c[r·ldc + j]` for j < cols (≤ NR).
type Tile = fn(*const f32, usize, usize, *const f32, usize, *mut f32, usize, usize);

#[allow(clippy::too_many_arguments)]
fn run<const MR: usize, const NR: usize>(
    a: &[f32],
    lda: usize,
    m: usize,
    w: &PackedWeight,
    out: OutPtr,
    ldc: usize,
    epilogue: Epilogue,
    tile: Tile,
) {
    let (n, k) = (w.n, w.k);
    let panels = n.div_ceil(NR);
    let packed = &w.panels;
    (0..m.div_ceil(ROWS_PER_TASK))
        .into_par_iter()
        .for_each(|task| {
            let r0 = task * ROWS_PER_TASK;
            let rows = ROWS_PER_TASK.min(m - r0);
            // With a bias or accumulation each tile lands here first, then goes through the
            // epilogue into c.
            let plain = !epilogue.accumulate && epilogue.bias.is_none();
            let mut tile_out = vec![0f32; if plain { 0 } else { MR * NR }];
            for p in 0..panels {
                let cols = NR.min(n - p * NR);
                let bp = packed[p * k * NR..].as_ptr();
                let bias = epilogue.bias.map(|b| &b[p * NR..p * NR + cols]);
                let mut r = 0;
                while r < rows {
                    let tile_rows = MR.min(rows - r);
                    let ap = a[(r0 + r) * lda..].as_ptr();
                    if plain {
                        // Straight into c: rows r0 + r .. + tile_rows, columns p·NR + cols.
                        let cp = out.at((r0 + r) * ldc + p * NR);
                        tile(ap, lda, tile_rows, bp, k, cp, ldc, cols);
                        r += MR;
                        continue;
                    }
                    tile(ap, lda, tile_rows, bp, k, tile_out.as_mut_ptr(), NR, cols);
                    for (i, vals) in tile_out.chunks_exact(NR).take(tile_rows).enumerate() {
                        let dst = out.at((r0 + r + i) * ldc + p * NR);
                        // SAFETY: row r0 + r + i < m and column p·NR + cols ≤ n ≤ ldc lie in the
                        // caller's c (checked by `gemm_packed_into`); rows belong to one task.
                        let dst = unsafe { std::slice::from_raw_parts_mut(dst, cols) };
                        match (epilogue.accumulate, bias) {
                            (false, None) => dst.copy_from_slice(&vals[..cols]),
                            (false, Some(b)) => dst
                                .iter_mut()
                                .zip(vals.iter().zip(b))
                                .for_each(|(d, (&v, &b))| *d = v + b),
                            (true, None) => dst.iter_mut().zip(vals).for_each(|(d, &v)| *d += v),
                            (true, Some(b)) => dst
                                .iter_mut()
                                .zip(vals.iter().zip(b))
                                .for_each(|(d, (&v, &b))| *d += v + b),
                        }
                    }
                    r += MR;
                }
            }
        });
}

/// The portable tile (any CPU): k-order sums per output like the SIMD tiles, unfused (the
/// baseline x86_64 target has no FMA; `mul_add` would call a software routine).
#[allow(clippy::too_many_arguments)]
fn tile_portable<const MR: usize, const NR: usize>(
    a: *const f32,
    lda: usize,
    rows: usize,
    bp: *const f32,
    k: usize,
    c: *mut f32,
    ldc: usize,
    cols: usize,
) {
    let mut acc = [[0f32; NR]; MR];
    for kk in 0..k {
        // SAFETY: `run` passes panels of k·NR values and rows of lda ≥ k values, r < rows.
        let bv: &[f32] = unsafe { std::slice::from_raw_parts(bp.add(kk * NR), NR) };
        for (r, acc_r) in acc.iter_mut().enumerate().take(rows) {
            let av = unsafe { *a.add(r * lda + kk) };
            for (x, &bj) in acc_r.iter_mut().zip(bv) {
                *x += av * bj;
            }
        }
    }
    for (r, acc_r) in acc.iter().enumerate().take(rows) {
        for (j, &v) in acc_r.iter().enumerate().take(cols) {
            // SAFETY: the tile's outputs lie inside the caller's chunk of c.
            unsafe { *c.add(r * ldc + j) = v };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx,f16c")]
    pub(super) unsafe fn f16_to_f32_f16c(src: &[u16], dst: &mut [f32]) {
        let n = src.len().min(dst.len());
        let mut i = 0;
        while i + 8 <= n {
            let h = _mm_loadu_si128(src.as_ptr().add(i) as *const __m128i);
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
            i += 8;
        }
        for j in i..n {
            dst[j] = crate::quant::float::f16_to_f32(src[j]);
        }
    }

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn dot_avx512(w: &[f32], a: &[f32]) -> f32 {
        super::dot_body(w, a)
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot_avx2(w: &[f32], a: &[f32]) -> f32 {
        super::dot_body(w, a)
    }

    /// 6 rows × 16 columns: 12 accumulators of 8 lanes. Rows past `rows` read row 0 again and
    /// are not stored.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn tile_avx2(
        a: *const f32,
        lda: usize,
        rows: usize,
        bp: *const f32,
        k: usize,
        c: *mut f32,
        ldc: usize,
        cols: usize,
    ) {
        const MR: usize = 6;
        let row = |r: usize| if r < rows { a.add(r * lda) } else { a };
        let ar = [row(0), row(1), row(2), row(3), row(4), row(5)];
        let mut acc = [[_mm256_setzero_ps(); 2]; MR];
        for kk in 0..k {
            let b0 = _mm256_loadu_ps(bp.add(kk * 16));
            let b1 = _mm256_loadu_ps(bp.add(kk * 16 + 8));
            for r in 0..MR {
                let av = _mm256_broadcast_ss(&*ar[r].add(kk));
                acc[r][0] = _mm256_fmadd_ps(av, b0, acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(av, b1, acc[r][1]);
            }
        }
        for (r, acc_r) in acc.iter().enumerate().take(rows) {
            let mut out = [0f32; 16];
            _mm256_storeu_ps(out.as_mut_ptr(), acc_r[0]);
            _mm256_storeu_ps(out.as_mut_ptr().add(8), acc_r[1]);
            std::ptr::copy_nonoverlapping(out.as_ptr(), c.add(r * ldc), cols);
        }
    }

    /// 8 rows × 32 columns: 16 accumulators of 16 lanes.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn tile_avx512(
        a: *const f32,
        lda: usize,
        rows: usize,
        bp: *const f32,
        k: usize,
        c: *mut f32,
        ldc: usize,
        cols: usize,
    ) {
        const MR: usize = 8;
        let row = |r: usize| if r < rows { a.add(r * lda) } else { a };
        let ar = [
            row(0),
            row(1),
            row(2),
            row(3),
            row(4),
            row(5),
            row(6),
            row(7),
        ];
        let mut acc = [[_mm512_setzero_ps(); 2]; MR];
        for kk in 0..k {
            let b0 = _mm512_loadu_ps(bp.add(kk * 32));
            let b1 = _mm512_loadu_ps(bp.add(kk * 32 + 16));
            for r in 0..MR {
                let av = _mm512_set1_ps(*ar[r].add(kk));
                acc[r][0] = _mm512_fmadd_ps(av, b0, acc[r][0]);
                acc[r][1] = _mm512_fmadd_ps(av, b1, acc[r][1]);
            }
        }
        for (r, acc_r) in acc.iter().enumerate().take(rows) {
            let mut out = [0f32; 32];
            _mm512_storeu_ps(out.as_mut_ptr(), acc_r[0]);
            _mm512_storeu_ps(out.as_mut_ptr().add(16), acc_r[1]);
            std::ptr::copy_nonoverlapping(out.as_ptr(), c.add(r * ldc), cols);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An f16 weight gives exactly what its f32 copy gives, in both products.
    #[test]
    fn f16_weights_equal_their_f32_copies() {
        let (m, n, k) = (20, 45, 130);
        let a = values(m * k, 3);
        let h: Vec<u16> = values(n * k, 4)
            .iter()
            .map(|&v| half::f16::from_f32(v).to_bits())
            .collect();
        let f: Vec<f32> = h
            .iter()
            .map(|&b| half::f16::from_bits(b).to_f32())
            .collect();
        for rows in [m, 3] {
            let (mut x, mut y) = (vec![0f32; rows * n], vec![0f32; rows * n]);
            let a = &a[..rows * k];
            gemm_nt(a, rows, WeightRef::F16(&h), n, k, &mut x);
            gemm_nt(a, rows, WeightRef::F32(&f), n, k, &mut y);
            assert_eq!(x, y);
            gemv_nt(a, rows, WeightRef::F16(&h), n, k, &mut x);
            gemv_nt(a, rows, WeightRef::F32(&f), n, k, &mut y);
            assert_eq!(x, y);
        }
    }

    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            })
            .collect()
    }

    /// Every kernel (the CPU's and the portable one) against f64 sums, on shapes with partial
    /// tiles in both directions.
    #[test]
    fn gemm_matches_f64_reference() {
        for &(m, n, k) in &[
            (1, 1, 1),
            (7, 33, 5),
            (50, 17, 64),
            (97, 70, 129),
            (13, 100, 300),
        ] {
            let (a, b) = (values(m * k, m as u64), values(n * k, n as u64 + 7));
            let mut want = vec![0f64; m * n];
            for i in 0..m {
                for j in 0..n {
                    want[i * n + j] = (0..k)
                        .map(|t| a[i * k + t] as f64 * b[j * k + t] as f64)
                        .sum();
                }
            }
            let mut c = vec![f32::NAN; m * n];
            gemm_nt(&a, m, WeightRef::F32(&b), n, k, &mut c);
            let mut g = vec![f32::NAN; m * n];
            gemv_nt(&a, m, WeightRef::F32(&b), n, k, &mut g);
            let mut p = vec![f32::NAN; m * n];
            let packed8 = PackedWeight::with_width(WeightRef::F32(&b), n, k, 8);
            run::<4, 8>(
                &a,
                k,
                m,
                &packed8,
                OutPtr(p.as_mut_ptr()),
                n,
                Epilogue::default(),
                tile_portable::<4, 8>,
            );
            // The AVX2 tile on every CPU that has it, whichever path the CPU takes.
            #[cfg(target_arch = "x86_64")]
            if Path::all_supported().contains(&Path::Avx2) {
                let mut q = vec![f32::NAN; m * n];
                let packed16 = PackedWeight::with_width(WeightRef::F32(&b), n, k, 16);
                run::<6, 16>(
                    &a,
                    k,
                    m,
                    &packed16,
                    OutPtr(q.as_mut_ptr()),
                    n,
                    Epilogue::default(),
                    |a, lda, rows, bp, k, c, ldc, cols| unsafe {
                        x86::tile_avx2(a, lda, rows, bp, k, c, ldc, cols)
                    },
                );
                p.iter()
                    .zip(&q)
                    .for_each(|(x, y)| assert!((x - y).abs() < 1e-4, "avx2 {x} vs {y}"));
            }
            for (i, w) in want.iter().enumerate() {
                let tol = 1e-5 * (k as f64).sqrt().max(1.0);
                assert!(
                    (c[i] as f64 - w).abs() < tol,
                    "{m}×{n}×{k} [{i}]: {} vs {w}",
                    c[i]
                );
                assert!(
                    (p[i] as f64 - w).abs() < tol,
                    "portable {m}×{n}×{k} [{i}]: {} vs {w}",
                    p[i]
                );
            }
        }
    }
}
