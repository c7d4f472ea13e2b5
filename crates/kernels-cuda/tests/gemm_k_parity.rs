//! The k-quant tensor-core GEMM (`kernels/gemm_k.cu`, `synaptix_kernels_cuda::gemm_k`) against
//! the CPU matmul on fresh random inputs (the seed is printed), outputs poisoned (NaN) before
//! each launch so that an unwritten element fails: every output bit for bit. Also through the
//! dispatch (`ops::matvec`), with extreme quants (the integer ranges' limits), and shape errors.
//! Skips with a visible message where no GPU is present.

use synaptix_core::DType;
use synaptix_kernels_cuda::ops::{self, DeviceActs, DeviceMatrix};
use synaptix_kernels_cuda::CudaDevice;
use synaptix_kernels_cuda::{gemm, gemm_k};

mod common;
use common::*;

/// Byte offsets of the f16 `d` (and `dmin` / `m`) fields of each block.
fn scale_fields(dtype: DType) -> &'static [usize] {
    match dtype {
        DType::Q2K => &[80, 82],
        DType::Q3K => &[108],
        DType::Q4K | DType::Q5K => &[0, 2],
        DType::Q6K => &[208],
        DType::Q4_0 | DType::Q5_0 | DType::Q8_0 | DType::IQ4NL | DType::IQ4XS => &[0],
        DType::Q4_1 | DType::Q5_1 => &[0, 2],
        _ => unreachable!("not a quantized format"),
    }
}

/// Random super-blocks of `dtype` (every quant, scale and min byte random) with modest f16
/// `d` / `dmin`; `extreme`: bytes drawn from {0x00, 0x7f, 0x80, 0xff} only (largest scales and
/// quants of either sign, the integer ranges' limits).
fn random_weights(rng: &mut Rng, dtype: DType, rows: usize, cols: usize, extreme: bool) -> Vec<u8> {
    let bb = dtype.block_bytes();
    let mut out = vec![0u8; rows * cols / dtype.block_len() * bb];
    let f16 = |v: f32| half::f16::from_f32(v).to_le_bytes();
    for b in out.chunks_exact_mut(bb) {
        for byte in b.iter_mut() {
            *byte = if extreme {
                [0x00, 0x7f, 0x80, 0xff][(rng.next() % 4) as usize]
            } else {
                rng.next() as u8
            };
        }
        for (i, &at) in scale_fields(dtype).iter().enumerate() {
            let v = if i == 0 { 0.004 } else { 0.002 } + 0.01 * rng.uniform().abs();
            b[at..at + 2].copy_from_slice(&f16(v));
        }
    }
    out
}

/// Activations of varied magnitude per 32 (super-block scales then differ a lot) with a few
/// outliers; `extreme`: ±1 only, so that every quant is ±127.
fn activations(rng: &mut Rng, m: usize, cols: usize, extreme: bool) -> Vec<f32> {
    if extreme {
        return (0..m * cols)
            .map(|_| if rng.next() & 1 == 0 { 1.0 } else { -1.0 })
            .collect();
    }
    let mut x = rng.vec(m * cols, 1.0);
    for (i, v) in x.iter_mut().enumerate() {
        let s = ((i / 32) * 7 % 13) as i32 - 6;
        *v *= 2f32.powi(s);
        if i % 97 == 5 {
            *v *= 30.0;
        }
    }
    x
}

const K_QUANTS: [DType; 5] = [DType::Q4K, DType::Q6K, DType::Q5K, DType::Q3K, DType::Q2K];
const SHAPES: [(usize, usize); 4] = [(64, 256), (300, 1024), (130, 3584), (896, 4864)];
const MS: [usize; 4] = [16, 17, 100, 512];

/// Runs the GEMM for `dtype` on fresh inputs and asserts every output equals the CPU's bits.
fn check_shape(
    dev: &CudaDevice,
    rng: &mut Rng,
    dtype: DType,
    (rows, cols): (usize, usize),
    ms: &[usize],
    extreme: bool,
) {
    let bytes = random_weights(rng, dtype, rows, cols, extreme);
    let dm = DeviceMatrix::upload(dev, dtype, rows, cols, &bytes).unwrap();
    for &m in ms {
        assert!(gemm_k::gemm_k_supported(dtype, m, cols));
        let x = activations(rng, m, cols, extreme);
        let want = cpu_matmul(dtype, &bytes, rows, cols, &x, m);
        let mut acts = DeviceActs::new(dev, dtype, m, cols).unwrap();
        ops::quantize_acts(dev, &mut acts, &dev.upload(&x).unwrap()).unwrap();
        let mut y = poisoned(dev, m * rows);
        gemm_k::gemm_k_quantized(dev, &mut y, &dm, &acts).unwrap();
        let got = dev.download(&y).unwrap();
        let (n, first) = bit_mismatches(&got, &want, rows);
        assert!(
            n == 0,
            "gemm_k {dtype} [{rows} x {cols}] m={m} extreme={extreme}: {n} of {} outputs differ \
             from the CPU:\n  {first}",
            got.len()
        );
    }
}

