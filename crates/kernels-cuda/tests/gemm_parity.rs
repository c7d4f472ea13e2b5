//! The tensor-core GEMM (`kernels/gemm.cu`, `synaptix_kernels_cuda::gemm`) against the CPU
//! matmul on fresh random inputs (the seed is printed), outputs poisoned (NaN) before each
//! launch so that an unwritten element fails: quantized weights bit for bit, F16 / BF16 by
//! normalised squared error. Every shape runs with both thread-block tiles (and the automatic
//! choice), whose results must not differ. Skips with a visible message where no GPU is present.

use synaptix_core::DType;
use synaptix_kernels_cuda::gemm::{self, GemmTile, WgTile};
use synaptix_kernels_cuda::ops::{self, DeviceActs, DeviceMatrix};

mod common;
use common::*;

/// Random blocks of `dtype` with modest scales, so dequantized values are O(0.1).
fn random_weights(rng: &mut Rng, dtype: DType, rows: usize, cols: usize) -> Vec<u8> {
    let n_blocks = rows * cols / dtype.block_len();
    let bb = dtype.block_bytes();
    let mut out = vec![0u8; n_blocks * bb];
    let f16 = |v: f32| half::f16::from_f32(v).to_le_bytes();
    match dtype {
        DType::F16 => {
            for (i, v) in rng.vec(rows * cols, 0.5).iter().enumerate() {
                out[2 * i..2 * i + 2].copy_from_slice(&f16(*v));
            }
            return out;
        }
        DType::BF16 => {
            for (i, v) in rng.vec(rows * cols, 0.5).iter().enumerate() {
                out[2 * i..2 * i + 2].copy_from_slice(&half::bf16::from_f32(*v).to_le_bytes());
            }
            return out;
        }
        _ => {}
    }
    for b in out.chunks_exact_mut(bb) {
        for byte in b.iter_mut() {
            *byte = rng.next() as u8;
        }
        let d = f16(0.004 + 0.01 * rng.uniform().abs());
        let m = f16(0.002 + 0.01 * rng.uniform().abs());
        // Positions of the f16 scale fields in each ggml block struct.
        let fields: &[(usize, [u8; 2])] = match dtype {
            DType::Q4_0 | DType::Q5_0 | DType::Q8_0 => &[(0, d)],
            DType::Q4_1 | DType::Q5_1 => &[(0, d), (2, m)],
            _ => &[],
        };
        for &(at, bytes) in fields {
            b[at..at + 2].copy_from_slice(&bytes);
        }
    }
    out
}

/// Normal-ish activations of varied magnitude per block (block scales then differ a lot).
fn activations(rng: &mut Rng, m: usize, cols: usize) -> Vec<f32> {
    let mut x = rng.vec(m * cols, 1.0);
    for (i, v) in x.iter_mut().enumerate() {
        // a per-32 scale between 2^-6 and 2^6 and a few large outliers, like real hidden states
        let s = ((i / 32) * 7 % 13) as i32 - 6;
        *v *= 2f32.powi(s);
        if i % 97 == 5 {
            *v *= 30.0;
        }
    }
    x
}

const QUANTIZED: [DType; 5] = [
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q8_0,
];
const SHAPES: [(usize, usize); 4] = [(64, 256), (300, 896), (896, 4864), (151, 1024)];
const MS: [usize; 5] = [16, 17, 64, 100, 512];
const TILES: [GemmTile; 3] = [GemmTile::Auto, GemmTile::Large, GemmTile::Small];

/// Every output of `gemm_quantized` is bit for bit the CPU matmul's (same quantized activations,
/// exact integer block sums, ggml's per-format f32 block terms added in k order from 0), for
/// rows and m that are and are not multiples of the tiles, with both tiles.
#[test]
fn gemm_quantized_matches_cpu_bit_for_bit() {
    let Some((dev, mut rng)) = device() else {
        return;
    };
    for dtype in QUANTIZED {
        for (rows, cols) in SHAPES {
            let bytes = random_weights(&mut rng, dtype, rows, cols);
            let dm = DeviceMatrix::upload(&dev, dtype, rows, cols, &bytes).unwrap();
            for m in MS {
                assert!(gemm::gemm_supported(dtype, m, cols));
                let x = activations(&mut rng, m, cols);
                let want = cpu_matmul(dtype, &bytes, rows, cols, &x, m);
                let mut acts = DeviceActs::new(&dev, dtype, m, cols).unwrap();
                ops::quantize_acts(&dev, &mut acts, &dev.upload(&x).unwrap()).unwrap();
                for tile in TILES {
                    let mut y = poisoned(&dev, m * rows);
                    gemm::gemm_quantized_with(&dev, &mut y, &dm, &acts, tile).unwrap();
                    let got = dev.download(&y).unwrap();
                    let (n, first) = bit_mismatches(&got, &want, rows);
                    assert!(
                        n == 0,
                        "gemm {dtype} [{rows} x {cols}] m={m} {tile:?}: {n} of {} outputs differ \
                         from the CPU:\n  {first}",
                        got.len()
                    );
                }
            }
            eprintln!(
                "gemm {dtype:5} [{rows:4} x {cols:5}] m={MS:?}: every output bit-equal to the CPU"
            );
        }
    }
}

