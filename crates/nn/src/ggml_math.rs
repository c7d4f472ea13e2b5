//! Element-wise math exactly as llama.cpp's portable x86-64 build evaluates it.
//!
//! That build has SSE2 (part of the x86-64 baseline) and no FMA, so SiLU and softmax run ggml's
//! 4-lane polynomial `exp` on groups of four elements and the C library's `expf` on the tail.
//! Reproducing both, lane by lane with separate multiplies and adds, keeps synaptix's outputs
//! bit-identical to that reference (a one-ulp difference here grows into different tokens).

/// ggml's vectorised `exp` for one lane: range reduction by `ln 2`, a degree-5 polynomial,
/// special scaling for |n| > 126, flush beyond ±192 (max error 1.45 ulp + 0.5).
pub fn ggml_expf(x: f32) -> f32 {
    let f = f32::from_bits;
    let madd = |a: f32, b: f32, c: f32| a * b + c;
    let nmadd = |a: f32, b: f32, c: f32| c - a * b;
    let r = f(0x4b40_0000); // 0x1.8p23: adding it rounds to an integer
    let z = madd(x, f(0x3fb8_aa3b), r); // x * log2(e) + r
    let n = z - r;
    let b = nmadd(n, f(0x35bf_be8e), nmadd(n, f(0x3f31_7200), x));
    let e = z.to_bits().wrapping_shl(23);
    let k = f(e.wrapping_add(1f32.to_bits()));
    let u = b * b;
    let j = madd(
        madd(
            madd(f(0x3c07_2010), b, f(0x3d2b_9f17)),
            u,
            madd(f(0x3e2a_af33), b, f(0x3eff_fedb)),
        ),
        u,
        f(0x3f7f_fff6) * b,
    );
    if n.abs() <= 126.0 {
        return madd(j, k, k);
    }
    let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
    let s1 = f(g.wrapping_add(0x7f00_0000));
    let s2 = f(e.wrapping_sub(g));
    if n.abs() > 192.0 {
        s1 * s1
    } else {
        madd(s2, j, s2) * s1
    }
}

/// `silu(x) * g` over a row: groups of four through [`ggml_expf`], the tail through `expf`.
pub fn swiglu_inplace(gate: &mut [f32], up: &[f32]) {
    let vectorised = gate.len() / 4 * 4;
    for (i, (x, g)) in gate.iter_mut().zip(up).enumerate() {
        let e = if i < vectorised {
            ggml_expf(0.0 - *x)
        } else {
            (-*x).exp()
        };
        *x = *x / (1.0 + e) * g;
    }
}

/// Softmax over `x` in place, as ggml computes it for attention: `exp(x - max)` in groups of
/// four (index 0 starts a group) summed `(v0+v1)+(v2+v3)` in f32 then into an f64 total, the
/// tail with `expf`; then every value times `(f32)(1 / total)`. Entries of `-inf` (masked
/// positions) contribute exactly zero, so a caller may pass a row whose masked entries are
/// `-inf` at their absolute positions.
pub fn softmax_inplace(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let vectorised = x.len() / 4 * 4;
    let mut sum = 0f64;
    for group in x[..vectorised].chunks_exact_mut(4) {
        for v in group.iter_mut() {
            *v = ggml_expf(*v - max);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ggml_expf_is_accurate_and_saturates() {
        for i in -2000..2000 {
            let x = i as f32 * 0.043;
            let (a, b) = (ggml_expf(x), x.exp());
            assert!((a - b).abs() <= 4e-7 * b, "{x}: {a} vs {b}");
        }
        assert_eq!(ggml_expf(f32::NEG_INFINITY), 0.0);
        assert_eq!(ggml_expf(-200.0), 0.0);
        assert_eq!(ggml_expf(0.0), 1.0);
        assert!(ggml_expf(100.0).is_infinite());
    }

    #[test]
    fn softmax_sums_to_one_and_ignores_masked_entries() {
        let mut x = vec![1.0, 2.0, f32::NEG_INFINITY, 0.5, -1.0, 3.0];
        softmax_inplace(&mut x);
        let s: f32 = x.iter().sum();
        assert!((s - 1.0).abs() < 1e-6);
        assert_eq!(x[2], 0.0);
        assert!(x[5] > x[1] && x[1] > x[0]);
    }
}
