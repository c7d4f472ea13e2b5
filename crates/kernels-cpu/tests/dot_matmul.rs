//! vec_dot and matmul against f64 references built from dequantized data.

mod common;

use common::{random_weights, Rng, WEIGHT_TYPES};
use synaptix_core::DType;
use synaptix_kernels_cpu::{
    dequantize, matmul, matmul_many, matmul_quantized, quantize_acts, vec_dot, QuantizedActs,
    WeightView,
};

fn dequant(dtype: DType, bytes: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    dequantize(dtype, bytes, &mut out).unwrap();
    out
}

/// The activation values the kernels actually use.
fn act_values(a: &QuantizedActs) -> Vec<f32> {
    dequant(a.dtype(), &a.to_ggml_bytes(), a.len())
}

fn row_len(dtype: DType) -> usize {
    if dtype.block_len() == 1 {
        1000
    } else {
        1024
    }
}

/// Bound on f32 rounding inside a dot of `k` terms, relative to the problem's scale.
fn rounding_tol(w: &[f32], a: &[f32]) -> f64 {
    let wmax = w.iter().fold(0f64, |m, v| m.max(v.abs() as f64));
    let asum: f64 = a.iter().map(|v| v.abs() as f64).sum();
    2e-6 * wmax * asum + 1e-30
}

/// Q4_1 / Q5_1 × Q8_1: like ggml, the kernels take the min term from the activation block's
/// `s = fp16(d * Σq)` (unrounded `d`) rather than from the dequantized values. Returns
/// `Σ_b m_b * (s_b - d16_b * Σq_b)`, the difference that makes.
fn q8_1_min_term_shift(dtype: DType, w_row: &[u8], a: &QuantizedActs) -> f64 {
    if a.dtype() != DType::Q8_1 {
        return 0.0;
    }
    let f16 = |b: &[u8], at: usize| half::f16::from_le_bytes([b[at], b[at + 1]]).to_f64();
    let ab = a.to_ggml_bytes();
    w_row
        .chunks_exact(dtype.block_bytes())
        .zip(ab.chunks_exact(36))
        .map(|(wb, qb)| {
            let sum_q: i32 = qb[4..].iter().map(|&v| v as i8 as i32).sum();
            f16(wb, 2) * (f16(qb, 2) - f16(qb, 0) * sum_q as f64)
        })
        .sum()
}

fn dot64(w: &[f32], a: &[f32]) -> f64 {
    w.iter().zip(a).map(|(x, y)| *x as f64 * *y as f64).sum()
}

#[test]
fn vec_dot_matches_dequantized_dot() {
    let mut rng = Rng::new(21);
    for dtype in WEIGHT_TYPES {
        let k = row_len(dtype);
        for trial in 0..3 {
            let w = random_weights(&mut rng, dtype, 1, k);
            let x = rng.normal_vec(k, [1.0, 0.01, 30.0][trial]);
            let acts = quantize_acts(dtype, &x).unwrap();
            let got = vec_dot(dtype, &w, &acts).unwrap() as f64;

            let wd = dequant(dtype, &w, k);
            let ad = act_values(&acts);
            // 1) Same inputs as the kernel: only f32 rounding separates the results.
            let exact = dot64(&wd, &ad) + q8_1_min_term_shift(dtype, &w, &acts);
            let tol = rounding_tol(&wd, &ad);
            assert!(
                (got - exact).abs() <= tol,
                "{dtype}: {got} vs {exact} (tol {tol})"
            );

            // 2) Against the unquantized activations: within the activation quantization error.
            let qerr: f64 = wd
                .iter()
                .zip(x.iter().zip(&ad))
                .map(|(w, (x, a))| (*w as f64 * (*x as f64 - *a as f64)).abs())
                .sum();
            let full = dot64(&wd, &x);
            let shift = q8_1_min_term_shift(dtype, &w, &acts).abs();
            assert!(
                (got - full).abs() <= qerr + shift + tol,
                "{dtype}: {got} vs {full} (quantization bound {qerr})"
            );
            // The activation quantization error itself is what ggml's quantizers give.
            let bl = acts.dtype().block_len();
            for (xb, ab) in x.chunks(bl.max(32)).zip(ad.chunks(bl.max(32))) {
                let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
                for (xv, av) in xb.iter().zip(ab) {
                    let err = (xv - av).abs();
                    let bound = match acts.dtype() {
                        DType::F32 => 0.0,
                        DType::F16 => xv.abs() * 2f32.powi(-11) + 6e-8,
                        DType::BF16 => xv.abs() * 2f32.powi(-8),
                        // Half a step of amax/127, plus the f16 rounding of the scale.
                        _ => amax / 127.0 * 0.57,
                    };
                    assert!(err <= bound, "{dtype}: |{xv} - {av}| > {bound}");
                }
            }
        }
    }
}

