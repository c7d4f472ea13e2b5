//! The two dot-product kernels of CPU attention, scalar and AVX-512.
//!
//! Both compute many independent f64 sums side by side and keep the order of the terms of every
//! sum: a score is summed over head dimensions in order, an output over positions in order.
//! Every term is an exact product of two f16 values (in f32 or f64 alike), so `acc + a * b` with
//! a fused multiply-add in f64 rounds exactly like the reference's f32 product converted to f64
//! and then added. The SIMD kernels are therefore bit-identical to the scalar ones. They read the
//! f16 cache directly (converting in registers); the scalar ones take f16 or f32 copies.

use half::f16;

/// Zeros after the key cache, so that the SIMD scores kernel may read whole position tiles
/// past the last dimension's last position (the lanes past `n` are discarded).
pub(crate) const KEY_PAD: usize = 32;

/// Whether the AVX-512 kernels may run: the CPU has AVX-512F and F16C, and the kernel path is
/// not capped below AVX-512 (`SYNAPTIX_CPU_KERNELS`).
pub(crate) fn simd_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let f = synaptix_kernels_cpu::cpu_features();
        f.avx512f && f.f16c && synaptix_kernels_cpu::kernel_path() == "avx512-vnni"
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Positions a scores call for `rows` query rows computes per row, padded to its SIMD tile
/// (at most [`KEY_PAD`]): the caller's `dots` stride.
pub(crate) fn padded_positions(n: usize, rows: usize) -> usize {
    n.next_multiple_of(if rows <= 2 { 32 } else { 16 })
}

/// `dots[r * stride + j] = sum over d in order of q[r * hd + d] * keys[d * ks + off + j]` for rows
/// `r < q.len() / hd` and positions `j < n`, with `stride = padded_positions(n, rows)`; entries
/// past `n` are left unspecified. Needs [`simd_available`], at most 8 rows, and `keys` readable
/// up to [`KEY_PAD`] entries past the last position (`(hd - 1) * ks + off + n`); panics
/// otherwise.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub(crate) fn scores_simd(
    q: &[f64],
    hd: usize,
    keys: &[f16],
    ks: usize,
    off: usize,
    n: usize,
    dots: &mut [f64],
) {
    let rows = q.len() / hd;
    let stride = padded_positions(n, rows);
    assert!(simd_available() && hd > 0 && (1..=8).contains(&rows));
    assert!(dots.len() >= rows * stride);
    assert!((hd - 1) * ks + off + stride <= keys.len());
    // SAFETY: AVX-512F and F16C are present (asserted above); the asserts above bound every read
    // of `keys` (the last tile ends at `(hd - 1) * ks + off + stride`) and of `q`
    // (`rows * hd <= q.len()`), and every write of `dots`.
    unsafe {
        match rows {
            1 => x86::scores::<1, 4>(q, hd, keys, ks, off, stride, dots),
            2 => x86::scores::<2, 4>(q, hd, keys, ks, off, stride, dots),
            3 => x86::scores::<3, 2>(q, hd, keys, ks, off, stride, dots),
            4 => x86::scores::<4, 2>(q, hd, keys, ks, off, stride, dots),
            5 => x86::scores::<5, 2>(q, hd, keys, ks, off, stride, dots),
            6 => x86::scores::<6, 2>(q, hd, keys, ks, off, stride, dots),
            7 => x86::scores::<7, 2>(q, hd, keys, ks, off, stride, dots),
            _ => x86::scores::<8, 2>(q, hd, keys, ks, off, stride, dots),
        }
    }
}

/// Off x86-64 [`simd_available`] is false and this is never called.
#[cfg(not(target_arch = "x86_64"))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn scores_simd(
    _q: &[f64],
    _hd: usize,
    _keys: &[f16],
    _ks: usize,
    _off: usize,
    _n: usize,
    _dots: &mut [f64],
) {
    unreachable!("no SIMD attention kernels on this architecture");
}

