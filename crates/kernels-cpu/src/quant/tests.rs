//! Unit tests needing crate internals: every SIMD path against the scalar path (random data
//! beyond the ggml goldens of tests/fixtures.rs), and the activation quantizers' invariants.

use synaptix_core::DType;

use super::*;
use crate::testutil::{random_weights, scale_offsets, Rng, DOT_TYPES};

/// Row lengths covering whole SIMD groups and tails: 32-blocks not a multiple of 8, float rows
/// not a multiple of 32.
fn lengths(dtype: DType) -> Vec<usize> {
    match dtype.block_len() {
        1 => vec![1, 31, 32, 33, 100, 640, 1000],
        32 => vec![32, 224, 256, 288, 640, 4096],
        128 => vec![128, 640, 2048],
        _ => vec![256, 768, 2048],
    }
}

/// Single dots and block kernels of every path against the scalar kernel.
#[test]
fn simd_paths_match_scalar_bitwise() {
    let mut rng = Rng::new(11);
    let paths = Path::all_supported();
    eprintln!("paths tested: {paths:?}");
    for dtype in DOT_TYPES {
        let scalar = scalar_kernel(dtype).expect("scalar kernel");
        for k in lengths(dtype) {
            let rows = 11;
            let w = random_weights(&mut rng, dtype, rows, k);
            let rb = w.len() / rows;
            let acts: Vec<QuantizedActs> = (0..3)
                .map(|t| {
                    let x = rng.normal_vec(k, [1.0, 1e-3, 40.0][t]);
                    quantize_acts_on(Path::Scalar, dtype, &x).unwrap()
                })
                .collect();
            let want: Vec<u32> = (0..rows)
                .flat_map(|j| acts.iter().map(move |a| (j, a)))
                .map(|(j, a)| unsafe { scalar(&w[j * rb..(j + 1) * rb], a) }.to_bits())
                .collect();
            for &p in &paths {
                let kern = kernels_for(dtype, p).unwrap();
                let mut got = vec![0u32; rows * acts.len()];
                for j in 0..rows {
                    for (i, a) in acts.iter().enumerate() {
                        got[j * acts.len() + i] =
                            unsafe { (kern.dot)(&w[j * rb..(j + 1) * rb], a) }.to_bits();
                    }
                }
                assert_eq!(got, want, "{dtype} {p:?} k={k}: dot");
                let mut out = vec![f32::NAN; rows * acts.len()];
                unsafe { kern.run_block(&w, rb, rows, &acts, &mut out, acts.len()) };
                let got: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
                assert_eq!(got, want, "{dtype} {p:?} k={k}: block");
            }
        }
    }
}

#[test]
fn extreme_quants_do_not_saturate() {
    // Every quant byte 0x00 / 0x80 / 0xff (only the half scales kept) against ±127
    // activations: the 8-bit products must not saturate on any path (maddubs pairs stay below
    // 2^15), so all paths agree.
    let paths = Path::all_supported();
    for dtype in DOT_TYPES.into_iter().filter(|d| d.is_quantized()) {
        let k = 512;
        let scales = random_weights(&mut Rng::new(6), dtype, 1, k);
        for fill in [0x00u8, 0x80, 0xff] {
            let mut w = vec![fill; scales.len()];
            let bb = dtype.block_bytes();
            for (blk, sblk) in w.chunks_exact_mut(bb).zip(scales.chunks_exact(bb)) {
                for &o in scale_offsets(dtype) {
                    blk[o..o + 2].copy_from_slice(&sblk[o..o + 2]);
                }
            }
            for sign in [1.0f32, -1.0] {
                let x: Vec<f32> = (0..k)
                    .map(|i| if i % 3 == 0 { sign } else { -sign })
                    .collect();
                let acts = quantize_acts(dtype, &x).unwrap();
                assert!(acts.qs.iter().all(|&q| q == 127 || q == -127));
                let want = unsafe { scalar_kernel(dtype).unwrap()(&w, &acts) };
                for &p in &paths {
                    let got = unsafe { (kernels_for(dtype, p).unwrap().dot)(&w, &acts) };
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{dtype} {p:?} fill={fill:#x}"
                    );
                }
            }
        }
    }
}

