//! The NEON kernels against the scalar reference, bit for bit, in both forms (`sdot` where the
//! CPU has it, widening multiplies always): random rows of lengths that leave every kind of
//! tail, one to seventeen activation rows (both tile instances of the block kernels), extreme
//! weight bytes with activation quants over the whole i8 range, and the half conversions
//! exhaustively. Runs on aarch64 only (under qemu-user on x86 hosts: scripts/neon_check.sh).

use synaptix_core::DType;

use super::*;
use crate::quant::{fill_acts_portable, quantize_acts_on, scalar_kernel};
use crate::testutil::{random_weights, scale_offsets, Rng, DOT_TYPES};

/// Types with NEON kernels: ggml's, but for IQ4_NL and IQ4_XS, which (like synaptix's own)
/// run the portable kernels there.
fn neon_has(dtype: DType) -> bool {
    dtype.in_gguf() && !matches!(dtype, DType::IQ4NL | DType::IQ4XS)
}

/// The kernel forms this CPU can run: widening multiplies, and `sdot` where present.
fn forms() -> Vec<bool> {
    if cpu_features().dotprod {
        vec![false, true]
    } else {
        vec![false]
    }
}

/// Row lengths: every remainder of 32-blocks modulo the group of four, float rows with every
/// remainder modulo 4 and 32.
fn lengths(dtype: DType) -> Vec<usize> {
    match dtype.block_len() {
        1 => vec![1, 3, 4, 5, 31, 32, 33, 100, 1000],
        32 => vec![32, 64, 96, 128, 160, 224, 4096 + 96],
        _ => vec![256, 512, 768, 1024, 2816],
    }
}

/// Single dots and block kernels (`nacts` activation rows, outputs at a stride wider than
/// `nacts` whose gaps must stay untouched) against the scalar kernel.
fn check_against_scalar(dtype: DType, w: &[u8], rows: usize, acts: &[QuantizedActs]) {
    let scalar = scalar_kernel(dtype).expect("scalar kernel");
    let rb = w.len() / rows;
    let want: Vec<u32> = (0..rows)
        .flat_map(|j| acts.iter().map(move |a| (j, a)))
        .map(|(j, a)| unsafe { scalar(&w[j * rb..(j + 1) * rb], a) }.to_bits())
        .collect();
    let k = acts[0].len();
    for dotprod in forms() {
        let (dot, block) = kernels_neon(dtype, dotprod);
        let what = |kind: &str| format!("{dtype} k={k} acts={} sdot={dotprod}: {kind}", acts.len());
        if let Some(dot) = dot {
            let got: Vec<u32> = (0..rows)
                .flat_map(|j| acts.iter().map(move |a| (j, a)))
                .map(|(j, a)| unsafe { dot(&w[j * rb..(j + 1) * rb], a) }.to_bits())
                .collect();
            assert_eq!(got, want, "{}", what("dot"));
        }
        let block = block.expect("every type has a block kernel");
        let stride = acts.len() + 2;
        let mut out = vec![f32::NAN; rows * stride];
        unsafe { block(w, rb, rows, acts, &mut out, stride) };
        let got: Vec<u32> = (0..rows)
            .flat_map(|j| (0..acts.len()).map(move |i| j * stride + i))
            .map(|at| out[at].to_bits())
            .collect();
        assert_eq!(got, want, "{}", what("block"));
        for j in 0..rows {
            for gap in &out[j * stride + acts.len()..(j + 1) * stride] {
                assert!(gap.is_nan(), "{}", what("block wrote outside its outputs"));
            }
        }
    }
}