/// Every output of `gemm_k_quantized` is bit for bit the CPU matmul's, for rows and m that are
/// and are not multiples of the tile (32 × 64).
#[test]
fn gemm_k_matches_cpu_bit_for_bit() {
    let Some((dev, mut rng)) = device() else {
        return;
    };
    for dtype in K_QUANTS {
        for shape in SHAPES {
            check_shape(&dev, &mut rng, dtype, shape, &MS, false);
            eprintln!(
                "gemm_k {dtype:5} [{:4} x {:5}] m={MS:?}: every output bit-equal to the CPU",
                shape.0, shape.1
            );
        }
    }
}

/// The largest scales and quants of either sign with every activation quant ±127: the integer
/// sums at their limits (Q6_K's lane sums reach 2^24) are still exact.
#[test]
fn gemm_k_extreme_quants_match_cpu() {
    let Some((dev, mut rng)) = device() else {
        return;
    };
    for dtype in K_QUANTS {
        check_shape(&dev, &mut rng, dtype, (96, 1024), &[16, 70], true);
        eprintln!("gemm_k {dtype:5} extreme quants: every output bit-equal to the CPU");
    }
}

/// `ops::matvec` (f32 activations) dispatches k-quants with m >= 16 to the GEMM (unless
/// SYNAPTIX_NO_GEMM is set): still the CPU's bits, bias and residual epilogue included.
#[test]
fn gemm_k_through_the_dispatch() {
    let Some((dev, mut rng)) = device() else {
        return;
    };
    let (rows, cols, m) = (200, 1536, 48);
    for dtype in [DType::Q4K, DType::Q6K] {
        assert!(gemm_k::gemm_k_supported(dtype, m, cols));
        let bytes = random_weights(&mut rng, dtype, rows, cols, false);
        let dm = DeviceMatrix::upload(&dev, dtype, rows, cols, &bytes).unwrap();
        let x = activations(&mut rng, m, cols, false);
        let want = cpu_matmul(dtype, &bytes, rows, cols, &x, m);
        let mut y = poisoned(&dev, m * rows);
        ops::matvec(&dev, &mut y, &dm, &dev.upload(&x).unwrap()).unwrap();
        let got = dev.download(&y).unwrap();
        let (n, first) = bit_mismatches(&got, &want, rows);
        assert!(
            n == 0,
            "matvec {dtype} m={m}: {n} of {} outputs differ from the CPU:\n  {first}",
            got.len()
        );
    }
}

#[test]
fn gemm_k_supported_shapes() {
    for dtype in K_QUANTS {
        assert!(gemm_k::gemm_k_supported(dtype, 16, 256));
        assert!(gemm_k::gemm_k_supported(dtype, 512, 4864));
        assert!(!gemm_k::gemm_k_supported(dtype, 15, 4864));
        assert!(!gemm_k::gemm_k_supported(dtype, 64, 0));
    }
    for dtype in [DType::F32, DType::F16, DType::Q4_0, DType::Q8_0] {
        assert!(!gemm_k::gemm_k_supported(dtype, 512, 4096));
    }
}

#[test]
fn gemm_k_shape_errors_are_reported_not_launched() {
    let Some((dev, mut rng)) = device() else {
        return;
    };
    let (rows, cols, m) = (40, 512, 20);
    let bytes = random_weights(&mut rng, DType::Q4K, rows, cols, false);
    let dm = DeviceMatrix::upload(&dev, DType::Q4K, rows, cols, &bytes).unwrap();
    let x = dev.upload(&activations(&mut rng, m, cols, false)).unwrap();
    let mut y = poisoned(&dev, m * rows);
    // Activations of the wrong format (Q8_0, Q8_1) or length.
    let q80 = DeviceActs::new(&dev, DType::Q4_0, m, cols).unwrap();
    assert!(gemm_k::gemm_k_quantized(&dev, &mut y, &dm, &q80).is_err());
    let q81 = DeviceActs::new(&dev, DType::Q4_1, m, cols).unwrap();
    assert!(gemm_k::gemm_k_quantized(&dev, &mut y, &dm, &q81).is_err());
    let short = DeviceActs::new(&dev, DType::Q4K, m, cols - 256).unwrap();
    assert!(gemm_k::gemm_k_quantized(&dev, &mut y, &dm, &short).is_err());
    // y of the wrong length.
    let mut acts = DeviceActs::new(&dev, DType::Q4K, m, cols).unwrap();
    ops::quantize_acts(&dev, &mut acts, &x).unwrap();
    let mut y_short = poisoned(&dev, m * rows - 1);
    assert!(gemm_k::gemm_k_quantized(&dev, &mut y_short, &dm, &acts).is_err());
    // Weights of a legacy format with Q8_0 activations.
    let lb = vec![0u8; rows * cols / 32 * 18];
    let legacy = DeviceMatrix::upload(&dev, DType::Q4_0, rows, cols, &lb).unwrap();
    let mut q80 = DeviceActs::new(&dev, DType::Q4_0, m, cols).unwrap();
    ops::quantize_acts(&dev, &mut q80, &x).unwrap();
    assert!(gemm_k::gemm_k_quantized(&dev, &mut y, &legacy, &q80).is_err());
    // Nothing was written by the rejected calls.
    assert!(dev.download(&y).unwrap().iter().all(|v| v.is_nan()));
    // The accepted call writes everything.
    gemm_k::gemm_k_quantized(&dev, &mut y, &dm, &acts).unwrap();
    assert!(dev.download(&y).unwrap().iter().all(|v| v.is_finite()));
}