/// [`scores_simd`]'s result for positions `j < n` (`T` is f32 or f16; the stride is the same).
#[allow(clippy::too_many_arguments)]
pub(crate) fn scores_scalar<T: Copy + Into<f64>>(
    q: &[f64],
    hd: usize,
    keys: &[T],
    ks: usize,
    off: usize,
    n: usize,
    dots: &mut [f64],
) {
    let stride = padded_positions(n, q.len() / hd);
    for (qr, dr) in q.chunks_exact(hd).zip(dots.chunks_exact_mut(stride)) {
        let dr = &mut dr[..n];
        dr.fill(0.0);
        for (d, &qd) in qr.iter().enumerate() {
            let kd = &keys[d * ks + off..][..n];
            for (acc, &k) in dr.iter_mut().zip(kd) {
                *acc += k.into() * qd;
            }
        }
    }
}

/// `acc[r * hd + d] = sum over j < n in order of w[j * rows + r] * values[j * hd + d]`, skipping
/// the positions where every row's weight is zero. This equals [`outputs_scalar`] (which skips
/// each zero weight) when every value is finite, which the caller must check. Needs
/// [`simd_available`], at most 8 rows and `hd % 8 == 0`; panics otherwise.
#[cfg(target_arch = "x86_64")]
pub(crate) fn outputs_simd(
    w: &[f64],
    rows: usize,
    n: usize,
    values: &[f16],
    hd: usize,
    acc: &mut [f64],
) {
    assert!(simd_available() && hd.is_multiple_of(8) && (1..=8).contains(&rows));
    assert!(w.len() >= n * rows);
    assert!(values.len() >= n * hd);
    assert!(acc.len() >= rows * hd);
    // Positions where some row has a nonzero weight.
    let live: Vec<usize> = (0..n)
        .filter(|&j| w[j * rows..][..rows].iter().any(|&x| x != 0.0))
        .collect();
    // SAFETY: AVX-512F and F16C are present (asserted above); `live` holds positions `< n`, so
    // the asserts above bound every read of `w` and `values`; `hd % 8 == 0` keeps each 8-wide
    // tile inside a row, and `acc` holds `rows * hd` entries.
    unsafe {
        match rows {
            1 => x86::outputs::<1>(w, &live, values, hd, acc),
            2 => x86::outputs::<2>(w, &live, values, hd, acc),
            3 => x86::outputs::<3>(w, &live, values, hd, acc),
            4 => x86::outputs::<4>(w, &live, values, hd, acc),
            5 => x86::outputs::<5>(w, &live, values, hd, acc),
            6 => x86::outputs::<6>(w, &live, values, hd, acc),
            7 => x86::outputs::<7>(w, &live, values, hd, acc),
            _ => x86::outputs::<8>(w, &live, values, hd, acc),
        }
    }
}

/// Off x86-64 [`simd_available`] is false and this is never called.
#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn outputs_simd(
    _w: &[f64],
    _rows: usize,
    _n: usize,
    _values: &[f16],
    _hd: usize,
    _acc: &mut [f64],
) {
    unreachable!("no SIMD attention kernels on this architecture");
}

/// `acc[r * hd + d] += sum over j < n in order of w[j * rows + r] * values[j * hd + d]`, each
/// zero weight skipped (it adds exactly nothing in the reference either).
pub(crate) fn outputs_scalar<T: Copy + Into<f64>>(
    w: &[f64],
    rows: usize,
    n: usize,
    values: &[T],
    hd: usize,
    acc: &mut [f64],
) {
    for (r, ar) in acc.chunks_exact_mut(hd).take(rows).enumerate() {
        for j in 0..n {
            let wj = w[j * rows + r];
            if wj == 0.0 {
                continue;
            }
            for (a, &v) in ar.iter_mut().zip(&values[j * hd..][..hd]) {
                *a += v.into() * wj;
            }
        }
    }
}

