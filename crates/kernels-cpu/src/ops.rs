//! Small f32 ops used by the models. Rows are contiguous; shapes are checked and mismatches are
//! [`Error::ShapeMismatch`].

use synaptix_core::{Error, Result};

use crate::cpu::path;
#[cfg(target_arch = "x86_64")]
use crate::cpu::Path;
use crate::quant::float_dot;

fn mismatch(op: &'static str, detail: String) -> Error {
    Error::ShapeMismatch { op, detail }
}

fn check_same(op: &'static str, a: usize, b: usize) -> Result<()> {
    if a != b {
        return Err(mismatch(op, format!("lengths differ: {a} vs {b}")));
    }
    Ok(())
}

fn check_rows(op: &'static str, len: usize, dim: usize, weight: Option<&[f32]>) -> Result<()> {
    if dim == 0 || !len.is_multiple_of(dim) {
        return Err(mismatch(op, format!("{len} values are not rows of {dim}")));
    }
    if let Some(w) = weight {
        check_same(op, w.len(), dim)?;
    }
    Ok(())
}

/// `1 / sqrt(mean(x²) + eps)` like ggml: squares summed in f64, the rest in f32.
#[inline]
fn rms_scale(row: &[f32], eps: f32) -> f32 {
    let sum: f64 = row.iter().map(|&v| (v * v) as f64).sum();
    let mean = (sum / row.len() as f64) as f32;
    1.0 / (mean + eps).sqrt()
}

/// RMS norm of each row of `dim` values: `out = x * rsqrt(mean(x²) + eps) * weight` (no weight:
/// factor 1). Weight conventions such as Gemma's `1 + w` are the caller's: pass adjusted
/// weights.
pub fn rms_norm(
    x: &[f32],
    dim: usize,
    weight: Option<&[f32]>,
    eps: f32,
    out: &mut [f32],
) -> Result<()> {
    check_rows("rms_norm", x.len(), dim, weight)?;
    check_same("rms_norm", x.len(), out.len())?;
    for (xr, yr) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        let s = rms_scale(xr, eps);
        match weight {
            Some(w) => {
                for ((y, &v), &g) in yr.iter_mut().zip(xr).zip(w) {
                    *y = v * s * g;
                }
            }
            None => {
                for (y, &v) in yr.iter_mut().zip(xr) {
                    *y = v * s;
                }
            }
        }
    }
    Ok(())
}

/// [`rms_norm`] in place.
pub fn rms_norm_inplace(x: &mut [f32], dim: usize, weight: Option<&[f32]>, eps: f32) -> Result<()> {
    check_rows("rms_norm_inplace", x.len(), dim, weight)?;
    for xr in x.chunks_exact_mut(dim) {
        let s = rms_scale(xr, eps);
        match weight {
            Some(w) => xr.iter_mut().zip(w).for_each(|(v, &g)| *v = *v * s * g),
            None => xr.iter_mut().for_each(|v| *v *= s),
        }
    }
    Ok(())
}

/// Softmax of one row in place: `exp(x - max)`, summed in f64, scaled by `1 / sum`. A row
/// of all `-inf` yields NaN, as in ggml.
pub fn softmax_inplace(row: &mut [f32]) {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let mut sum = 0f64;
    for v in row.iter_mut() {
        *v = (*v - max).exp();
        sum += *v as f64;
    }
    scale_inplace(row, (1.0 / sum) as f32);
}

/// SiLU: `x / (1 + exp(-x))`.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

const GELU_COEF_A: f32 = 0.044715;
const SQRT_2_OVER_PI: f32 = 0.797_884_6;

/// GELU, tanh approximation: `0.5 x (1 + tanh(sqrt(2/π) x (1 + 0.044715 x²)))` (ggml's
/// formula; ggml may use an f16 table for it, which this does not reproduce).
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)).tanh())
}

pub fn silu_inplace(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = silu(*v));
}

pub fn gelu_tanh_inplace(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = gelu_tanh(*v));
}

/// `out = silu(gate) * up`.
pub fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) -> Result<()> {
    check_same("swiglu", gate.len(), up.len())?;
    check_same("swiglu", gate.len(), out.len())?;
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = silu(g) * u;
    }
    Ok(())
}