#[test]
fn q8_0_and_q8_1_quantizers() {
    let mut rng = Rng::new(3);
    let mut x = rng.normal_vec(96, 2.0);
    x[32..64].fill(0.0);
    let a0 = quantize_acts(DType::Q8_0, &x).unwrap();
    let a1 = quantize_acts(DType::Q4_1, &x).unwrap();
    assert_eq!(a0.dtype(), DType::Q8_0);
    assert_eq!(a1.dtype(), DType::Q8_1);
    assert_eq!(a0.qs, a1.qs);
    assert_eq!(a0.d, a1.d);
    assert_eq!(a0.d[1], 0.0);
    for b in 0..3 {
        let q = &a0.qs[32 * b..32 * b + 32];
        assert_eq!(a0.isum[b], q.iter().map(|&v| v as i32).sum::<i32>());
        assert!(q.iter().all(|&v| v != i8::MIN));
        let amax = x[32 * b..32 * b + 32]
            .iter()
            .fold(0f32, |m, v| m.max(v.abs()));
        if amax > 0.0 {
            assert!(q.iter().any(|v| v.abs() == 127));
        }
    }
    let bytes = a1.to_ggml_bytes();
    assert_eq!(bytes.len(), 3 * 36);
    // C's roundf: with amax = 127 (d = 1), halves round away from zero.
    let mut ties = vec![0f32; 32];
    ties[..6].copy_from_slice(&[127.0, 0.5, 1.5, 2.5, -2.5, -0.49999997]);
    for p in Path::all_supported() {
        let a = quantize_acts_on(p, DType::Q8_0, &ties).unwrap();
        assert_eq!(&a.qs[..6], &[127, 1, 2, 3, -3, 0], "{p:?}");
    }
    assert_eq!(a0.to_ggml_bytes().len(), 3 * 34);
    // s = fp16(Σq * d) with the unrounded d.
    let amax = x[..32].iter().fold(0f32, |m, v| m.max(v.abs()));
    let s = float::f16_to_f32(float::f32_to_f16(a1.isum[0] as f32 * (amax / 127.0)));
    assert_eq!(a1.s[0], s);
}

#[test]
fn q8_k_quantizer() {
    let mut rng = Rng::new(4);
    let mut x = rng.normal_vec(768, 1.0);
    x[256..512].fill(0.0);
    x[5] = -9.0; // the extreme value maps to -127 (iscale = -127 / max)
    let a = quantize_acts(DType::Q4K, &x).unwrap();
    assert_eq!(a.dtype(), DType::Q8K);
    assert_eq!(a.qs[5], -127);
    assert_eq!(a.d[1], 0.0);
    for b in 0..3 {
        for j in 0..16 {
            let s: i32 = a.qs[256 * b + 16 * j..256 * b + 16 * j + 16]
                .iter()
                .map(|&v| v as i32)
                .sum();
            assert_eq!(a.bsums[16 * b + j] as i32, s);
        }
        for i in 0..256 {
            let err = (a.d[b] * a.qs[256 * b + i] as f32 - x[256 * b + i]).abs();
            assert!(err <= a.d[b].abs() * 0.5001, "b={b} i={i}");
        }
    }
    // Round half to even: with max = -127, iscale = 1 and 0.5 -> 0, 1.5 -> 2, -2.5 -> -2.
    let mut x = vec![0f32; 256];
    x[0] = -127.0;
    x[1] = 0.5;
    x[2] = 1.5;
    x[3] = -2.5;
    for p in Path::all_supported() {
        let a = quantize_acts_on(p, DType::Q6K, &x).unwrap();
        assert_eq!(&a.qs[..4], &[-127, 0, 2, -2], "{p:?}");
        assert_eq!(a.to_ggml_bytes().len(), 292);
        // Pair order: elements i and i + 8 of each 16 side by side.
        assert_eq!(&a.pq[..4], &[-127, 0, 0, 0]);
        assert_eq!(&a.pq[2..8], &[0, 0, 2, 0, -2, 0]);
        assert_eq!(a.pq_abs[0], 127);
    }
}

#[test]
fn float_acts_are_rounded() {
    let x = [1.0f32 + 1.0 / 4096.0, 3.0e38, 0.1];
    let f = quantize_acts(DType::F16, &x).unwrap();
    assert_eq!(f.vals[0], 1.0);
    assert!(f.vals[1].is_infinite());
    assert_eq!(f.vals[2], half::f16::from_f32(0.1).to_f32());
    let b = quantize_acts(DType::BF16, &x).unwrap();
    assert_eq!(b.vals[2], half::bf16::from_f32(0.1).to_f32());
    let p = quantize_acts(DType::F32, &x).unwrap();
    assert_eq!(p.vals, x);
    assert_eq!(p.to_ggml_bytes().len(), 12);
}