/// One quantization serves several weight formats with the same activation format, bit for bit.
#[test]
fn gemm_quantized_shares_one_quantization() {
    let Some((dev, mut rng)) = device() else {
        return;
    };
    let (cols, m) = (2048, 40);
    let x = activations(&mut rng, m, cols);
    let dx = dev.upload(&x).unwrap();
    for group in [
        &[DType::Q4_0, DType::Q5_0, DType::Q8_0][..],
        &[DType::Q4_1, DType::Q5_1],
    ] {
        let mut acts = DeviceActs::new(&dev, group[0], m, cols).unwrap();
        ops::quantize_acts(&dev, &mut acts, &dx).unwrap();
        for (i, &dtype) in group.iter().enumerate() {
            let rows = 100 + 37 * i;
            let bytes = random_weights(&mut rng, dtype, rows, cols);
            let dm = DeviceMatrix::upload(&dev, dtype, rows, cols, &bytes).unwrap();
            let mut y = poisoned(&dev, m * rows);
            gemm::gemm_quantized(&dev, &mut y, &dm, &acts).unwrap();
            let got = dev.download(&y).unwrap();
            let want = cpu_matmul(dtype, &bytes, rows, cols, &x, m);
            let (n, first) = bit_mismatches(&got, &want, rows);
            assert!(
                n == 0,
                "gemm {dtype}: {n} of {} outputs differ from the CPU:\n  {first}",
                got.len()
            );
        }
    }
}

/// F16 / BF16 weights: f32 accumulation of exact products against the CPU's f64 sums. Includes
/// a row length that is a multiple of 16 but not of 32 (a half stage at the end).
#[test]
fn gemm_float_matches_cpu() {
    let Some((dev, mut rng)) = device() else {
        return;
    };
    // (100, 80): rows of a multiple of 16 but not of 32 (a half stage of the mma.sync kernels)
    // nor of 64 (a partial stage of the wgmma ones); (200, 3584): 7B's row length.
    let shapes: Vec<(usize, usize)> = SHAPES
        .iter()
        .copied()
        .chain([(100, 80), (200, 3584)])
        .collect();
    // Two families of kernels, each giving the same bits whatever its tile: mma.sync (Large,
    // Small, and Auto off Hopper) and, on Hopper, wgmma (Auto and every WgTile).
    let hopper = gemm::wgmma_available(&dev);
    let mut tiles: Vec<GemmTile> = TILES.to_vec();
    if hopper {
        tiles.extend(WgTile::ALL.map(GemmTile::Wgmma));
    }
    let family = |t: GemmTile| matches!(t, GemmTile::Wgmma(_) | GemmTile::Auto) && hopper;
    for dtype in [DType::F16, DType::BF16] {
        for &(rows, cols) in &shapes {
            let bytes = random_weights(&mut rng, dtype, rows, cols);
            let dm = DeviceMatrix::upload(&dev, dtype, rows, cols, &bytes).unwrap();
            let mut worst = 0f64;
            for m in MS {
                assert!(gemm::gemm_supported(dtype, m, cols));
                let x = activations(&mut rng, m, cols);
                let want = cpu_matmul(dtype, &bytes, rows, cols, &x, m);
                let dx = dev.upload(&x).unwrap();
                let mut first: [Option<Vec<f32>>; 2] = [None, None];
                for &tile in &tiles {
                    let mut y = poisoned(&dev, m * rows);
                    gemm::gemm_float_with(&dev, &mut y, &dm, &dx, tile).unwrap();
                    let got = dev.download(&y).unwrap();
                    let e = nmse(&got, &want);
                    assert!(
                        e < 1e-9,
                        "gemm {dtype} [{rows} x {cols}] m={m} {tile:?}: nmse {e:e}"
                    );
                    worst = worst.max(e);
                    // The tile does not change the mma steps of an output.
                    match &first[usize::from(family(tile))] {
                        None => first[usize::from(family(tile))] = Some(got),
                        Some(f) => assert!(
                            f.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()),
                            "gemm {dtype} [{rows} x {cols}] m={m}: {tile:?} differs from the \
                             first tile of its kernel family"
                        ),
                    }
                }
            }
            eprintln!("gemm {dtype:5} [{rows:4} x {cols:5}] m={MS:?}: worst nmse {worst:.2e}");
        }
    }
}