fn check_matmul(dtype: DType, n: usize, k: usize, m: usize, seed: u64) {
    let mut rng = Rng::new(seed);
    let w = random_weights(&mut rng, dtype, n, k);
    let x = rng.normal_vec(m * k, 1.0);
    let mut y = vec![f32::NAN; m * n];
    let view = WeightView {
        dtype,
        data: &w,
        rows: n,
        cols: k,
    };
    matmul(view, &x, m, &mut y).unwrap();

    let row_bytes = w.len() / n;
    let wd = dequant(dtype, &w, n * k);
    for i in 0..m {
        let acts = quantize_acts(dtype, &x[i * k..(i + 1) * k]).unwrap();
        let ad = act_values(&acts);
        for j in 0..n {
            let wr = &w[j * row_bytes..(j + 1) * row_bytes];
            let want = vec_dot(dtype, wr, &acts).unwrap();
            let got = y[i * n + j];
            assert_eq!(got.to_bits(), want.to_bits(), "{dtype} m={m} [{i},{j}]");
            let wdr = &wd[j * k..(j + 1) * k];
            let naive = dot64(wdr, &ad) + q8_1_min_term_shift(dtype, wr, &acts);
            let tol = rounding_tol(wdr, &ad);
            assert!((got as f64 - naive).abs() <= tol, "{dtype} m={m} [{i},{j}]");
        }
    }
}

#[test]
fn matmul_m1_and_m7_match_naive() {
    for (t, dtype) in WEIGHT_TYPES.into_iter().enumerate() {
        let k = if dtype.block_len() == 256 { 512 } else { 320 };
        // Small (runs serially) and large enough to be split across the rayon pool.
        for (n, seed) in [(9, 1u64), (301, 2)] {
            for m in [1, 7] {
                check_matmul(dtype, n, k, m, seed * 100 + t as u64);
            }
        }
    }
}

#[test]
fn matmul_many_rows_uses_tiles() {
    // m > 16 exercises more than one tile of activation rows.
    check_matmul(DType::Q4K, 40, 256, 37, 9);
    check_matmul(DType::Q8_0, 40, 64, 20, 10);
}

#[test]
fn matmul_degenerate_shapes() {
    let view = WeightView {
        dtype: DType::Q8_0,
        data: &[],
        rows: 0,
        cols: 64,
    };
    let mut y: [f32; 0] = [];
    matmul(view, &[0.0; 128], 2, &mut y).unwrap();
    let view = WeightView {
        dtype: DType::F32,
        data: &[],
        rows: 3,
        cols: 0,
    };
    let mut y = [1.0f32; 6];
    matmul(view, &[], 2, &mut y).unwrap();
    assert_eq!(y, [0.0; 6]);
}

#[test]
fn matmul_quantized_reuses_activation_rows() {
    let mut rng = Rng::new(77);
    let (n, k, m) = (33, 512, 3);
    let x = rng.normal_vec(m * k, 1.0);
    for dtype in [DType::Q4K, DType::Q6K, DType::Q8_0, DType::F32] {
        let w = random_weights(&mut rng, dtype, n, k);
        let view = WeightView {
            dtype,
            data: &w,
            rows: n,
            cols: k,
        };
        let acts: Vec<QuantizedActs> = x
            .chunks(k)
            .map(|r| quantize_acts(dtype, r).unwrap())
            .collect();
        let mut a = vec![0f32; m * n];
        let mut b = vec![0f32; m * n];
        matmul(view, &x, m, &mut a).unwrap();
        matmul_quantized(view, &acts, &mut b).unwrap();
        assert_eq!(a, b, "{dtype}");
    }
}