#[test]
fn kernels_match_scalar_bitwise() {
    let mut rng = Rng::new(21);
    // NEON has kernels for ggml's types; synaptix's own run the portable kernel there.
    for dtype in DOT_TYPES.into_iter().filter(|&d| neon_has(d)) {
        for k in lengths(dtype) {
            // Nine rows: a full group of eight float rows and a partial one.
            let rows = 9;
            let w = random_weights(&mut rng, dtype, rows, k);
            for nacts in [1, 2, 17] {
                let acts: Vec<QuantizedActs> = (0..nacts)
                    .map(|t| {
                        let x = rng.normal_vec(k, [1.0, 1e-3, 40.0][t % 3]);
                        quantize_acts_on(Path::Scalar, dtype, &x).unwrap()
                    })
                    .collect();
                check_against_scalar(dtype, &w, rows, &acts);
            }
        }
    }
}

/// Activation quants replaced by random bytes over the whole i8 range (-128 included, which the
/// quantizers never produce), with `isum` / `bsums` / the pair-order copies kept consistent.
fn with_random_quants(rng: &mut Rng, mut a: QuantizedActs) -> QuantizedActs {
    for q in a.qs.iter_mut() {
        *q = rng.next_u64() as i8;
    }
    match a.dtype {
        DType::Q8_0 | DType::Q8_1 => {
            for (s, q) in a.isum.iter_mut().zip(a.qs.chunks_exact(32)) {
                *s = q.iter().map(|&v| v as i32).sum();
            }
        }
        _ => {
            for (s, q) in a.bsums.iter_mut().zip(a.qs.chunks_exact(16)) {
                *s = q.iter().map(|&v| v as i16).sum();
            }
            kquants::fill_pair_order(&mut a);
        }
    }
    a
}

#[test]
fn extreme_weights_and_activation_quants() {
    let mut rng = Rng::new(22);
    for dtype in DOT_TYPES
        .into_iter()
        .filter(|&d| d.is_quantized() && neon_has(d))
    {
        let k = if dtype.block_len() == 32 { 224 } else { 512 };
        let rows = 5;
        let random = random_weights(&mut rng, dtype, rows, k);
        let bb = dtype.block_bytes();
        for fill in [
            None,
            Some(0x00u8),
            Some(0x80),
            Some(0xff),
            Some(0x55),
            Some(0xaa),
        ] {
            let w: Vec<u8> = match fill {
                None => random.clone(),
                Some(byte) => {
                    // Every quant byte `byte`; the scale fields kept, so the result is finite.
                    let mut w = vec![byte; random.len()];
                    for (blk, sblk) in w.chunks_exact_mut(bb).zip(random.chunks_exact(bb)) {
                        for &o in scale_offsets(dtype) {
                            blk[o..o + 2].copy_from_slice(&sblk[o..o + 2]);
                        }
                    }
                    w
                }
            };
            let acts: Vec<QuantizedActs> = (0..3)
                .map(|_| {
                    let x = rng.normal_vec(k, 1.0);
                    let a = quantize_acts_on(Path::Scalar, dtype, &x).unwrap();
                    with_random_quants(&mut rng, a)
                })
                .collect();
            check_against_scalar(dtype, &w, rows, &acts);
            // All activation quants at the extremes.
            for q in [-128i8, 127] {
                let mut a = acts[0].clone();
                a.qs.fill(q);
                a.isum.iter_mut().for_each(|s| *s = 32 * q as i32);
                a.bsums.iter_mut().for_each(|s| *s = 16 * q as i16);
                if !a.pq.is_empty() {
                    kquants::fill_pair_order(&mut a);
                }
                check_against_scalar(dtype, &w, rows, &[a]);
            }
        }
    }
}

#[test]
fn half_widening_is_exact_for_every_half() {
    let all: Vec<u16> = (0..=u16::MAX).collect();
    for h in all.chunks_exact(4) {
        let mut got = [0f32; 4];
        unsafe { vst1q_f32(got.as_mut_ptr(), widen_f16x4(vld1_u16(h.as_ptr()))) };
        for (&bits, g) in h.iter().zip(got) {
            let want = float::f16_to_f32(bits);
            assert_eq!(g.to_bits(), want.to_bits(), "{bits:#06x}");
        }
    }
}