#[test]
fn gemm_supported_shapes() {
    for dtype in QUANTIZED {
        assert!(gemm::gemm_supported(dtype, 16, 896));
        assert!(!gemm::gemm_supported(dtype, 15, 896));
        assert!(!gemm::gemm_supported(dtype, 64, 80));
    }
    for dtype in [DType::F16, DType::BF16] {
        assert!(gemm::gemm_supported(dtype, 64, 80));
        assert!(!gemm::gemm_supported(dtype, 64, 72));
    }
    for dtype in [DType::F32, DType::Q2K, DType::Q4K, DType::Q6K] {
        assert!(!gemm::gemm_supported(dtype, 512, 4096));
    }
}

#[test]
fn gemm_shape_errors_are_reported_not_launched() {
    let Some((dev, mut rng)) = device() else {
        return;
    };
    let (rows, cols, m) = (40, 256, 20);
    let bytes = random_weights(&mut rng, DType::Q4_0, rows, cols);
    let dm = DeviceMatrix::upload(&dev, DType::Q4_0, rows, cols, &bytes).unwrap();
    let x = dev.upload(&activations(&mut rng, m, cols)).unwrap();
    let mut y = poisoned(&dev, m * rows);
    // Activations of the wrong format (Q8_1, Q8_K) or length.
    let q81 = DeviceActs::new(&dev, DType::Q4_1, m, cols).unwrap();
    assert!(gemm::gemm_quantized(&dev, &mut y, &dm, &q81).is_err());
    let q8k = DeviceActs::new(&dev, DType::Q4K, m, cols).unwrap();
    assert!(gemm::gemm_quantized(&dev, &mut y, &dm, &q8k).is_err());
    let short = DeviceActs::new(&dev, DType::Q4_0, m, cols - 32).unwrap();
    assert!(gemm::gemm_quantized(&dev, &mut y, &dm, &short).is_err());
    // y of the wrong length.
    let mut acts = DeviceActs::new(&dev, DType::Q4_0, m, cols).unwrap();
    ops::quantize_acts(&dev, &mut acts, &x).unwrap();
    let mut y_short = poisoned(&dev, m * rows - 1);
    assert!(gemm::gemm_quantized(&dev, &mut y_short, &dm, &acts).is_err());
    // Float GEMM: quantized weights, rows not a multiple of 16, x not whole rows.
    assert!(gemm::gemm_float(&dev, &mut y, &dm, &x).is_err());
    let hb = random_weights(&mut rng, DType::F16, rows, 72);
    let h72 = DeviceMatrix::upload(&dev, DType::F16, rows, 72, &hb).unwrap();
    let x72 = dev.upload(&vec![0.5f32; m * 72]).unwrap();
    assert!(gemm::gemm_float(&dev, &mut y, &h72, &x72).is_err());
    let hb = random_weights(&mut rng, DType::F16, rows, cols);
    let h = DeviceMatrix::upload(&dev, DType::F16, rows, cols, &hb).unwrap();
    let x_odd = dev.upload(&vec![0.5f32; m * cols + 3]).unwrap();
    assert!(gemm::gemm_float(&dev, &mut y, &h, &x_odd).is_err());
    assert!(gemm::gemm_float(&dev, &mut y_short, &h, &x).is_err());
    // Nothing was written by the rejected calls.
    assert!(dev.download(&y).unwrap().iter().all(|v| v.is_nan()));
}