/// The f16 route for prefill (`gemm::gemm_dequantized`: weights and the quantized activations
/// expanded to halves, f16 tensor cores, f32 sums) is close to the CPU's exact result for every
/// quantized format: each weight and activation is rounded to f16 once, so the normalised error
/// stays near 2^-24. `ops::matvec` takes it for k-quants from `DEQUANT_MIN_ROWS` rows.
#[test]
fn dequantized_gemm_close_to_cpu() {
    let Some((dev, mut rng)) = device() else {
        return;
    };
    let formats = [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q2K,
        DType::Q3K,
        DType::Q4K,
        DType::Q5K,
        DType::Q6K,
        DType::IQ4NL,
        DType::IQ4XS,
    ];
    for dtype in formats {
        for (rows, cols) in [(300, 1024), (130, 3584), (64, 256)] {
            let bytes = random_weights(&mut rng, dtype, rows, cols, false);
            let dm = DeviceMatrix::upload(&dev, dtype, rows, cols, &bytes).unwrap();
            for m in [64, 100, 512] {
                let x = activations(&mut rng, m, cols, false);
                let want = cpu_matmul(dtype, &bytes, rows, cols, &x, m);
                let mut acts = DeviceActs::new(&dev, dtype, m, cols).unwrap();
                ops::quantize_acts(&dev, &mut acts, &dev.upload(&x).unwrap()).unwrap();
                let mut y = poisoned(&dev, m * rows);
                gemm::gemm_dequantized(&dev, &mut y, &dm, &acts).unwrap();
                let e = nmse(&dev.download(&y).unwrap(), &want);
                assert!(
                    e < 1e-6,
                    "dequantized gemm {dtype} [{rows} x {cols}] m={m}: nmse {e:e}"
                );
            }
        }
        eprintln!("dequantized gemm {dtype:5}: within 1e-6 of the CPU");
    }
    // Through the dispatch (f32 activations, bias and residual epilogue), k-quants and the IQ4
    // types from 64 rows.
    let (rows, cols, m) = (200, 1536, gemm::DEQUANT_MIN_ROWS);
    for dtype in [DType::Q4K, DType::Q6K, DType::IQ4NL, DType::IQ4XS] {
        assert!(gemm::dequant_gemm_supported(dtype, m, cols));
        let bytes = random_weights(&mut rng, dtype, rows, cols, false);
        let dm = DeviceMatrix::upload(&dev, dtype, rows, cols, &bytes).unwrap();
        let x = activations(&mut rng, m, cols, false);
        let want = cpu_matmul(dtype, &bytes, rows, cols, &x, m);
        let mut y = poisoned(&dev, m * rows);
        ops::matvec(&dev, &mut y, &dm, &dev.upload(&x).unwrap()).unwrap();
        let e = nmse(&dev.download(&y).unwrap(), &want);
        assert!(
            e < 1e-6,
            "matvec {dtype} m={m} through the f16 route: nmse {e:e}"
        );
    }
    // Shapes that do not fit are errors.
    let dm = DeviceMatrix::upload(
        &dev,
        DType::Q4K,
        2,
        256,
        &random_weights(&mut rng, DType::Q4K, 2, 256, false),
    )
    .unwrap();
    let acts = DeviceActs::new(&dev, DType::Q4K, 64, 256).unwrap();
    let mut y = poisoned(&dev, 3);
    assert!(gemm::gemm_dequantized(&dev, &mut y, &dm, &acts).is_err());
}