/// Every matmul output for `dtype` equals, bit for bit, the single dot of its weight row and
/// activation row (`vec_dot`, the decode path), over activation-row counts that fill one or two
/// 16-row vectors partially or exactly, rows of very different scales, and zero rows: the
/// prefill kernels may regroup integer work but not the float chain.
fn assert_matmul_equals_vec_dot(rng: &mut Rng, dtype: DType, shapes: &[(usize, usize)]) {
    for &(rows, k) in shapes {
        let w = random_weights(rng, dtype, rows, k);
        let row_bytes = w.len() / rows;
        for m in [2, 3, 16, 17, 31, 32, 33, 48, 70] {
            let mut x = rng.normal_vec(m * k, 1.0);
            for (i, row) in x.chunks_mut(k).enumerate() {
                match i % 5 {
                    1 => row.iter_mut().for_each(|v| *v *= 1e4),
                    3 => row.fill(0.0),
                    _ => {}
                }
            }
            let mut y = vec![0f32; m * rows];
            let view = WeightView {
                dtype,
                data: &w,
                rows,
                cols: k,
            };
            matmul(view, &x, m, &mut y).unwrap();
            for (i, xr) in x.chunks(k).enumerate() {
                let acts = quantize_acts(dtype, xr).unwrap();
                for j in 0..rows {
                    let want =
                        vec_dot(dtype, &w[j * row_bytes..(j + 1) * row_bytes], &acts).unwrap();
                    let got = y[i * rows + j];
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{dtype} rows {rows} k {k} m {m}: y[{i}][{j}] = {got:e}, vec_dot {want:e}"
                    );
                }
            }
        }
    }
}

/// The legacy formats (one-lane-per-row prefill kernel with VNNI).
#[test]
fn matmul_equals_vec_dot_for_every_row_count() {
    let mut rng = Rng::new(0x5eed_1e6a);
    for dtype in [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
    ] {
        assert_matmul_equals_vec_dot(&mut rng, dtype, &[(3, 32), (6, 640), (41, 96)]);
    }
}

/// The k-quants with a prefill kernel of their own (Q4_K, Q6_K).
#[test]
fn kquant_matmul_equals_vec_dot_for_every_row_count() {
    let mut rng = Rng::new(0x5eed_4b6b);
    for dtype in [DType::Q4K, DType::Q6K] {
        assert_matmul_equals_vec_dot(&mut rng, dtype, &[(3, 256), (6, 1024), (41, 256)]);
    }
}

/// `matmul_many` (one quantization per activation format, one parallel region for a single
/// row) gives every output bit for bit what a separate `matmul` gives, for matrices whose
/// formats need different activation formats, sizes on both sides of the parallel threshold,
/// one row (the decode team) and several (tiles and transposes); mismatched shapes are errors.
#[test]
fn matmul_many_equals_separate_matmuls() {
    let k = 512;
    let specs = [
        (DType::Q5_0, 700),
        (DType::Q4K, 130),
        (DType::Q8_0, 9),
        (DType::F16, 64),
    ];
    let mut rng = Rng::new(77);
    let weights: Vec<Vec<u8>> = specs
        .iter()
        .map(|&(dtype, n)| random_weights(&mut rng, dtype, n, k))
        .collect();
    let views: Vec<WeightView> = specs
        .iter()
        .zip(&weights)
        .map(|(&(dtype, n), w)| WeightView {
            dtype,
            data: w,
            rows: n,
            cols: k,
        })
        .collect();
    for m in [1, 3, 20] {
        let x = rng.normal_vec(m * k, 1.0);
        let mut outs: Vec<Vec<f32>> = specs.iter().map(|&(_, n)| vec![f32::NAN; m * n]).collect();
        {
            let mut ys: Vec<&mut [f32]> = outs.iter_mut().map(|y| y.as_mut_slice()).collect();
            matmul_many(&views, &x, m, &mut ys).unwrap();
        }
        for (view, got) in views.iter().zip(&outs) {
            let mut want = vec![f32::NAN; m * view.rows];
            matmul(*view, &x, m, &mut want).unwrap();
            let same = got
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "{} [{} x {k}] m={m}: matmul_many differs from matmul",
                view.dtype, view.rows
            );
        }
    }
    let x = vec![0f32; k];
    let mut short = [0f32; 3];
    assert!(matmul_many(&views[..1], &x, 1, &mut [&mut short[..]]).is_err());
    assert!(matmul_many(&views[..1], &x, 1, &mut []).is_err());
}