/// [`crate::ggml_math::softmax_inplace`], bit for bit: with AVX-512 (where [`simd_available`])
/// sixteen lanes of ggml's `exp` at a time, each lane the same sequence of f32 operations, and
/// each group of four summed `(v0+v1)+(v2+v3)` into the f64 total in order.
pub(crate) fn softmax(simd: bool, x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if simd && simd_available() {
        // SAFETY: AVX-512F is present (checked just above); the kernel stays inside `x`.
        unsafe { x86::softmax(x) };
        return;
    }
    let _ = simd;
    crate::ggml_math::softmax_inplace(x);
}

/// [`crate::ggml_math::swiglu_inplace`], bit for bit: with AVX-512 (where [`simd_available`])
/// sixteen lanes of `silu(x) * g` at a time through the same 16-lane `exp`, each lane the same
/// f32 operations; the groups of four past the last sixteen and the tail as the scalar code.
pub(crate) fn swiglu(gate: &mut [f32], up: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if simd_available() && up.len() >= gate.len() {
        // SAFETY: AVX-512F is present (checked just above); `up` is at least as long as `gate`.
        unsafe { x86::swiglu(gate, up) };
        return;
    }
    crate::ggml_math::swiglu_inplace(gate, up);
}

/// GeGLU as the CPU backend computes it (`gelu_tanh_f16_table(gate) * up`, ggml's table), bit
/// for bit: with AVX-512 (where [`simd_available`]) sixteen lanes at a time, the f16 rounding
/// by `vcvtps2ph` and the table read by a gather; NaN lanes and the tail as the scalar code.
pub(crate) fn geglu(gate: &mut [f32], up: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if simd_available() && up.len() >= gate.len() {
        // SAFETY: AVX-512F and F16C are present (checked just above); `up` is at least as long
        // as `gate`.
        unsafe { x86::geglu(gate, up) };
        return;
    }
    geglu_scalar(gate, up);
}