/// Several matrices in one launch (`gemm_float_many`, `gemm_dequantized_many`: Q, K and V; gate
/// and up), biases in the epilogue: each output bit for bit the single-matrix GEMM followed by
/// a bias pass, for parts of row counts that end inside a tile.
#[test]
fn gemm_many_matches_one_matrix_at_a_time() {
    let Some((dev, mut rng)) = device() else {
        return;
    };
    let (cols, m) = (896, 100);
    let rows = [300usize, 64, 130];
    for dtype in [DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0] {
        let mats: Vec<DeviceMatrix> = rows
            .iter()
            .map(|&r| {
                let bytes = random_weights(&mut rng, dtype, r, cols);
                DeviceMatrix::upload(&dev, dtype, r, cols, &bytes).unwrap()
            })
            .collect();
        let biases: Vec<Option<synaptix_kernels_cuda::DeviceBuffer<f32>>> = rows
            .iter()
            .enumerate()
            .map(|(i, &r)| (i != 1).then(|| dev.upload(&rng.vec(r, 1.0)).unwrap()))
            .collect();
        let x = activations(&mut rng, m, cols);
        let dx = dev.upload(&x).unwrap();
        let quantized = ops::activation_format(dtype).is_some();
        let acts = quantized.then(|| {
            let mut acts = DeviceActs::new(&dev, dtype, m, cols).unwrap();
            ops::quantize_acts(&dev, &mut acts, &dx).unwrap();
            acts
        });
        for n_parts in 1..=3 {
            let mut ys: Vec<_> = rows[..n_parts]
                .iter()
                .map(|&r| poisoned(&dev, m * r))
                .collect();
            let mut parts: Vec<ops::MatvecPart> = ys
                .iter_mut()
                .zip(&mats)
                .zip(&biases)
                .map(|((y, w), b)| ops::MatvecPart {
                    w,
                    y,
                    bias: b.as_ref(),
                })
                .collect();
            match &acts {
                Some(acts) => gemm::gemm_dequantized_many(&dev, &mut parts, acts).unwrap(),
                None => gemm::gemm_float_many(&dev, &mut parts, &dx).unwrap(),
            }
            drop(parts);
            for (i, y) in ys.iter().enumerate() {
                let mut want = poisoned(&dev, m * rows[i]);
                match &acts {
                    Some(acts) => gemm::gemm_dequantized(&dev, &mut want, &mats[i], acts).unwrap(),
                    None => gemm::gemm_float(&dev, &mut want, &mats[i], &dx).unwrap(),
                }
                if let Some(b) = &biases[i] {
                    ops::add_bias(&dev, &mut want, b).unwrap();
                }
                let (got, want) = (dev.download(y).unwrap(), dev.download(&want).unwrap());
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "{dtype} part {i} of {n_parts}: differs from the one-matrix GEMM + bias"
                );
            }
        }
        eprintln!("gemm many {dtype}: 1-3 parts bit-equal with one matrix at a time");
    }
}

/// The GEMM with its epilogue (`gemm_float_epilogue`, `gemm_dequantized_epilogue`: + bias,
/// then + residual) bit for bit the GEMM followed by the separate bias and residual passes.
#[test]
fn gemm_epilogue_matches_separate_passes() {
    let Some((dev, mut rng)) = device() else {
        return;
    };
    let (rows, cols, m) = (300, 896, 100);
    for dtype in [DType::F16, DType::BF16, DType::Q8_0] {
        let bytes = random_weights(&mut rng, dtype, rows, cols);
        let w = DeviceMatrix::upload(&dev, dtype, rows, cols, &bytes).unwrap();
        let bias = dev.upload(&rng.vec(rows, 1.0)).unwrap();
        let residual = dev.upload(&rng.vec(m * rows, 4.0)).unwrap();
        let dx = dev.upload(&activations(&mut rng, m, cols)).unwrap();
        let acts = ops::activation_format(dtype).map(|_| {
            let mut acts = DeviceActs::new(&dev, dtype, m, cols).unwrap();
            ops::quantize_acts(&dev, &mut acts, &dx).unwrap();
            acts
        });
        for (b, r) in [(true, false), (false, true), (true, true)] {
            let (bias, residual) = (b.then_some(&bias), r.then_some(&residual));
            let mut got = poisoned(&dev, m * rows);
            match &acts {
                Some(a) => gemm::gemm_dequantized_epilogue(&dev, &mut got, &w, a, bias, residual),
                None => gemm::gemm_float_epilogue(&dev, &mut got, &w, &dx, bias, residual),
            }
            .unwrap();
            let mut prod = poisoned(&dev, m * rows);
            match &acts {
                Some(a) => gemm::gemm_dequantized(&dev, &mut prod, &w, a),
                None => gemm::gemm_float(&dev, &mut prod, &w, &dx),
            }
            .unwrap();
            if let Some(b) = bias {
                ops::add_bias(&dev, &mut prod, b).unwrap();
            }
            let want = match residual {
                Some(r) => {
                    let mut sum = poisoned(&dev, m * rows);
                    ops::add(&dev, &mut sum, r, &prod).unwrap();
                    sum
                }
                None => prod,
            };
            let (got, want) = (dev.download(&got).unwrap(), dev.download(&want).unwrap());
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{dtype} bias {b} residual {r}: the fused epilogue differs from separate passes"
            );
        }
        eprintln!("gemm epilogue {dtype}: bias and residual bit-equal with separate passes");
    }
}