/// `out = gelu_tanh(gate) * up`.
pub fn geglu(gate: &[f32], up: &[f32], out: &mut [f32]) -> Result<()> {
    check_same("geglu", gate.len(), up.len())?;
    check_same("geglu", gate.len(), out.len())?;
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = gelu_tanh(g) * u;
    }
    Ok(())
}

/// `dst += src`.
pub fn add_inplace(dst: &mut [f32], src: &[f32]) -> Result<()> {
    check_same("add_inplace", dst.len(), src.len())?;
    dst.iter_mut().zip(src).for_each(|(d, &s)| *d += s);
    Ok(())
}

/// `dst *= s`.
pub fn scale_inplace(dst: &mut [f32], s: f32) {
    dst.iter_mut().for_each(|d| *d *= s);
}

/// f32 dot product. Same summation order on every kernel path (32 FMA lanes, fixed
/// reduction), so the result does not depend on the CPU.
pub fn dot(a: &[f32], b: &[f32]) -> Result<f32> {
    check_same("dot", a.len(), b.len())?;
    Ok(float_dot(path(), a, b))
}

/// `y += alpha * x`, each element with one fused multiply-add (identical on every path).
pub fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) -> Result<()> {
    check_same("axpy", x.len(), y.len())?;
    #[cfg(target_arch = "x86_64")]
    if path() >= Path::Avx2 {
        // SAFETY: the Avx2 path implies AVX2 + FMA support; lengths are equal.
        unsafe { axpy_avx2(alpha, x, y) };
        return Ok(());
    }
    axpy_scalar(alpha, x, y);
    Ok(())
}