#[test]
fn half_narrowing_matches_ggml_rounding() {
    let mut rng = Rng::new(23);
    let mut values: Vec<f32> = (0..200_000)
        .map(|_| f32::from_bits(rng.next_u64() as u32))
        .filter(|v| !v.is_nan())
        .collect();
    for _ in 0..100_000 {
        let exp = (rng.next_u64() % 40) as i32 - 28;
        values.push(rng.normal(1.0) * 2f32.powi(exp));
    }
    // Ties, overflow, underflow and the subnormal range.
    values.extend([
        1.0 + 1.0 / 2048.0,
        1.0 + 3.0 / 2048.0,
        65504.0,
        65519.0,
        65520.0,
        f32::INFINITY,
        -f32::INFINITY,
        2f32.powi(-25),
        1.5 * 2f32.powi(-24),
        2f32.powi(-24),
        -0.0,
        1.0e-40,
        f32::MAX,
    ]);
    while !values.len().is_multiple_of(4) {
        values.push(0.0);
    }
    for v in values.chunks_exact(4) {
        let mut got = [0u16; 4];
        unsafe { vst1_u16(got.as_mut_ptr(), narrow_f16x4(vld1q_f32(v.as_ptr()))) };
        for (&x, g) in v.iter().zip(got) {
            assert_eq!(g, float::f32_to_f16(x), "{x:e} ({:#010x})", x.to_bits());
        }
    }
}

#[test]
fn quantizers_match_portable() {
    let mut rng = Rng::new(24);
    for wt in [DType::F16, DType::Q8_0, DType::Q4_1, DType::Q4K] {
        for scale in [1.0f32, 1e-3, 300.0, 1e-30] {
            let k = 2048;
            let mut x = rng.normal_vec(k, scale);
            // Rounding ties with a scale of exactly 1 (amax 127) in the first blocks.
            x[0] = -127.0;
            for (i, v) in x[1..32].iter_mut().enumerate() {
                *v = i as f32 - 15.5;
            }
            x[256..288].fill(0.0);
            x[300] = 1.0e-40;
            let want = {
                let mut a = quantize_acts_on(Path::Scalar, wt, &x).unwrap();
                fill_acts_portable(&x, &mut a);
                a
            };
            let mut a = quantize_acts_on(Path::Scalar, wt, &x).unwrap();
            unsafe { fill_acts_neon(&x, &mut a) };
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            let what = format!("{wt} scale={scale}");
            assert_eq!(a.qs, want.qs, "{what}");
            assert_eq!(a.isum, want.isum, "{what}");
            assert_eq!(a.bsums, want.bsums, "{what}");
            assert_eq!(a.pq, want.pq, "{what}");
            assert_eq!(a.pq_abs, want.pq_abs, "{what}");
            assert_eq!(bits(&a.d), bits(&want.d), "{what}");
            assert_eq!(bits(&a.s), bits(&want.s), "{what}");
            assert_eq!(bits(&a.vals), bits(&want.vals), "{what}");
        }
    }
}

/// The kernel path and form this CPU gets, checked against `SYNAPTIX_EXPECT_DOTPROD` (`0` or
/// `1`) when set, so that a run under an emulated CPU proves which form it tested.
#[test]
fn detected_path_and_form() {
    assert!(cpu_features().neon, "aarch64 CPUs have NEON");
    assert_eq!(Path::best_supported(), Path::Neon);
    assert_eq!(Path::all_supported(), vec![Path::Scalar, Path::Neon]);
    let dotprod = cpu_features().dotprod;
    eprintln!(
        "neon kernels: sdot {}",
        if dotprod { "used" } else { "absent" }
    );
    if let Ok(expect) = std::env::var("SYNAPTIX_EXPECT_DOTPROD") {
        assert_eq!(dotprod, expect == "1", "SYNAPTIX_EXPECT_DOTPROD={expect}");
    }
}