#[test]
fn activation_quantizers_agree_across_paths() {
    let mut rng = Rng::new(8);
    let mut x = rng.normal_vec(1024, 3.0);
    // Rounding ties (amax 127 makes the Q8_0 / Q8_K scale exactly 1).
    for (i, v) in x[..32].iter_mut().enumerate() {
        *v = i as f32 - 15.5;
    }
    x[0] = -127.0;
    x[256..288].fill(0.0);
    x[300] = 1.0e-40;
    x[301] = 70000.0;
    x[302] = f32::from_bits(0x3380_0000); // half-way below the smallest half subnormal
                                          // NaN (float formats only: the Q8 quantizers are meant for NaN-free rows); ggml's F16
                                          // rounding makes every NaN 0x7e00 with its sign.
    let mut x_nan = x.clone();
    x_nan[303] = f32::NAN;
    x_nan[304] = -f32::from_bits(0x7fc1_2345);
    for wt in [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q8_0,
        DType::Q4_1,
        DType::Q4K,
    ] {
        let x = if wt.block_len() == 1 { &x_nan } else { &x };
        let want = {
            let mut a = quantize_acts(wt, x).unwrap();
            fill_acts(Path::Scalar, x, &mut a);
            a
        };
        for p in Path::all_supported() {
            let mut a = quantize_acts(wt, x).unwrap();
            fill_acts(p, x, &mut a);
            assert_eq!(a.qs, want.qs, "{wt} {p:?}");
            assert_eq!(a.isum, want.isum, "{wt} {p:?}");
            assert_eq!(a.bsums, want.bsums, "{wt} {p:?}");
            assert_eq!(a.pq, want.pq, "{wt} {p:?}");
            assert_eq!(a.pq_abs, want.pq_abs, "{wt} {p:?}");
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a.d), bits(&want.d), "{wt} {p:?}");
            assert_eq!(bits(&a.s), bits(&want.s), "{wt} {p:?}");
            assert_eq!(bits(&a.vals), bits(&want.vals), "{wt} {p:?}");
        }
    }
}

/// Degenerate activation rows quantize like ggml's portable build, where C's float to int8
/// conversion decides (bytes taken from it: the first 8 quants after each block header).
#[test]
fn non_finite_activations_follow_c_conversions() {
    let base: Vec<f32> = (0..256).map(|i| (i % 7) as f32 - 3.0).collect();
    let with = |edits: &[(usize, f32)]| {
        let mut x = base.clone();
        for &(i, v) in edits {
            x[i] = v;
        }
        x
    };
    /// (elements replaced, activation format, expected leading bytes)
    type Case<'a> = (&'a [(usize, f32)], DType, &'a [u8]);
    let cases: [Case; 7] = [
        (
            &[(2, f32::INFINITY)],
            DType::Q8_0,
            &[0x00, 0x7c, 0, 0, 0, 0, 0, 0, 0, 0],
        ),
        (
            &[(2, f32::INFINITY)],
            DType::Q8_1,
            &[0x00, 0x7c, 0x00, 0xfe, 0, 0, 0, 0, 0, 0, 0, 0],
        ),
        (
            &[(2, f32::INFINITY)],
            DType::Q8K,
            &[0x00, 0x00, 0x80, 0xff, 0, 0, 0, 0, 0, 0, 0, 0],
        ),
        (
            &[(2, f32::NAN)],
            DType::Q8_0,
            &[0x0c, 0x26, 0x81, 0xab, 0x00, 0x00, 0x2a, 0x55, 0x7f, 0x81],
        ),
        (
            &[(2, f32::NAN)],
            DType::Q8_1,
            &[
                0x0c, 0x26, 0x02, 0xc5, 0x81, 0xab, 0x00, 0x00, 0x2a, 0x55, 0x7f, 0x81,
            ],
        ),
        (
            &[(2, f32::NAN)],
            DType::Q8K,
            &[
                0x06, 0x83, 0xc1, 0x3c, 0x81, 0xab, 0x00, 0x00, 0x2a, 0x55, 0x7f, 0x81,
            ],
        ),
        (
            &[(2, f32::NAN), (31, f32::NAN)],
            DType::Q8_0,
            &[0x00, 0x7e, 0, 0, 0, 0, 0, 0, 0, 0],
        ),
    ];
    for (edits, act, want) in cases {
        let x = with(edits);
        let weight = match act {
            DType::Q8_0 => DType::Q8_0,
            DType::Q8_1 => DType::Q4_1,
            _ => DType::Q4K,
        };
        for p in Path::all_supported() {
            let a = quantize_acts_on(p, weight, &x).unwrap();
            let got = a.to_ggml_bytes();
            assert_eq!(&got[..want.len()], want, "{act} {edits:?} {p:?}");
        }
    }
}