fn axpy_scalar(alpha: f32, x: &[f32], y: &mut [f32]) {
    y.iter_mut()
        .zip(x)
        .for_each(|(v, &u)| *v = alpha.mul_add(u, *v));
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn axpy_avx2(alpha: f32, x: &[f32], y: &mut [f32]) {
    use core::arch::x86_64::*;
    let n = x.len().min(y.len());
    let av = _mm256_set1_ps(alpha);
    let (xp, yp) = (x.as_ptr(), y.as_mut_ptr());
    let mut i = 0;
    while i + 8 <= n {
        let r = _mm256_fmadd_ps(av, _mm256_loadu_ps(xp.add(i)), _mm256_loadu_ps(yp.add(i)));
        _mm256_storeu_ps(yp.add(i), r);
        i += 8;
    }
    axpy_scalar(alpha, &x[i..n], &mut y[i..n]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::Path;
    use crate::testutil::Rng;

    fn close(a: f32, b: f32, rel: f32) -> bool {
        (a - b).abs() <= rel * a.abs().max(b.abs()).max(1e-6)
    }

    #[test]
    fn rms_norm_matches_formula() {
        let mut rng = Rng::new(1);
        let (rows, dim) = (3, 37);
        let x = rng.normal_vec(rows * dim, 2.0);
        let w = rng.normal_vec(dim, 1.0);
        let mut out = vec![0.0; rows * dim];
        rms_norm(&x, dim, Some(&w), 1e-6, &mut out).unwrap();
        let mut inplace = x.clone();
        rms_norm_inplace(&mut inplace, dim, Some(&w), 1e-6).unwrap();
        assert_eq!(out, inplace);
        for r in 0..rows {
            let xr = &x[r * dim..(r + 1) * dim];
            let ms = xr.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / dim as f64;
            let s = 1.0 / (ms + 1e-6).sqrt();
            for i in 0..dim {
                let want = (xr[i] as f64 * s * w[i] as f64) as f32;
                assert!(
                    close(out[r * dim + i], want, 1e-5),
                    "{} vs {want}",
                    out[r * dim + i]
                );
            }
        }
        let mut no_w = vec![0.0; rows * dim];
        rms_norm(&x, dim, None, 1e-6, &mut no_w).unwrap();
        let ms = x[..dim].iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / dim as f64;
        assert!(close(
            no_w[0],
            (x[0] as f64 / (ms + 1e-6).sqrt()) as f32,
            1e-5
        ));
        assert!(rms_norm(&x, 36, None, 1e-6, &mut out).is_err());
        assert!(rms_norm(&x, dim, Some(&w[1..]), 1e-6, &mut out).is_err());
        assert!(rms_norm(&x, dim, None, 1e-6, &mut out[1..]).is_err());
    }

    #[test]
    fn softmax_matches_formula() {
        let mut rng = Rng::new(2);
        let x = rng.normal_vec(50, 3.0);
        let mut y = x.clone();
        softmax_inplace(&mut y);
        let m = x.iter().cloned().fold(f32::MIN, f32::max) as f64;
        let z: f64 = x.iter().map(|&v| (v as f64 - m).exp()).sum();
        for (a, &b) in y.iter().zip(&x) {
            assert!(close(*a, ((b as f64 - m).exp() / z) as f32, 1e-5));
        }
        assert!((y.iter().map(|&v| v as f64).sum::<f64>() - 1.0).abs() < 1e-5);
        let mut big = [1000.0f32, 1000.0];
        softmax_inplace(&mut big);
        assert_eq!(big, [0.5, 0.5]);
        let mut empty: [f32; 0] = [];
        softmax_inplace(&mut empty);
    }

    #[test]
    fn activations_match_formulas() {
        for i in -80..=80 {
            let x = i as f32 * 0.1;
            let xd = x as f64;
            let silu_ref = xd / (1.0 + (-xd).exp());
            assert!(close(silu(x), silu_ref as f32, 1e-6), "silu({x})");
            let inner = (2.0 / std::f64::consts::PI).sqrt() * (xd + 0.044715 * xd.powi(3));
            let gelu_ref = 0.5 * xd * (1.0 + inner.tanh());
            assert!((gelu_tanh(x) as f64 - gelu_ref).abs() < 1e-6 + 1e-6 * gelu_ref.abs());
        }
        let g = [-2.0f32, -0.5, 0.0, 0.7, 3.0];
        let u = [1.5f32, -1.0, 2.0, 0.25, -3.0];
        let mut o = [0.0; 5];
        swiglu(&g, &u, &mut o).unwrap();
        for i in 0..5 {
            assert_eq!(o[i], silu(g[i]) * u[i]);
        }
        geglu(&g, &u, &mut o).unwrap();
        for i in 0..5 {
            assert_eq!(o[i], gelu_tanh(g[i]) * u[i]);
        }
        let mut s = g;
        silu_inplace(&mut s);
        assert_eq!(s[3], silu(0.7));
        let mut s = g;
        gelu_tanh_inplace(&mut s);
        assert_eq!(s[4], gelu_tanh(3.0));
        assert!(swiglu(&g, &u[1..], &mut o).is_err());
        assert!(geglu(&g, &u, &mut o[1..]).is_err());
    }

    #[test]
    fn elementwise_and_dot() {
        let mut rng = Rng::new(3);
        for n in [0, 1, 7, 31, 32, 33, 100, 1000] {
            let a = rng.normal_vec(n, 1.0);
            let b = rng.normal_vec(n, 1.0);
            let want: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
            let got = dot(&a, &b).unwrap();
            assert!(
                (got as f64 - want).abs() < 1e-5 * (n as f64).max(1.0),
                "n={n}"
            );
            for p in Path::all_supported() {
                assert_eq!(float_dot(p, &a, &b).to_bits(), got.to_bits(), "{p:?} n={n}");
            }

            let mut y = b.clone();
            axpy(0.5, &a, &mut y).unwrap();
            for i in 0..n {
                assert_eq!(y[i], 0.5f32.mul_add(a[i], b[i]));
            }
            let mut y = b.clone();
            add_inplace(&mut y, &a).unwrap();
            for i in 0..n {
                assert_eq!(y[i], b[i] + a[i]);
            }
            scale_inplace(&mut y, 2.0);
            for i in 0..n {
                assert_eq!(y[i], (b[i] + a[i]) * 2.0);
            }
        }
        assert!(dot(&[1.0], &[]).is_err());
        assert!(axpy(1.0, &[1.0], &mut []).is_err());
        assert!(add_inplace(&mut [1.0], &[]).is_err());
    }
}