fn geglu_scalar(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        *g = crate::mlp::gelu_tanh_f16_table(*g) * u;
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use half::f16;
    use std::arch::x86_64::*;

    /// [`super::geglu`] sixteen lanes at a time: `x <= -10` gives 0, `x >= 10` gives `x`, else
    /// the table's value at the bits of `x` rounded to f16; then `* up`. NaN inputs go through
    /// the scalar code (their f16 rounding is the `half` crate's).
    ///
    /// # Safety
    /// AVX-512F and F16C must be available and `up.len() >= gate.len()`.
    #[target_feature(enable = "avx512f,f16c")]
    pub(super) unsafe fn geglu(gate: &mut [f32], up: &[f32]) {
        let table = crate::mlp::gelu_f16_table_padded();
        let base = table.as_ptr().cast::<u8>();
        let wide = gate.len() / 16 * 16;
        let (low, high, zero) = (
            _mm512_set1_ps(-10.0),
            _mm512_set1_ps(10.0),
            _mm512_setzero_ps(),
        );
        for i in (0..wide).step_by(16) {
            let p = gate.as_mut_ptr().add(i);
            let x = _mm512_loadu_ps(p);
            let u = _mm512_loadu_ps(up.as_ptr().add(i));
            let bits = _mm512_cvtepu16_epi32(_mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT }>(x));
            // Lane j reads 4 bytes at table + 2·bits[j]: its entry in the low half (the padding
            // entry keeps the last read inside).
            let words = _mm512_i32gather_epi32::<2>(bits, base.cast());
            let looked = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(words));
            let is_low = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(x, low);
            let is_high = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, high);
            let v = _mm512_mask_blend_ps(is_high, _mm512_mask_blend_ps(is_low, looked, zero), x);
            _mm512_storeu_ps(p, _mm512_mul_ps(v, u));
            let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
            if nan != 0 {
                let xs: [f32; 16] = std::mem::transmute(x);
                for (j, &xj) in xs.iter().enumerate() {
                    if nan >> j & 1 == 1 {
                        *p.add(j) = crate::mlp::gelu_tanh_f16_table(xj) * up[i + j];
                    }
                }
            }
        }
        super::geglu_scalar(&mut gate[wide..], &up[wide..]);
    }

    /// Eight f16 at `p` as f64 (exact).
    ///
    /// # Safety
    /// F16C and AVX-512F must be available; `p..p + 8` must be readable.
    #[inline]
    #[target_feature(enable = "avx512f,f16c")]
    unsafe fn load8(p: *const f16) -> __m512d {
        _mm512_cvtps_pd(_mm256_cvtph_ps(_mm_loadu_si128(p.cast())))
    }

    /// `R` query rows times `8 * PV` positions per tile; each accumulator sums over `d` in order.
    ///
    /// # Safety
    /// AVX-512F and F16C must be available; `q.len() >= R * hd`; `stride` a multiple of `8 * PV`
    /// with `(hd - 1) * ks + off + stride <= keys.len()`; `dots.len() >= R * stride`.
    #[target_feature(enable = "avx512f,f16c")]
    pub(super) unsafe fn scores<const R: usize, const PV: usize>(
        q: &[f64],
        hd: usize,
        keys: &[f16],
        ks: usize,
        off: usize,
        stride: usize,
        dots: &mut [f64],
    ) {
        let qp = q.as_ptr();
        let kp = keys.as_ptr().add(off);
        let dp = dots.as_mut_ptr();
        let mut j0 = 0;
        while j0 < stride {
            let mut acc = [[_mm512_setzero_pd(); PV]; R];
            for d in 0..hd {
                let row = kp.add(d * ks + j0);
                let mut k = [_mm512_setzero_pd(); PV];
                for (c, kc) in k.iter_mut().enumerate() {
                    *kc = load8(row.add(8 * c));
                }
                for (r, ar) in acc.iter_mut().enumerate() {
                    let qv = _mm512_set1_pd(*qp.add(r * hd + d));
                    for (a, &kc) in ar.iter_mut().zip(&k) {
                        *a = _mm512_fmadd_pd(qv, kc, *a);
                    }
                }
            }
            for (r, ar) in acc.iter().enumerate() {
                for (c, &a) in ar.iter().enumerate() {
                    _mm512_storeu_pd(dp.add(r * stride + j0 + 8 * c), a);
                }
            }
            j0 += 8 * PV;
        }
    }

    /// `R` rows times 16 (then 8) head dimensions per tile; each accumulator sums over the live
    /// positions in order.
    ///
    /// # Safety
    /// AVX-512F and F16C must be available; `hd % 8 == 0`; every `j` in `live` has
    /// `(j + 1) * R <= w.len()` and `(j + 1) * hd <= values.len()`; `acc.len() >= R * hd`.
    #[target_feature(enable = "avx512f,f16c")]
    pub(super) unsafe fn outputs<const R: usize>(
        w: &[f64],
        live: &[usize],
        values: &[f16],
        hd: usize,
        acc: &mut [f64],
    ) {
        let wp = w.as_ptr();
        let vp = values.as_ptr();
        let ap = acc.as_mut_ptr();
        let mut d0 = 0;
        while d0 + 16 <= hd {
            let mut a = [[_mm512_setzero_pd(); 2]; R];
            for &j in live {
                let v = vp.add(j * hd + d0);
                let v0 = load8(v);
                let v1 = load8(v.add(8));
                for (r, ar) in a.iter_mut().enumerate() {
                    let wv = _mm512_set1_pd(*wp.add(j * R + r));
                    ar[0] = _mm512_fmadd_pd(wv, v0, ar[0]);
                    ar[1] = _mm512_fmadd_pd(wv, v1, ar[1]);
                }
            }
            for (r, ar) in a.iter().enumerate() {
                _mm512_storeu_pd(ap.add(r * hd + d0), ar[0]);
                _mm512_storeu_pd(ap.add(r * hd + d0 + 8), ar[1]);
            }
            d0 += 16;
        }
        if d0 < hd {
            let mut a = [_mm512_setzero_pd(); R];
            for &j in live {
                let v0 = load8(vp.add(j * hd + d0));
                for (r, ar) in a.iter_mut().enumerate() {
                    let wv = _mm512_set1_pd(*wp.add(j * R + r));
                    *ar = _mm512_fmadd_pd(wv, v0, *ar);
                }
            }
            for (r, &ar) in a.iter().enumerate() {
                _mm512_storeu_pd(ap.add(r * hd + d0), ar);
            }
        }
    }

    /// ggml's `exp` ([`crate::ggml_math::ggml_expf`]) on sixteen lanes: the same f32 operations
    /// (separate multiplies and adds, no FMA) and the same choice among its three results.
    ///
    /// # Safety
    /// AVX-512F must be available.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn ggml_expf16(x: __m512) -> __m512 {
        let c = |bits: u32| _mm512_set1_ps(f32::from_bits(bits));
        let madd = |a: __m512, b: __m512, c: __m512| _mm512_add_ps(_mm512_mul_ps(a, b), c);
        let nmadd = |a: __m512, b: __m512, c: __m512| _mm512_sub_ps(c, _mm512_mul_ps(a, b));
        let r = c(0x4b40_0000);
        let z = madd(x, c(0x3fb8_aa3b), r);
        let n = _mm512_sub_ps(z, r);
        let b = nmadd(n, c(0x35bf_be8e), nmadd(n, c(0x3f31_7200), x));
        let e = _mm512_slli_epi32::<23>(_mm512_castps_si512(z));
        let k = _mm512_castsi512_ps(_mm512_add_epi32(e, _mm512_set1_epi32(0x3f80_0000)));
        let u = _mm512_mul_ps(b, b);
        let j = madd(
            madd(
                madd(c(0x3c07_2010), b, c(0x3d2b_9f17)),
                u,
                madd(c(0x3e2a_af33), b, c(0x3eff_fedb)),
            ),
            u,
            _mm512_mul_ps(c(0x3f7f_fff6), b),
        );
        let abs_n = _mm512_abs_ps(n);
        let small = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(abs_n, _mm512_set1_ps(126.0));
        let huge = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(abs_n, _mm512_set1_ps(192.0));
        let neg = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(n, _mm512_setzero_ps());
        let g = _mm512_maskz_mov_epi32(neg, _mm512_set1_epi32(0x8200_0000_u32 as i32));
        let s1 = _mm512_castsi512_ps(_mm512_add_epi32(g, _mm512_set1_epi32(0x7f00_0000)));
        let s2 = _mm512_castsi512_ps(_mm512_sub_epi32(e, g));
        let scaled = _mm512_mul_ps(madd(s2, j, s2), s1);
        let big = _mm512_mask_blend_ps(huge, scaled, _mm512_mul_ps(s1, s1));
        _mm512_mask_blend_ps(small, big, madd(j, k, k))
    }

    /// [`crate::ggml_math::swiglu_inplace`] with sixteen lanes at a time: `x / (1 + exp(0 -
    /// x)) * g`, a division then a multiplication, as the scalar code.
    ///
    /// # Safety
    /// AVX-512F must be available and `up.len() >= gate.len()`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn swiglu(gate: &mut [f32], up: &[f32]) {
        let wide = gate.len() / 16 * 16;
        let (one, zero) = (_mm512_set1_ps(1.0), _mm512_setzero_ps());
        for i in (0..wide).step_by(16) {
            let p = gate.as_mut_ptr().add(i);
            let x = _mm512_loadu_ps(p);
            let g = _mm512_loadu_ps(up.as_ptr().add(i));
            let e = ggml_expf16(_mm512_sub_ps(zero, x));
            _mm512_storeu_ps(p, _mm512_mul_ps(_mm512_div_ps(x, _mm512_add_ps(one, e)), g));
        }
        // The rest keeps its positions: groups of four (ggml's exp) up to len / 4 * 4, then the
        // tail (the C library's).
        let vectorised = gate.len() / 4 * 4;
        for (i, (x, g)) in gate.iter_mut().zip(up).enumerate().skip(wide) {
            let e = if i < vectorised {
                crate::ggml_math::ggml_expf(0.0 - *x)
            } else {
                (-*x).exp()
            };
            *x = *x / (1.0 + e) * g;
        }
    }

    /// [`crate::ggml_math::softmax_inplace`] with sixteen lanes of `exp` at a time.
    ///
    /// # Safety
    /// AVX-512F must be available.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn softmax(x: &mut [f32]) {
        let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let vectorised = x.len() / 4 * 4;
        let wide = x.len() / 16 * 16;
        let mut sum = 0f64;
        let maxv = _mm512_set1_ps(max);
        for chunk in x[..wide].chunks_exact_mut(16) {
            let p = chunk.as_mut_ptr();
            let v = ggml_expf16(_mm512_sub_ps(_mm512_loadu_ps(p), maxv));
            _mm512_storeu_ps(p, v);
            // Lane 4i: (v0 + v1) + (v2 + v3) of group i (f32 addition is commutative).
            let pairs = _mm512_add_ps(v, _mm512_permute_ps::<0b10_11_00_01>(v));
            let quads = _mm512_add_ps(pairs, _mm512_permute_ps::<0b01_00_11_10>(pairs));
            let mut lanes = [0f32; 16];
            _mm512_storeu_ps(lanes.as_mut_ptr(), quads);
            for group in lanes.chunks_exact(4) {
                sum += group[0] as f64;
            }
        }
        for group in x[wide..vectorised].chunks_exact_mut(4) {
            for v in group.iter_mut() {
                *v = crate::ggml_math::ggml_expf(*v - max);
            }
            sum += ((group[0] + group[1]) + (group[2] + group[3])) as f64;
        }
        for v in x[vectorised..].iter_mut() {
            *v = (*v - max).exp();
            sum += *v as f64;
        }
        let inv = (1.0 / sum) as f32;
        for v in x.iter_mut() {
            *v *= inv;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The SIMD softmax (and its 16-lane `exp`) against the scalar reference, bit for bit, over
    /// lengths that exercise every tail, values spanning `exp`'s three regimes, and masked
    /// (`-inf`) entries.
    #[test]
    fn softmax_matches_reference_bit_for_bit() {
        let mut s = 12345u32;
        let mut next = || {
            s = s.wrapping_mul(1664525).wrapping_add(1013904223);
            s
        };
        for len in (1..80).chain([255, 256, 257, 1000]) {
            for scale in [0.01f32, 1.0, 30.0, 100.0, 300.0] {
                let x: Vec<f32> = (0..len)
                    .map(|i| {
                        let r = next();
                        if r % 7 == 0 && i + 1 != len {
                            f32::NEG_INFINITY
                        } else {
                            ((r >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0) * scale
                        }
                    })
                    .collect();
                let mut want = x.clone();
                crate::ggml_math::softmax_inplace(&mut want);
                let mut got = x;
                softmax(true, &mut got);
                for (a, b) in got.iter().zip(&want) {
                    assert_eq!(a.to_bits(), b.to_bits(), "len {len}, scale {scale}");
                }
            }
        }
    }

    /// The SIMD GeGLU against the scalar code, bit for bit: every f16 value as input (so every
    /// table entry), values around ±10, random floats that round to f16 both ways, NaN and
    /// infinities, with factors including zero and infinity.
    #[test]
    fn geglu_matches_scalar_bit_for_bit() {
        let mut x: Vec<f32> = (0..=u16::MAX)
            .map(|b| half::f16::from_bits(b).to_f32())
            .collect();
        let mut s = 99u32;
        for _ in 0..20_000 {
            s = s.wrapping_mul(1664525).wrapping_add(1013904223);
            x.push(((s >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0) * 12.0);
        }
        x.extend([
            -10.0,
            10.0,
            -10.000001,
            9.999999,
            f32::NAN,
            -f32::NAN,
            f32::INFINITY,
        ]);
        x.extend([f32::NEG_INFINITY, 0.0, -0.0, 1e-30, -1e-30]);
        for len in [x.len(), x.len() - 5, 15, 17] {
            let up: Vec<f32> = (0..len)
                .map(|i| match i % 7 {
                    0 => 0.0,
                    1 => f32::INFINITY,
                    2 => -1.5,
                    _ => 0.25 + i as f32 * 1e-3,
                })
                .collect();
            let mut want = x[..len].to_vec();
            geglu_scalar(&mut want, &up);
            let mut got = x[..len].to_vec();
            geglu(&mut got, &up);
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                    "len {len} [{i}] x = {}: {a} vs {b}",
                    x[i]
                );
            }
        }
    }

    /// The SIMD SwiGLU against the scalar reference, bit for bit, over lengths that exercise
    /// every tail and values spanning `exp`'s three regimes, zeros and infinities.
    #[test]
    fn swiglu_matches_reference_bit_for_bit() {
        let mut s = 777u32;
        let mut next = || {
            s = s.wrapping_mul(1664525).wrapping_add(1013904223);
            s
        };
        for len in (1..70).chain([896, 4864, 4867]) {
            for scale in [0.01f32, 1.0, 30.0, 100.0, 300.0] {
                let mut val = || ((next() >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0) * scale;
                let mut x: Vec<f32> = (0..len).map(|_| val()).collect();
                let up: Vec<f32> = (0..len).map(|_| val()).collect();
                if len > 10 {
                    x[3] = 0.0;
                    x[5] = -0.0;
                    x[7] = f32::INFINITY;
                    x[9] = f32::NEG_INFINITY;
                }
                let mut want = x.clone();
                crate::ggml_math::swiglu_inplace(&mut want, &up);
                let mut got = x;
                swiglu(&mut got, &up);
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                        "len {len}, scale {scale}, [{i}]: {a} vs {b}"
                    );
                }
            }
        }
    }

    /// ggml's `exp` on sixteen lanes against the scalar one, over a sweep of inputs including
    /// both scaling branches, overflow, underflow, subnormal results, zeros, infinities and NaN.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn exp16_matches_ggml_expf() {
        if !simd_available() {
            return;
        }
        let mut xs: Vec<f32> = (-40_000..40_000).map(|i| i as f32 * 0.0061).collect();
        xs.extend([
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            88.7,
            88.8,
            -87.4,
        ]);
        xs.extend([
            -103.0, -103.9, -104.0, 126.5, -126.5, 133.0, -133.0, 192.5, -192.5,
        ]);
        xs.extend([1e-30, -1e-30, f32::MIN_POSITIVE, f32::MAX, f32::MIN]);
        for chunk in xs.chunks(16) {
            let mut lanes = [0f32; 16];
            lanes[..chunk.len()].copy_from_slice(chunk);
            let mut out = [0f32; 16];
            // SAFETY: AVX-512F is present (checked above).
            unsafe {
                use std::arch::x86_64::*;
                let v = x86::ggml_expf16(_mm512_loadu_ps(lanes.as_ptr()));
                _mm512_storeu_ps(out.as_mut_ptr(), v);
            }
            for (&x, &y) in lanes.iter().zip(&out) {
                let want = crate::ggml_math::ggml_expf(x);
                let same = want.to_bits() == y.to_bits() || (want.is_nan() && y.is_nan());
                assert!(same, "exp({x}): {y} vs {want}");
            }
        }
    }
}
