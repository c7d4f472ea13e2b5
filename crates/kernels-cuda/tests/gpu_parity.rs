//! Every CUDA kernel against a CPU reference on fresh random inputs (the seed is printed),
//! by normalised squared error, with outputs poisoned (NaN) before each launch so that an
//! unwritten element fails. Skips with a visible message where no GPU is present.

use synaptix_core::DType;
use synaptix_kernels_cpu::dequantize;
use synaptix_kernels_cuda::ops::{self, AttentionParams, DeviceKv, DeviceMatrix, Glu, RopeParams};
use synaptix_kernels_cuda::{CudaDevice, DeviceBuffer};

mod common;
use common::*;

/// Random blocks of `dtype` with modest scales, so dequantized values are O(0.1).
fn random_weights(rng: &mut Rng, dtype: DType, rows: usize, cols: usize) -> Vec<u8> {
    let n_blocks = rows * cols / dtype.block_len();
    let bb = dtype.block_bytes();
    let mut out = vec![0u8; n_blocks * bb];
    let f16 = |v: f32| half::f16::from_f32(v).to_le_bytes();
    match dtype {
        DType::F32 => {
            for (i, v) in rng.vec(rows * cols, 0.5).iter().enumerate() {
                out[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes());
            }
            return out;
        }
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
            DType::Q4_0 | DType::Q5_0 | DType::Q8_0 | DType::IQ4NL | DType::IQ4XS => &[(0, d)],
            DType::Q4_1 | DType::Q5_1 | DType::Q4K | DType::Q5K => &[(0, d), (2, m)],
            DType::Q2K => &[(80, d), (82, m)],
            DType::Q3K => &[(108, d)],
            DType::Q6K => &[(208, d)],
            _ => &[],
        };
        for &(at, bytes) in fields {
            b[at..at + 2].copy_from_slice(&bytes);
        }
    }
    out
}

const FORMATS: [DType; 15] = [
    DType::F32,
    DType::F16,
    DType::BF16,
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

#[test]
fn elementwise_and_norm() {
    let Some((dev, mut rng)) = device() else {
        return;
    };
    let n = 10_000;
    let (a, b) = (rng.vec(n, 3.0), rng.vec(n, 3.0));
    let (da, db) = (dev.upload(&a).unwrap(), dev.upload(&b).unwrap());
    let mut out = poisoned(&dev, n);
    ops::add(&dev, &mut out, &da, &db).unwrap();
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    assert!(nmse(&dev.download(&out).unwrap(), &want) < 1e-12);

    // ggml's GELU table: f16 input bits -> f16 GELU, as the CPU builds it.
    let gelu = |h: f32| 0.5 * h * (1.0 + (0.797_884_6 * h * (1.0 + 0.044715 * h * h)).tanh());
    let table: Vec<u16> = (0..=u16::MAX)
        .map(|bits| half::f16::from_f32(gelu(half::f16::from_bits(bits).to_f32())).to_bits())
        .collect();
    let dtable = dev.upload(&table).unwrap();
    let silu = |g: f32| g / (1.0 + (-g).exp());
    let gelu_ref = |x: f32| {
        if x <= -10.0 {
            0.0
        } else if x >= 10.0 {
            x
        } else {
            half::f16::from_bits(table[half::f16::from_f32(x).to_bits() as usize]).to_f32()
        }
    };
    for kind in [Glu::Silu, Glu::GeluTanh] {
        let mut out = poisoned(&dev, n);
        ops::glu(&dev, kind, &mut out, &da, &db, 1000, Some(&dtable)).unwrap();
        let want: Vec<f32> = a
            .iter()
            .zip(&b)
            .map(|(g, u)| match kind {
                Glu::Silu => silu(*g) * u,
                Glu::GeluTanh => gelu_ref(*g) * u,
            })
            .collect();
        let got = dev.download(&out).unwrap();
        let e = nmse(&got, &want);
        assert!(e < 1e-10, "{kind:?}: nmse {e:e}");
        if kind == Glu::GeluTanh {
            assert_eq!(got, want, "GeGLU through the shared table is exact");
        }
    }

    // Rows of a warp each (short), and of a block each (long); heads of QK-norm (64).
    for (rows, cols) in [(7, 896), (3, 64), (2, 5120), (17, 3584)] {
        let x = rng.vec(rows * cols, 2.0);
        let w = rng.vec(cols, 1.0);
        let mut out = poisoned(&dev, rows * cols);
        ops::rms_norm(
            &dev,
            &mut out,
            &dev.upload(&x).unwrap(),
            &dev.upload(&w).unwrap(),
            1e-6,
        )
        .unwrap();
        let mut want = x.clone();
        for r in want.chunks_mut(cols) {
            let ms = r.iter().map(|v| (v * v) as f64).sum::<f64>() / cols as f64;
            let s = 1.0 / (ms + 1e-6).sqrt();
            for (v, wi) in r.iter_mut().zip(&w) {
                *v = (*v as f64 * s * *wi as f64) as f32;
            }
        }
        let e = nmse(&dev.download(&out).unwrap(), &want);
        assert!(e < 1e-11, "rms_norm [{rows}, {cols}] nmse {e:e}");
    }
}

#[test]
fn rope_both_layouts() {
    let Some((dev, mut rng)) = device() else {
        return;
    };
    for neox in [false, true] {
        let p = RopeParams {
            n_heads: 3,
            head_dim: 64,
            n_rot: 48,
            neox,
        };
        let positions = [0usize, 1, 17, 4095];
        let x = rng.vec(positions.len() * 3 * 64, 1.0);
        // (cos, sin) per row and pair, as the host computes them for the kernel.
        let cos_sin: Vec<f32> = positions
            .iter()
            .flat_map(|&pos| {
                (0..24).flat_map(move |i| {
                    let theta = pos as f32 * 10000f32.powf(-2.0 * i as f32 / 48.0) * 0.5;
                    [theta.cos(), theta.sin()]
                })
            })
            .collect();
        let mut dx = dev.upload(&x).unwrap();
        ops::rope(&dev, &mut dx, &dev.upload(&cos_sin).unwrap(), p).unwrap();
        let mut want = x.clone();
        for r in 0..positions.len() {
            for h in 0..3 {
                let head = &mut want[(r * 3 + h) * 64..(r * 3 + h + 1) * 64];
                for i in 0..24 {
                    let (c, s) = (cos_sin[(r * 24 + i) * 2], cos_sin[(r * 24 + i) * 2 + 1]);
                    let (a, b) = if neox {
                        (i, i + 24)
                    } else {
                        (2 * i, 2 * i + 1)
                    };
                    let (x0, x1) = (head[a], head[b]);
                    head[a] = x0 * c - x1 * s;
                    head[b] = x0 * s + x1 * c;
                }
            }
        }
        assert_eq!(
            dev.download(&dx).unwrap(),
            want,
            "rope neox={neox}: not bit-identical"
        );
    }
}

#[test]
fn get_rows_and_matvec_every_format() {
    let Some((dev, mut rng)) = device() else {
        return;
    };
    let (rows, cols) = (300, 512);
    for dtype in FORMATS {
        let bytes = random_weights(&mut rng, dtype, rows, cols);
        let mut w = vec![0f32; rows * cols];
        dequantize(dtype, &bytes, &mut w).unwrap();
        let dm = DeviceMatrix::upload(&dev, dtype, rows, cols, &bytes).unwrap();

        let ids: Vec<i32> = vec![0, 299, 17, 17, 150];
        let mut out = poisoned(&dev, ids.len() * cols);
        ops::get_rows(&dev, &mut out, &dm, &dev.upload(&ids).unwrap(), 2.0).unwrap();
        let want: Vec<f32> = ids
            .iter()
            .flat_map(|&i| {
                w[i as usize * cols..(i as usize + 1) * cols]
                    .iter()
                    .map(|v| v * 2.0)
            })
            .collect();
        let e = nmse(&dev.download(&out).unwrap(), &want);
        assert!(e < 1e-12, "get_rows {dtype}: nmse {e:e}");

        // The first matvec kernels: dequantized weights times f32 activations (no activation
        // quantization), against the same product in f64. `ops::matvec` (ggml's arithmetic) is
        // checked against the CPU in `matvec_matches_cpu_every_format`.
        for m in [1, 3] {
            let x = rng.vec(m * cols, 1.0);
            let mut y = poisoned(&dev, m * rows);
            ops::matvec_dequant(&dev, &mut y, &dm, &dev.upload(&x).unwrap()).unwrap();
            let want: Vec<f32> = (0..m)
                .flat_map(|i| {
                    let xr = &x[i * cols..(i + 1) * cols];
                    (0..rows)
                        .map(|r| {
                            w[r * cols..(r + 1) * cols]
                                .iter()
                                .zip(xr)
                                .map(|(a, b)| *a as f64 * *b as f64)
                                .sum::<f64>() as f32
                        })
                        .collect::<Vec<_>>()
                })
                .collect();
            let e = nmse(&dev.download(&y).unwrap(), &want);
            assert!(e < 1e-10, "matvec_dequant {dtype} m={m}: nmse {e:e}");
        }
    }
}

/// Normal-ish activations of varied magnitude per block (block scales then differ a lot).
/// ggml's GELU table: the f16 GELU (tanh approximation) of every f16 input, by its bits.
fn gelu_table() -> Vec<u16> {
    (0..=u16::MAX)
        .map(|h| {
            let x = half::f16::from_bits(h).to_f32();
            let g = 0.5 * x * (1.0 + (0.797_884_6 * x * (1.0 + 0.044715 * x * x)).tanh());
            half::f16::from_f32(g).to_bits()
        })
        .collect()
}

/// One part per (output, matrix, bias) for the many-matrix products.
/// Random `rows × x.len()` weights of `dtype`, a random bias, and the CPU's product of one
/// activation row `x` plus that bias.
fn weights_bias_and_product(
    rng: &mut Rng,
    dtype: DType,
    rows: usize,
    x: &[f32],
) -> (Vec<u8>, Vec<f32>, Vec<f32>) {
    let cols = x.len();
    let bytes = random_weights(rng, dtype, rows, cols);
    let bias = rng.vec(rows, 1.0);
    let product = cpu_matmul(dtype, &bytes, rows, cols, x, 1);
    let want = product.iter().zip(&bias).map(|(p, b)| p + b).collect();
    (bytes, bias, want)
}

fn matvec_parts<'a>(
    ys: &'a mut [DeviceBuffer<f32>],
    weights: &'a [DeviceMatrix],
    biases: &'a [DeviceBuffer<f32>],
) -> Vec<ops::MatvecPart<'a>> {
    ys.iter_mut()
        .zip(weights.iter().zip(biases))
        .map(|(y, (w, b))| ops::MatvecPart {
            w,
            y,
            bias: Some(b),
        })
        .collect()
}

/// Random matrices of `(format, rows)` with `cols` columns on the device, and a random bias for
/// each.
fn random_matrices(
    dev: &CudaDevice,
    rng: &mut Rng,
    mats: &[(DType, usize)],
    cols: usize,
) -> (Vec<DeviceMatrix>, Vec<DeviceBuffer<f32>>) {
    mats.iter()
        .map(|&(dtype, rows)| {
            let bytes = random_weights(rng, dtype, rows, cols);
            (
                DeviceMatrix::upload(dev, dtype, rows, cols, &bytes).unwrap(),
                dev.upload(&rng.vec(rows, 1.0)).unwrap(),
            )
        })
        .unzip()
}

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

/// Rows that exercise every corner of ggml's activation quantizers: rounding ties (x·(1/d)
/// exactly k + 0.5), equal magnitudes of both signs (the first decides Q8_K's sign), all-zero
/// and signed-zero blocks, subnormal maxima (1/d overflows), huge values, and, on x86_64 (where
/// the CPU reference's NaN rules are x86's), infinities and NaNs with payloads.
fn edge_rows(rng: &mut Rng, cols: usize) -> Vec<f32> {
    let mut rows = Vec::new();
    let mut ties = rng.vec(cols, 3.0);
    for (i, v) in ties.iter_mut().enumerate().take(cols.min(512)) {
        // amax 127 gives d = 1: every x.5 is a tie of roundf; Q8_K gets -127/±127 = ∓1
        *v = (i % 32) as f32 - 15.5;
        if i % 32 == 0 {
            *v = if (i / 32) % 2 == 0 { -127.0 } else { 127.0 };
        }
    }
    ties[40] = -4.0;
    ties[41] = 4.0;
    rows.extend(ties);
    let mut zeros = rng.vec(cols, 1.0);
    zeros[..256].fill(0.0);
    zeros[1] = -0.0;
    zeros[300 % cols] = 0.0;
    rows.extend(zeros);
    let mut tiny = rng.vec(cols, 1.0);
    tiny[..32].fill(1.0e-42); // subnormal amax: 1/d is infinite
    tiny[35] = 1.0e-40;
    tiny[64..96].fill(-3.0e-39);
    tiny[100] = 70000.0; // d beyond half's range
    tiny[130] = -1.0e30;
    tiny[160] = f32::from_bits(0x3380_0000);
    tiny[256..512.min(cols)].fill(1.0e-41);
    rows.extend(tiny);
    if cfg!(target_arch = "x86_64") {
        let mut odd = rng.vec(cols, 1.0);
        odd[2] = f32::INFINITY;
        odd[40] = f32::NAN;
        odd[63] = f32::NAN; // last element of a block: that block's amax is NaN
        odd[69] = -f32::from_bits(0x7fc1_2345);
        odd[100] = f32::NEG_INFINITY;
        odd[101] = f32::INFINITY;
        if cols >= 512 {
            odd[300] = f32::NAN;
            odd[301] = f32::INFINITY;
            odd[400] = -f32::from_bits(0x7fc1_2345);
            odd[260] = 1.0e-39;
        }
        rows.extend(odd);
    }
    rows
}

/// The first differing activation block, spelled out.
fn describe_block_mismatch(act: DType, got: &[u8], want: &[u8], x: &[f32], cols: usize) -> String {
    let bb = act.block_bytes();
    let b = (0..want.len() / bb)
        .find(|&b| got[b * bb..(b + 1) * bb] != want[b * bb..(b + 1) * bb])
        .unwrap_or(0);
    let bl = act.block_len();
    let (row, col) = (b * bl / cols, b * bl % cols);
    format!(
        "{act}: block {b} (row {row}, elements {col}..{}) differs\n  gpu {:02x?}\n  cpu {:02x?}\n  x   {:?}",
        col + bl,
        &got[b * bb..(b + 1) * bb],
        &want[b * bb..(b + 1) * bb],
        &x[b * bl..(b + 1) * bl]
    )
}

/// GPU activation quantization (kernels/quantize.cu) against the CPU's (ggml's reference
/// quantizers): identical bytes in ggml's block layout, quants and scales bit for bit.
#[test]
fn quantized_activations_match_cpu_bit_for_bit() {
    let Some((dev, mut rng)) = device() else {
        return;
    };
    // Q8_0 (for Q4_0 / Q5_0 / Q8_0 weights), Q8_1 (Q4_1 / Q5_1), Q8_K (k-quants).
    for weight in [DType::Q8_0, DType::Q4_1, DType::Q4K] {
        for cols in [512, 4864] {
            let mut x = edge_rows(&mut rng, cols);
            x.extend(activations(&mut rng, 5, cols));
            x.extend(rng.vec(2 * cols, 1.0));
            let m = x.len() / cols;
            let want: Vec<u8> = x
                .chunks(cols)
                .flat_map(|r| {
                    synaptix_kernels_cpu::quantize_acts(weight, r)
                        .unwrap()
                        .to_ggml_bytes()
                })
                .collect();
            let mut acts = ops::DeviceActs::new(&dev, weight, m, cols).unwrap();
            ops::quantize_acts(&dev, &mut acts, &dev.upload(&x).unwrap()).unwrap();
            let got = acts.to_ggml_bytes(&dev).unwrap();
            assert_eq!(got.len(), want.len(), "{} bytes", acts.dtype());
            assert!(
                got == want,
                "{}",
                describe_block_mismatch(acts.dtype(), &got, &want, &x, cols)
            );
            eprintln!(
                "{} ({weight} weights): {m} rows of {cols} bit-exact",
                acts.dtype()
            );
        }
    }
}

/// `ops::matvec` on `rows × cols` random weights of `dtype` and `m` activation rows, against the
/// CPU matmul: panics unless every output is bit for bit the CPU's.
fn assert_matvec_bit_exact(
    dev: &CudaDevice,
    rng: &mut Rng,
    dtype: DType,
    (rows, cols): (usize, usize),
    ms: &[usize],
) {
    let bytes = random_weights(rng, dtype, rows, cols);
    let mut dm = DeviceMatrix::upload(dev, dtype, rows, cols, &bytes).unwrap();
    // One row against F16 / BF16 weights on Hopper takes the bulk kernel: with its products summed
    // in f32 (`SYNAPTIX_BULK_SUMS=f32`, `ops::bulk_f32_sums`) within a few f32 roundings of the
    // CPU's f64 sum, checked against the sum of the products' magnitudes; by default the CPU's bits.
    let f32_sums = ops::bulk_applies(dev, &dm) && ops::bulk_f32_sums();
    let run = |rng: &mut Rng, dm: &DeviceMatrix, ms: &[usize], how: &str| {
        for &m in ms {
            let x = activations(rng, m, cols);
            let want = cpu_matmul(dtype, &bytes, rows, cols, &x, m);
            let mut y = poisoned(dev, m * rows);
            ops::matvec(dev, &mut y, dm, &dev.upload(&x).unwrap()).unwrap();
            let got = dev.download(&y).unwrap();
            if f32_sums && m == 1 {
                // |w| (sign bits cleared) against |x|: the magnitudes' sum per row.
                let abs_w: Vec<u8> = bytes
                    .chunks_exact(2)
                    .flat_map(|h| [h[0], h[1] & 0x7f])
                    .collect();
                let abs_x: Vec<f32> = x.iter().map(|v| v.abs()).collect();
                let scale = cpu_matmul(dtype, &abs_w, rows, cols, &abs_x, m);
                let bad: Vec<usize> = (0..rows)
                    .filter(|&r| {
                        let err = (got[r] - want[r]).abs();
                        err.is_nan() || err > 1e-5 * scale[r]
                    })
                    .collect();
                assert!(
                    bad.is_empty(),
                    "matvec {dtype} [{rows} x {cols}] m=1{how} (f32 sums): {} of {rows} outputs off the CPU's by more than 1e-5 of their magnitudes' sum, first {:?}",
                    bad.len(),
                    bad.iter().take(4).map(|&r| (r, got[r], want[r], scale[r])).collect::<Vec<_>>()
                );
                continue;
            }
            let (n, first) = bit_mismatches(&got, &want, rows);
            assert!(
                n == 0,
                "matvec {dtype} [{rows} x {cols}] m={m}{how}: {n} of {} outputs differ from the CPU:\n  {first}",
                got.len()
            );
        }
        let f32_note = if f32_sums {
            " (m=1: within f32 sums)"
        } else {
            ""
        };
        eprintln!("matvec {dtype:5} [{rows:6} x {cols:5}] m={ms:?}{how}: every output bit-equal to the CPU{f32_note}");
    };
    run(rng, &dm, ms, "");
    // Q8_0 on Hopper: one activation row again from the split copy (matvec_q8s_bulk), which
    // uploads make only for large matrices.
    if dtype == DType::Q8_0 && dm.split.is_none() && dm.split_copy(dev).unwrap() {
        run(rng, &dm, &[1], " (split copy)");
    }
}

/// `ops::matvec` (quantize + `matvec_q8_*`, or the float kernels) against the CPU matmul on the
/// same weights: every output bit for bit the CPU's (same quantized activations, same integer
/// sums, same f32 / f64 operations in the same order). The shapes cover partial and multiple
/// warp chunks per row, 1 to 8 warps per row, one and two passes over activation rows (m = 9 >
/// 8), and every m from 1 to 9.
#[test]
fn matvec_matches_cpu_every_format() {
    let Some((dev, mut rng)) = device() else {
        return;
    };
    // (4000, 1536) and (3000, 8448): several rows per warp of the k-quant row kernel, in rounds
    // of whole rows (6 super-blocks) and in rounds that cross rows (33); for legacy formats the
    // one-row-per-warp kernel, with a last partial round at 1536. (1500, 2080): the same, on
    // rows that are not whole 256-element runs; (8500, 1280): the staged kernel with 8 lanes per
    // row (from 8448 rows on an H200), (5000, 2048) the staged kernel with 16 lanes per row
    // (more rows than one wave of the one-row-per-warp kernel). F16 / BF16 on Hopper: (3000, 8448) takes the bulk kernel
    // with each block's copies split evenly between its warps (rows spanning warps), (1000,
    // 4096) and (9, 14336) the same kernel dealing whole rows to the warps. Q8_0 with one
    // activation row also from its split copy on Hopper (matvec_q8s_bulk): (3000, 8448) and
    // (9, 14336) rows of several copies (a partial last group at 8448), (37, 4864) with most
    // warps idle, (1000, 4096) and (1500, 2080) rows of one copy, (40, 896) and
    // (300, 512) rows shorter than a copy. (1100, 4864): the one-row-per-warp kernel with a
    // last partial round (152 blocks: four rounds in registers, then 24 blocks).
    let shapes: [(usize, usize); 11] = [
        (1100, 4864),
        (5000, 2048),
        (300, 512),
        (40, 896),
        (37, 4864),
        (9, 14336),
        (1000, 4096),
        (4000, 1536),
        (3000, 8448),
        (1500, 2080),
        (8500, 1280),
    ];
    let ms: Vec<usize> = (1..=9).collect();
    for dtype in FORMATS {
        for (rows, cols) in shapes {
            if cols.is_multiple_of(dtype.block_len()) {
                assert_matvec_bit_exact(&dev, &mut rng, dtype, (rows, cols), &ms);
            }
        }
    }
}

/// Vocabulary-sized outputs (Qwen2.5's 151936 rows): the grid's largest row index and byte
/// offsets, bit-exact like every other shape.
#[test]
fn matvec_matches_cpu_vocabulary_rows() {
    let Some((dev, mut rng)) = device() else {
        return;
    };
    for (dtype, cols) in [
        (DType::Q4_0, 896),
        (DType::Q8_0, 896),
        (DType::F16, 896),
        (DType::Q4K, 1024),
        (DType::Q6K, 1024),
    ] {
        assert_matvec_bit_exact(&dev, &mut rng, dtype, (151_936, cols), &[1, 2]);
    }
}

/// Long k-quant rows (74 super-blocks, as 7B's down projection), where the row kernel's shared
/// memory caps its blocks per SM and the host takes blocks of 6 or 8 warps (on an H200: Q4_K
/// with 2000 rows 8 warps, Q6_K with 1500 rows 6): bit-exact like the 4-warp blocks.
#[test]
fn matvec_rows_kernel_larger_blocks_match_cpu() {
    let Some((dev, mut rng)) = device() else {
        return;
    };
    for dtype in [DType::Q4K, DType::Q5K, DType::Q6K] {
        for rows in [1500, 2000] {
            assert_matvec_bit_exact(&dev, &mut rng, dtype, (rows, 18944), &[1]);
        }
    }
}

/// Matrices of different formats on one quantized row (`matvec_many`: 7B Q4_K_M's Q and K in
/// Q4_K, V in Q6_K, a launch each) give bit for bit the CPU's products plus bias.
#[test]
fn matvec_many_mixed_formats_match_cpu() {
    let Some((dev, mut rng)) = device() else {
        return;
    };
    let cols = 3584;
    let mats = [(DType::Q4K, 3584), (DType::Q4K, 512), (DType::Q6K, 512)];
    let x = activations(&mut rng, 1, cols);
    let dx = dev.upload(&x).unwrap();
    let mut acts = ops::DeviceActs::new(&dev, DType::Q4K, 1, cols).unwrap();
    ops::quantize_acts(&dev, &mut acts, &dx).unwrap();
    let mut wants = Vec::new();
    let mut weights = Vec::new();
    let mut biases = Vec::new();
    for (dtype, rows) in mats {
        let (bytes, bias, want) = weights_bias_and_product(&mut rng, dtype, rows, &x);
        wants.push(want);
        weights.push(DeviceMatrix::upload(&dev, dtype, rows, cols, &bytes).unwrap());
        biases.push(dev.upload(&bias).unwrap());
    }
    let mut ys: Vec<DeviceBuffer<f32>> = mats.iter().map(|&(_, r)| poisoned(&dev, r)).collect();
    let mut parts = matvec_parts(&mut ys, &weights, &biases);
    ops::matvec_many(&dev, &mut parts, &dx, Some(&acts)).unwrap();
    drop(parts);
    for (i, (y, want)) in ys.iter().zip(&wants).enumerate() {
        let got = dev.download(y).unwrap();
        let (n, first) = bit_mismatches(&got, want, mats[i].1);
        assert!(
            n == 0,
            "matvec_many {:?}: {n} outputs differ from the CPU:\n  {first}",
            mats[i]
        );
    }
}

/// One quantization serves several weight matrices of formats with the same activation format,
/// bit for bit like the CPU.
#[test]
fn matvec_quantized_shares_one_quantization() {
    let Some((dev, mut rng)) = device() else {
        return;
    };
    let (cols, m) = (2048, 3);
    let x = activations(&mut rng, m, cols);
    let dx = dev.upload(&x).unwrap();
    for group in [
        &[DType::Q4_0, DType::Q5_0, DType::Q8_0, DType::IQ4NL][..],
        &[DType::Q4_1, DType::Q5_1],
        &[
            DType::Q2K,
            DType::Q3K,
            DType::Q4K,
            DType::Q5K,
            DType::Q6K,
            DType::IQ4XS,
        ],
    ] {
        let mut acts = ops::DeviceActs::new(&dev, group[0], m, cols).unwrap();
        ops::quantize_acts(&dev, &mut acts, &dx).unwrap();
        for (i, &dtype) in group.iter().enumerate() {
            let rows = 100 + 37 * i;
            let bytes = random_weights(&mut rng, dtype, rows, cols);
            let dm = DeviceMatrix::upload(&dev, dtype, rows, cols, &bytes).unwrap();
            let mut y = poisoned(&dev, m * rows);
            ops::matvec_quantized(&dev, &mut y, &dm, &acts).unwrap();
            let got = dev.download(&y).unwrap();
            let want = cpu_matmul(dtype, &bytes, rows, cols, &x, m);
            let (n, first) = bit_mismatches(&got, &want, rows);
            assert!(
                n == 0,
                "matvec_quantized {dtype}: {n} of {} outputs differ from the CPU:\n  {first}",
                got.len()
            );
        }
    }
}

#[test]
fn matvec_shape_errors_are_reported_not_launched() {
    let Some((dev, mut rng)) = device() else {
        return;
    };
    assert!(ops::DeviceActs::new(&dev, DType::F16, 1, 64).is_err());
    assert!(ops::DeviceActs::new(&dev, DType::Q4K, 1, 96).is_err());
    let bytes = random_weights(&mut rng, DType::Q4_0, 4, 64);
    let dm = DeviceMatrix::upload(&dev, DType::Q4_0, 4, 64, &bytes).unwrap();
    let k_acts = ops::DeviceActs::new(&dev, DType::Q4K, 1, 256).unwrap();
    let q81_acts = ops::DeviceActs::new(&dev, DType::Q4_1, 1, 64).unwrap();
    let mut y = poisoned(&dev, 4);
    assert!(ops::matvec_quantized(&dev, &mut y, &dm, &k_acts).is_err());
    assert!(ops::matvec_quantized(&dev, &mut y, &dm, &q81_acts).is_err());
    let x = dev.upload(&[0f32; 64]).unwrap();
    let mut y_short = poisoned(&dev, 3);
    assert!(ops::matvec(&dev, &mut y_short, &dm, &x).is_err());
    let mut acts = ops::DeviceActs::new(&dev, DType::Q4_0, 2, 64).unwrap();
    assert!(ops::quantize_acts(&dev, &mut acts, &x).is_err());
}

/// The CPU reference of `ops::attention`: the query, keys, values and probabilities rounded to
/// f16 (as the reference CPU path does), everything else in f64 with the exact exp. `k, v:
/// [n, n_kv * hd]` hold positions `0..n`; row `r` of `q: [rows, n_heads * hd]` attends at
/// `positions[r]`.
fn attention_reference(
    q: &[f32],
    (k, v): (&[f32], &[f32]),
    positions: &[usize],
    (n_heads, n_kv, hd): (usize, usize, usize),
    scale: f32,
    window: Option<usize>,
) -> Vec<f32> {
    let r16 = |x: f32| half::f16::from_f32(x).to_f32() as f64;
    let mut want = vec![0f32; q.len()];
    for (r, &p) in positions.iter().enumerate() {
        for h in 0..n_heads {
            let kvh = h / (n_heads / n_kv);
            let first = window.map_or(0, |w| (p + 1).saturating_sub(w));
            let qh = &q[(r * n_heads + h) * hd..][..hd];
            let s: Vec<f64> = (first..=p)
                .map(|t| {
                    (0..hd)
                        .map(|d| r16(qh[d]) * r16(k[(t * n_kv + kvh) * hd + d]))
                        .sum::<f64>()
                        * scale as f64
                })
                .collect();
            let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
            let z: f64 = e.iter().sum();
            let probs: Vec<f64> = e.iter().map(|w| r16((w / z) as f32)).collect();
            for d in 0..hd {
                want[(r * n_heads + h) * hd + d] = (first..=p)
                    .zip(&probs)
                    .map(|(t, w)| w * r16(v[(t * n_kv + kvh) * hd + d]))
                    .sum::<f64>() as f32;
            }
        }
    }
    want
}

/// Outputs whose bits differ: their count and the first few (index, got, want).
fn attention_bit_mismatches(got: &[f32], want: &[f32]) -> (usize, Vec<(usize, f32, f32)>) {
    assert_eq!(got.len(), want.len());
    let bad: Vec<(usize, f32, f32)> = (0..got.len())
        .filter(|&i| got[i].to_bits() != want[i].to_bits())
        .map(|i| (i, got[i], want[i]))
        .collect();
    (bad.len(), bad.into_iter().take(6).collect())
}

/// The single-block prefill kernel (the exact reference of the others) against the CPU
/// reference.
#[test]
fn attention_with_gqa_and_window() {
    let Some((dev, mut rng)) = device() else {
        return;
    };
    let (n_heads, n_kv, hd, cap) = (8, 2, 64, 64);
    let n = 40;
    for window in [None, Some(9)] {
        let k = rng.vec(n * n_kv * hd, 1.0);
        let v = rng.vec(n * n_kv * hd, 1.0);
        let q = rng.vec(n * n_heads * hd, 1.0);
        let positions: Vec<i32> = (0..n as i32).collect();
        let dpos = dev.upload(&positions).unwrap();
        let mut kv = DeviceKv::new(&dev, n_kv, hd, cap).unwrap();
        ops::kv_store(
            &dev,
            &mut kv,
            &dev.upload(&k).unwrap(),
            &dev.upload(&v).unwrap(),
            &dpos,
        )
        .unwrap();
        let mut out = poisoned(&dev, q.len());
        let scale = 0.125;
        ops::attention_single_block(
            &dev,
            &mut out,
            &dev.upload(&q).unwrap(),
            &kv,
            &dpos,
            AttentionParams {
                n_heads,
                scale,
                window,
                max_pos: n - 1,
            },
        )
        .unwrap();
        let all: Vec<usize> = (0..n).collect();
        let want = attention_reference(&q, (&k, &v), &all, (n_heads, n_kv, hd), scale, window);
        let e = nmse(&dev.download(&out).unwrap(), &want);
        // Both round probabilities to f16; a probability next to an f16 rounding boundary may
        // land on the other side (ggml's exp vs f64 exp), a 2^-11 relative step.
        assert!(e < 1e-8, "attention window={window:?}: nmse {e:e}");
    }
}

/// The prefill kernels against the exact single-block kernel and the CPU reference, for every
/// head dimension they cover: the tiled exact kernel bit for bit (and `ops::attention`, which
/// picks the single-block or the tiled kernel),
/// the tensor-core kernel within a normalised error of 1e-7. GQA and plain heads, windows
/// shorter than a tile and across tiles, row counts that leave the last block partly empty,
/// prompts that continue a filled cache (first position mid-page), and a cache whose pages are
/// in reverse order.
#[test]
fn prefill_attention_matches_single_block_and_cpu() {
    let Some((dev, mut rng)) = device() else {
        return;
    };
    let heads: [(usize, usize, usize); 5] = [
        (4, 2, 32),
        (14, 2, 64),
        (8, 8, 128),
        (12, 2, 128),
        (4, 1, 256),
    ];
    // (positions already cached before the prompt, prompt rows)
    // (10, 40): more rows than the decode path takes, fewer than the tensor-core kernel's.
    let prompts = [
        (0usize, 5usize),
        (10, 40),
        (0, 64),
        (0, 200),
        (37, 91),
        (300, 64),
    ];
    let cap = 512;
    for (n_heads, n_kv, hd) in heads {
        let pages = cap / ops::KV_PAGE;
        let reversed: Vec<usize> = (0..pages).map(|i| pages + 2 - i).collect();
        let mut kv = DeviceKv::with_pages(&dev, n_kv, hd, cap, pages + 3, &reversed).unwrap();
        let n = 364;
        let k = rng.vec(n * n_kv * hd, 1.0);
        let v = rng.vec(n * n_kv * hd, 1.0);
        let all: Vec<i32> = (0..n as i32).collect();
        ops::kv_store(
            &dev,
            &mut kv,
            &dev.upload(&k).unwrap(),
            &dev.upload(&v).unwrap(),
            &dev.upload(&all).unwrap(),
        )
        .unwrap();
        let scale = 1.0 / (hd as f32).sqrt();
        for window in [None, Some(17), Some(100)] {
            for (start, rows) in prompts {
                let positions: Vec<usize> = (start..start + rows).collect();
                let q = rng.vec(rows * n_heads * hd, 3.0);
                let dq = dev.upload(&q).unwrap();
                let pos32: Vec<i32> = positions.iter().map(|&p| p as i32).collect();
                let dpos = dev.upload(&pos32).unwrap();
                let params = AttentionParams {
                    n_heads,
                    scale,
                    window,
                    max_pos: start + rows - 1,
                };
                let what = format!(
                    "heads {n_heads}/{n_kv} hd {hd} window {window:?} rows {start}..{}",
                    start + rows
                );
                let mut single = poisoned(&dev, q.len());
                ops::attention_single_block(&dev, &mut single, &dq, &kv, &dpos, params).unwrap();
                let single = dev.download(&single).unwrap();
                let mut tiled = poisoned(&dev, q.len());
                ops::attention_tiled(&dev, &mut tiled, &dq, &kv, &dpos, params).unwrap();
                let tiled = dev.download(&tiled).unwrap();
                let (bad, first) = attention_bit_mismatches(&tiled, &single);
                assert!(
                    bad == 0,
                    "{what}: {bad} of {} tiled outputs differ from the single-block kernel \
                     (index, tiled, single): {first:?}",
                    tiled.len()
                );
                let mut one_pass = poisoned(&dev, q.len());
                ops::attention_rows(&dev, &mut one_pass, &dq, &kv, &dpos, params).unwrap();
                let one_pass = dev.download(&one_pass).unwrap();
                let (bad, first) = attention_bit_mismatches(&one_pass, &single);
                assert!(
                    bad == 0,
                    "{what}: {bad} of {} one-pass outputs differ from the single-block kernel \
                     (index, one pass, single): {first:?}",
                    one_pass.len()
                );
                let mut flash = poisoned(&dev, q.len());
                ops::attention_flash(&dev, &mut flash, &dq, &kv, &dpos, params).unwrap();
                let flash = dev.download(&flash).unwrap();
                let e = nmse(&flash, &single);
                assert!(
                    e < 1e-7,
                    "{what}: tensor-core kernel vs single block nmse {e:e}"
                );
                let want = attention_reference(
                    &q,
                    (&k, &v),
                    &positions,
                    (n_heads, n_kv, hd),
                    scale,
                    window,
                );
                // 1e-7: see the decode test on the reference's f16 rounding flips.
                let e_ref = nmse(&tiled, &want);
                assert!(
                    e_ref < 1e-7,
                    "{what}: tiled vs CPU reference nmse {e_ref:e}"
                );
                if rows > ops::DECODE_ROWS {
                    // The dispatch: from FLASH_MIN_ROWS rows the tensor-core kernel (where it
                    // covers the head dimension), below that the exact kernels, bit for bit.
                    let mut routed = poisoned(&dev, q.len());
                    ops::attention(&dev, &mut routed, &dq, &mut kv, &dpos, params).unwrap();
                    let routed = dev.download(&routed).unwrap();
                    let (want, kind) = if rows >= ops::FLASH_MIN_ROWS {
                        (&flash, "tensor-core")
                    } else {
                        (&tiled, "exact")
                    };
                    assert!(
                        routed
                            .iter()
                            .zip(want)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{what}: ops::attention did not give the {kind} kernel's values"
                    );
                }
                eprintln!(
                    "{what}: tiled and one-pass bit-equal to the single block; tensor cores nmse \
                     {e:.1e}"
                );
            }
        }
    }
    // A head dimension without a kernel is an error, not a wrong answer.
    let kv = DeviceKv::new(&dev, 1, 80, 64).unwrap();
    let dpos = dev.upload(&[0i32, 1, 2, 3, 4]).unwrap();
    let dq = dev.upload(&vec![0f32; 5 * 80]).unwrap();
    let mut out = poisoned(&dev, 5 * 80);
    let params = AttentionParams {
        n_heads: 1,
        scale: 1.0,
        window: None,
        max_pos: 4,
    };
    assert!(ops::attention_flash(&dev, &mut out, &dq, &kv, &dpos, params).is_err());
    assert!(ops::attention_tiled(&dev, &mut out, &dq, &kv, &dpos, params).is_err());
    assert!(ops::attention_rows(&dev, &mut out, &dq, &kv, &dpos, params).is_err());
}

/// The decode path of `ops::attention` (at most `DECODE_ROWS` query rows; split over spans whose
/// length follows the capacity; launch independent of the position) against the single-block
/// kernel, bit for bit (only the grouping of f64 additions differs), and against the CPU
/// reference. Capacities giving the shortest span (16), a middle one (64) and the longest (256);
/// long contexts on caches whose pages are in reverse order, GQA and no GQA, a head dimension
/// that is not a multiple of 32 (and the largest, 256), windows starting mid-span and mid-group,
/// rows at different positions (span boundaries, position 0, the last position of the cache),
/// and one cache reused across row counts and positions (its scratch grows, then serves a
/// shorter context; its last-block tickets must come back to zero after every launch).
#[test]
fn decode_attention_matches_single_block_and_cpu() {
    let Some((dev, mut rng)) = device() else {
        return;
    };
    // (capacity, positions stored): 700 and 3100 cut their last span short; at 128 the one-pass
    // kernel stages K and V in shared memory for every head dimension (256 too: 130 KiB).
    let caches = [
        (700usize, 700usize),
        (3100, 3000),
        (20_000, 3000),
        (128, 128),
    ];
    let mut spans = Vec::new();
    let cases: [&[usize]; 11] = [
        &[999],
        &[2999],
        &[2999, 137],
        &[127, 128],
        &[0, 1, 2, 3],
        &[1000, 1001, 2998],
        &[5],
        &[15, 16, 17, 31],
        &[699],
        &[255, 256, 257, 64],
        &[47, 48],
    ];
    let heads: [(usize, usize, usize); 4] = [(14, 2, 64), (8, 8, 128), (12, 4, 80), (4, 1, 256)];
    for (cap, n) in caches {
        for (n_heads, n_kv, hd) in heads {
            let k = rng.vec(n * n_kv * hd, 1.0);
            let v = rng.vec(n * n_kv * hd, 1.0);
            let pages = cap.div_ceil(ops::KV_PAGE);
            let reversed: Vec<usize> = (0..pages).map(|i| pages + 4 - i).collect();
            let mut kv = DeviceKv::with_pages(&dev, n_kv, hd, cap, pages + 5, &reversed).unwrap();
            if !spans.contains(&kv.decode_span()) {
                spans.push(kv.decode_span());
            }
            let all: Vec<i32> = (0..n as i32).collect();
            ops::kv_store(
                &dev,
                &mut kv,
                &dev.upload(&k).unwrap(),
                &dev.upload(&v).unwrap(),
                &dev.upload(&all).unwrap(),
            )
            .unwrap();
            let scale = 1.0 / (hd as f32).sqrt();
            for window in [None, Some(500), Some(131), Some(1)] {
                for &positions in cases.iter().filter(|c| c.iter().all(|&p| p < n)) {
                    assert!(positions.len() <= ops::DECODE_ROWS);
                    let rows = positions.len();
                    let q = rng.vec(rows * n_heads * hd, 3.0);
                    let dq = dev.upload(&q).unwrap();
                    let pos32: Vec<i32> = positions.iter().map(|&p| p as i32).collect();
                    let dpos = dev.upload(&pos32).unwrap();
                    let params = AttentionParams {
                        n_heads,
                        scale,
                        window,
                        max_pos: *positions.iter().max().unwrap(),
                    };
                    let mut out = poisoned(&dev, q.len());
                    ops::attention(&dev, &mut out, &dq, &mut kv, &dpos, params).unwrap();
                    let got = dev.download(&out).unwrap();
                    let mut single = poisoned(&dev, q.len());
                    ops::attention_single_block(&dev, &mut single, &dq, &kv, &dpos, params)
                        .unwrap();
                    let single = dev.download(&single).unwrap();
                    let what = format!(
                        "capacity {cap} (span {}) heads {n_heads}/{n_kv} hd {hd} window \
                         {window:?} positions {positions:?}",
                        kv.decode_span()
                    );
                    let (bad, first) = attention_bit_mismatches(&got, &single);
                    assert!(
                        bad == 0,
                        "{what}: {bad} of {} outputs differ from the single-block kernel \
                         (index, decode, single block): {first:?}",
                        got.len()
                    );
                    let want = attention_reference(
                        &q,
                        (&k, &v),
                        positions,
                        (n_heads, n_kv, hd),
                        scale,
                        window,
                    );
                    // The reference takes f64 `exp` and unrounded scores, so an f16 probability
                    // now and then rounds the other way: the exact CPU attention itself (whose
                    // bits the single-block kernel gives) was up to 1.5e-8 from it on 2 of
                    // 13,920 of these cases (30 seeds), hence the prefill test's 1e-7.
                    let e = nmse(&got, &want);
                    assert!(e < 1e-7, "{what}: nmse {e:e} against the CPU reference");
                }
            }
            eprintln!(
                "decode attention capacity {cap} (span {}) heads {n_heads}/{n_kv} hd {hd}: \
                 bit-equal to the single block",
                kv.decode_span()
            );
        }
    }
    assert_eq!(
        spans,
        [16, 64, 256],
        "the capacities no longer cover the span range"
    );
}

#[test]
fn argmax_picks_lowest_index_of_maximum() {
    let Some((dev, mut rng)) = device() else {
        return;
    };
    // Ties inside one block's slice and across blocks (slices of 2048+), NaN never chosen,
    // all -inf or NaN gives 0, as the CPU's `synaptix_sample::argmax`; repeated launches
    // reuse the block counter.
    let cpu = |x: &[f32]| synaptix_sample::argmax(x) as i32;
    let mut cases: Vec<Vec<f32>> = Vec::new();
    let mut x = rng.vec(151_936, 10.0);
    x[7] = 50.0;
    x[90_000] = 50.0;
    cases.push(x);
    let mut x = rng.vec(262_144, 1.0);
    x[200_001] = f32::NAN;
    x[150_000] = 9.0;
    x[150_001] = 9.0;
    x[262_143] = 9.0;
    cases.push(x);
    cases.push(vec![f32::NEG_INFINITY; 5000]);
    cases.push(vec![f32::NAN; 3000]);
    let mut x = vec![1.0f32; 10_000];
    x[0] = f32::NAN;
    cases.push(x);
    cases.push(rng.vec(100, 1.0));
    for _round in 0..3 {
        for x in &cases {
            let mut out = dev.upload(&[-1i32]).unwrap();
            ops::argmax(&dev, &dev.upload(x).unwrap(), &mut out).unwrap();
            assert_eq!(dev.download(&out).unwrap(), vec![cpu(x)], "n = {}", x.len());
        }
    }
}

#[test]
fn shape_errors_are_reported_not_launched() {
    let Some((dev, _)) = device() else { return };
    let a = dev.upload(&[1f32; 4]).unwrap();
    let b = dev.upload(&[1f32; 5]).unwrap();
    let mut out = poisoned(&dev, 4);
    assert!(ops::add(&dev, &mut out, &a, &b).is_err());
    assert!(DeviceMatrix::upload(&dev, DType::Q4K, 2, 100, &[0u8; 10]).is_err());
    assert!(DeviceMatrix::upload(&dev, DType::IQ2XXS, 1, 256, &[0u8; 66]).is_err());
}

#[test]
fn paged_kv_cache_gives_the_same_attention_for_any_page_order() {
    let Some((dev, mut rng)) = device() else {
        return;
    };
    let (n_heads, n_kv, hd, cap) = (4usize, 2usize, 32usize, 70usize);
    let n = 53;
    let k = rng.vec(n * n_kv * hd, 1.0);
    let v = rng.vec(n * n_kv * hd, 1.0);
    let q = rng.vec(n * n_heads * hd, 1.0);
    let positions: Vec<i32> = (0..n as i32).collect();
    let dpos = dev.upload(&positions).unwrap();
    let (dk, dv, dq) = (
        dev.upload(&k).unwrap(),
        dev.upload(&v).unwrap(),
        dev.upload(&q).unwrap(),
    );
    let pages = cap.div_ceil(ops::KV_PAGE);
    // Pages scattered over a larger pool, in reverse and interleaved order.
    let scattered: Vec<usize> = (0..pages).map(|i| 2 * (pages - 1 - i) + 1).collect();
    let mut results = Vec::new();
    for kv in [
        DeviceKv::new(&dev, n_kv, hd, cap).unwrap(),
        DeviceKv::with_pages(&dev, n_kv, hd, cap, 2 * pages, &scattered).unwrap(),
    ] {
        let mut kv = kv;
        ops::kv_store(&dev, &mut kv, &dk, &dv, &dpos).unwrap();
        let mut out = poisoned(&dev, q.len());
        let params = AttentionParams {
            n_heads,
            scale: 0.2,
            window: Some(20),
            max_pos: n - 1,
        };
        ops::attention_single_block(&dev, &mut out, &dq, &kv, &dpos, params).unwrap();
        let prefill = dev.download(&out).unwrap();
        let mut routed = poisoned(&dev, q.len());
        ops::attention(&dev, &mut routed, &dq, &mut kv, &dpos, params).unwrap();
        results.push(dev.download(&routed).unwrap());
        // The last two rows again through the decode path (two query rows): the exact
        // kernel's values.
        let width = n_heads * hd;
        let dq2 = dev.upload(&q[(n - 2) * width..]).unwrap();
        let dpos2 = dev.upload(&positions[n - 2..]).unwrap();
        let mut out2 = poisoned(&dev, 2 * width);
        ops::attention(&dev, &mut out2, &dq2, &mut kv, &dpos2, params).unwrap();
        let decode = dev.download(&out2).unwrap();
        let (bad, first) = attention_bit_mismatches(&decode, &prefill[(n - 2) * width..]);
        assert!(
            bad == 0,
            "decode rows differ from the prefill rows (index, decode, prefill): {first:?}"
        );
        results.push(prefill);
    }
    // [flash, exact] for each page order.
    assert!(results.iter().all(|r| r.iter().all(|v| v.is_finite())));
    assert_eq!(
        results[0], results[2],
        "page order changed the flash result"
    );
    assert_eq!(
        results[1], results[3],
        "page order changed the exact result"
    );
    assert!(DeviceKv::with_pages(&dev, n_kv, hd, cap, 2, &scattered).is_err());
}

/// The fused epilogue (`+ bias`, then `+ residual`) gives bit for bit what the CPU's matmul
/// followed by its separate additions gives, for quantized and float weights.
#[test]
fn matvec_epilogue_adds_bias_then_residual_like_the_cpu() {
    let Some((dev, mut rng)) = device() else {
        return;
    };
    // Q8_0 with 4864 and 1056 columns: from its split copy on Hopper (rows of two copies, a
    // partial group); 140,000 rows give each warp of the split-copy kernel more than 32 rows.
    let cases = [
        (DType::Q4_0, 512, 300),
        (DType::Q8_0, 512, 300),
        (DType::Q8_0, 4864, 300),
        (DType::Q8_0, 1056, 140_000),
        (DType::Q4K, 512, 300),
        (DType::Q6K, 512, 300),
        (DType::F16, 512, 300),
    ];
    for (dtype, cols, rows) in cases {
        let bytes = random_weights(&mut rng, dtype, rows, cols);
        let mut dm = DeviceMatrix::upload(&dev, dtype, rows, cols, &bytes).unwrap();
        if dtype == DType::Q8_0 && cols > 512 {
            dm.split_copy(&dev).unwrap();
        }
        let ms: &[usize] = if rows > 1000 { &[1] } else { &[1, 3, 9] };
        for &m in ms {
            let x = activations(&mut rng, m, cols);
            let bias = rng.vec(rows, 1.0);
            let residual = rng.vec(m * rows, 4.0);
            let product = cpu_matmul(dtype, &bytes, rows, cols, &x, m);
            let (db, dr, dx) = (
                dev.upload(&bias).unwrap(),
                dev.upload(&residual).unwrap(),
                dev.upload(&x).unwrap(),
            );
            for (with_bias, with_residual) in [(true, false), (false, true), (true, true)] {
                let want: Vec<f32> = product
                    .iter()
                    .enumerate()
                    .map(|(i, &p)| {
                        let v = if with_bias { p + bias[i % rows] } else { p };
                        if with_residual {
                            residual[i] + v
                        } else {
                            v
                        }
                    })
                    .collect();
                let epi = ops::Epilogue {
                    bias: with_bias.then_some(&db),
                    residual: with_residual.then_some(&dr),
                };
                let mut y = poisoned(&dev, m * rows);
                ops::matvec_with(&dev, &mut y, &dm, &dx, epi).unwrap();
                let got = dev.download(&y).unwrap();
                let (n, first) = bit_mismatches(&got, &want, rows);
                assert!(
                    n == 0,
                    "{dtype} cols {cols} m={m} bias {with_bias} residual {with_residual}: {n} outputs differ:\n  {first}"
                );
            }
        }
    }
    // A bias or residual of the wrong length is an error, not a launch.
    let dm = DeviceMatrix::upload(&dev, DType::F16, 4, 32, &[0u8; 4 * 32 * 2]).unwrap();
    let (x, short) = (
        dev.upload(&[0f32; 32]).unwrap(),
        dev.upload(&[0f32; 3]).unwrap(),
    );
    let mut y = poisoned(&dev, 4);
    let epi = ops::Epilogue {
        bias: Some(&short),
        residual: None,
    };
    assert!(ops::matvec_with(&dev, &mut y, &dm, &x, epi).is_err());
}

/// `rope_qk` (queries and keys in one launch, optional query scale) gives bit for bit what two
/// `rope` launches and a `scale` give.
#[test]
fn rope_qk_matches_separate_rotations_and_scale() {
    let Some((dev, mut rng)) = device() else {
        return;
    };
    let (rows, n_q, n_k, head_dim) = (5, 4, 2, 64);
    for (neox, n_rot, q_scale) in [
        (false, 64, None),
        (true, 64, Some(0.125f32)),
        (true, 48, None),
        (false, 64, Some(0.3)),
    ] {
        let p = RopeParams {
            n_heads: n_q,
            head_dim,
            n_rot,
            neox,
        };
        let q = rng.vec(rows * n_q * head_dim, 1.0);
        let k = rng.vec(rows * n_k * head_dim, 1.0);
        let table = dev.upload(&rng.vec(rows * n_rot, 1.0)).unwrap();
        let (mut dq, mut dk) = (dev.upload(&q).unwrap(), dev.upload(&k).unwrap());
        ops::rope_qk(&dev, &mut dq, &mut dk, &table, p, n_k, q_scale).unwrap();
        let (mut wq, mut wk) = (dev.upload(&q).unwrap(), dev.upload(&k).unwrap());
        ops::rope(&dev, &mut wq, &table, p).unwrap();
        let kp = RopeParams { n_heads: n_k, ..p };
        ops::rope(&dev, &mut wk, &table, kp).unwrap();
        if let Some(s) = q_scale {
            ops::scale(&dev, &mut wq, s).unwrap();
        }
        let bits = |b: &DeviceBuffer<f32>| -> Vec<u32> {
            dev.download(b)
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect()
        };
        assert_eq!(bits(&dq), bits(&wq), "queries neox={neox} n_rot={n_rot}");
        assert_eq!(bits(&dk), bits(&wk), "keys neox={neox} n_rot={n_rot}");
    }
    // A query scale with a partial rotation would leave elements unscaled: refused.
    let p = RopeParams {
        n_heads: 1,
        head_dim: 64,
        n_rot: 32,
        neox: false,
    };
    let (mut q, mut k) = (
        dev.upload(&[0f32; 64]).unwrap(),
        dev.upload(&[0f32; 64]).unwrap(),
    );
    let table = dev.upload(&[0f32; 32]).unwrap();
    assert!(ops::rope_qk(&dev, &mut q, &mut k, &table, p, 1, Some(0.5)).is_err());
}

/// The fused RMSNorm + activation quantization gives bit for bit what `rms_norm` then
/// `quantize_acts` give, for the three activation formats.
#[test]
fn fused_rms_norm_quantize_matches_separate_ops() {
    let Some((dev, mut rng)) = device() else {
        return;
    };
    for (weight, rows, cols) in [
        (DType::Q4_0, 1, 896),
        (DType::Q4_1, 3, 2048),
        (DType::Q4K, 1, 3584),
        (DType::Q6K, 5, 1536),
        (DType::Q8_0, 7, 640),
    ] {
        let x = activations(&mut rng, rows, cols);
        let w = rng.vec(cols, 1.0);
        let (dx, dw) = (dev.upload(&x).unwrap(), dev.upload(&w).unwrap());
        let mut want_y = poisoned(&dev, rows * cols);
        ops::rms_norm(&dev, &mut want_y, &dx, &dw, 1e-6).unwrap();
        let mut want = ops::DeviceActs::new(&dev, weight, rows, cols).unwrap();
        ops::quantize_acts(&dev, &mut want, &want_y).unwrap();
        let mut got_y = poisoned(&dev, rows * cols);
        let mut got = ops::DeviceActs::new(&dev, weight, rows, cols).unwrap();
        synaptix_kernels_cuda::fused::rms_norm_quantized(
            &dev, &mut got_y, &mut got, &dx, &dw, 1e-6,
        )
        .unwrap();
        let bits = |b: &DeviceBuffer<f32>| -> Vec<u32> {
            dev.download(b)
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect()
        };
        assert_eq!(
            bits(&got_y),
            bits(&want_y),
            "{weight} [{rows}, {cols}]: normed values"
        );
        assert_eq!(
            got.to_ggml_bytes(&dev).unwrap(),
            want.to_ggml_bytes(&dev).unwrap(),
            "{weight} [{rows}, {cols}]: quantized activations"
        );
    }
}

/// RMSNorm inside the k-quant row kernel (`ops::rms_norm_matvec_many`: each block normalises
/// and quantizes the row itself) gives bit for bit the fused norm + quantization followed by
/// `matvec_many`, the path it replaces: for shared launches (Q4_K, Q5_K) with biases, a Q6_K
/// part in its own launch beside them (Q4_K_M's V), long rows (33 super-blocks), and rows
/// outside its reach (not whole super-blocks: Ok(false), nothing written).
#[test]
fn rms_norm_matvec_many_matches_norm_then_matvec() {
    let Some((dev, mut rng)) = device() else {
        return;
    };
    // 3584 × (Q4_K 3584, Q4_K 512, Q6_K 512): 7B Q4_K_M's Q/K/V, one mixed-format launch
    // (`matvec_q8_rows_mixed_*`); so 1.5B's, and Q5_K beside Q6_K with odd row counts. Two
    // parts of two formats: a launch each, the second in the LATE form.
    let cases: [(usize, &[(DType, usize)]); 7] = [
        (
            3584,
            &[(DType::Q4K, 3584), (DType::Q4K, 512), (DType::Q6K, 512)],
        ),
        (
            1536,
            &[(DType::Q4K, 1536), (DType::Q4K, 256), (DType::Q4K, 256)],
        ),
        (
            1536,
            &[(DType::Q4K, 1536), (DType::Q4K, 256), (DType::Q6K, 256)],
        ),
        (2048, &[(DType::Q5K, 333), (DType::Q5K, 77)]),
        (
            2048,
            &[(DType::Q5K, 333), (DType::Q5K, 77), (DType::Q6K, 129)],
        ),
        (8448, &[(DType::Q6K, 600), (DType::Q4K, 500)]),
        (3584, &[(DType::Q4K, 4000), (DType::Q4K, 4000)]),
    ];
    for (cols, mats) in cases {
        let x = activations(&mut rng, 1, cols);
        let g = rng.vec(cols, 1.0);
        let (dx, dg) = (dev.upload(&x).unwrap(), dev.upload(&g).unwrap());
        let (weights, biases) = random_matrices(&dev, &mut rng, mats, cols);
        let run = |fused| norm_product_bits(&dev, &weights, &biases, (&dx, &dg), fused);
        let (got, want) = (
            run(Some(ops::rms_norm_matvec_many as ops::NormedMatvec)),
            run(None),
        );
        assert_same_outputs(&got, &want, &format!("cols {cols} {mats:?}"));
    }
    // Rows that are not whole super-blocks: not taken, nothing written.
    assert_norm_product_refused(&dev, &mut rng, ops::rms_norm_matvec_many, DType::Q8_0, 896);
}

/// RMSNorm inside the short legacy-format kernel (`ops::rms_norm_matvec_short_many`: each lane
/// normalises and quantizes its own 32-value block) gives bit for bit the fused norm +
/// quantization followed by `matvec_many`: Q/K/V-like parts with biases at Qwen2.5 0.5B's width,
/// gate/up, Q8_1 formats, mixed formats (a launch per run), a row with a block of zeros (scale
/// 0), rows of two blocks a lane (1.5B's Q/K/V, 2048, a partial second block), a NaN inside a
/// block (C's running maximum after it); longer rows and other formats are refused.
#[test]
fn rms_norm_matvec_short_many_matches_norm_then_matvec() {
    let Some((dev, mut rng)) = device() else {
        return;
    };
    let cases: [(usize, &[(DType, usize)]); 11] = [
        (
            896,
            &[(DType::Q8_0, 896), (DType::Q8_0, 128), (DType::Q8_0, 128)],
        ),
        (896, &[(DType::Q8_0, 4864), (DType::Q8_0, 4864)]),
        (
            896,
            &[(DType::Q5_0, 896), (DType::Q5_0, 128), (DType::Q8_0, 128)],
        ),
        (640, &[(DType::Q4_1, 300), (DType::Q5_1, 200)]),
        (1024, &[(DType::Q4_0, 100), (DType::Q4_0, 37)]),
        (96, &[(DType::Q8_0, 7)]),
        (
            1536,
            &[(DType::Q8_0, 1536), (DType::Q8_0, 256), (DType::Q8_0, 256)],
        ),
        (2048, &[(DType::Q4_1, 300), (DType::Q5_0, 200)]),
        (1056, &[(DType::Q5_1, 129)]),
        (896, &[(DType::Q8_0, 64)]),
        (896, &[(DType::IQ4NL, 896), (DType::Q8_0, 128)]),
    ];
    for (n, (cols, mats)) in cases.into_iter().enumerate() {
        let mut x = activations(&mut rng, 1, cols);
        if n == 0 {
            x[32..64].fill(0.0);
        }
        let mut g = rng.vec(cols, 1.0);
        if n == 9 {
            // A NaN inside block 1 (element 8): its scale comes from the values after it.
            g[40] = f32::NAN;
        }
        let (dx, dg) = (dev.upload(&x).unwrap(), dev.upload(&g).unwrap());
        let (weights, biases) = random_matrices(&dev, &mut rng, mats, cols);
        let run = |fused| norm_product_bits(&dev, &weights, &biases, (&dx, &dg), fused);
        let (got, want) = (
            run(Some(ops::rms_norm_matvec_short_many as ops::NormedMatvec)),
            run(None),
        );
        assert_same_outputs(&got, &want, &format!("cols {cols} {mats:?}"));
    }
    assert_norm_product_refused(
        &dev,
        &mut rng,
        ops::rms_norm_matvec_short_many,
        DType::Q8_0,
        2080,
    );
    assert_norm_product_refused(
        &dev,
        &mut rng,
        ops::rms_norm_matvec_short_many,
        DType::Q4K,
        1024,
    );
}

/// The bits of each matrix's outputs for one row `x` normalised by `g` (eps 1e-6): through
/// `fused` (a product with the norm inside, which must take the parts), or with None through the
/// path it replaces (RMSNorm, then each part's own activations and `matvec_many`).
fn norm_product_bits(
    dev: &CudaDevice,
    weights: &[DeviceMatrix],
    biases: &[DeviceBuffer<f32>],
    (x, g): (&DeviceBuffer<f32>, &DeviceBuffer<f32>),
    fused: Option<ops::NormedMatvec>,
) -> Vec<Vec<u32>> {
    let mut ys: Vec<DeviceBuffer<f32>> = weights.iter().map(|w| poisoned(dev, w.rows)).collect();
    let mut parts = matvec_parts(&mut ys, weights, biases);
    if let Some(product) = fused {
        assert!(product(dev, &mut parts, x, g, 1e-6).unwrap());
    } else {
        let mut normed = poisoned(dev, x.len());
        ops::rms_norm(dev, &mut normed, x, g, 1e-6).unwrap();
        for p in parts.iter_mut() {
            let mut acts = ops::DeviceActs::new(dev, p.w.dtype, 1, x.len()).unwrap();
            ops::quantize_acts(dev, &mut acts, &normed).unwrap();
            ops::matvec_many(dev, std::slice::from_mut(p), &normed, Some(&acts)).unwrap();
        }
    }
    drop(parts);
    ys.iter()
        .map(|y| {
            dev.download(y)
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect()
        })
        .collect()
}

/// Panics unless every matrix's outputs (`got[i]`, `want[i]`: f32 bits) are the same.
fn assert_same_outputs(got: &[Vec<u32>], want: &[Vec<u32>], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: matrices");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let differ = g.iter().zip(w).filter(|(a, b)| a != b).count();
        assert!(
            differ == 0 && g.len() == w.len(),
            "{what}: matrix {i}: {differ} of {} outputs differ",
            g.len()
        );
    }
}

/// A product with RMSNorm inside (`ops::rms_norm_matvec_*many`) asked for a `dtype` matrix of
/// 64 rows of `cols` that its kernel does not take: Ok(false), and the output keeps its poison.
fn assert_norm_product_refused(
    dev: &CudaDevice,
    rng: &mut Rng,
    product: ops::NormedMatvec,
    dtype: DType,
    cols: usize,
) {
    let bytes = random_weights(rng, dtype, 64, cols);
    let w = DeviceMatrix::upload(dev, dtype, 64, cols, &bytes).unwrap();
    let mut y = poisoned(dev, 64);
    let (dx, dg) = (
        dev.upload(&activations(rng, 1, cols)).unwrap(),
        dev.upload(&rng.vec(cols, 1.0)).unwrap(),
    );
    let mut parts = [ops::MatvecPart {
        w: &w,
        y: &mut y,
        bias: None,
    }];
    assert!(
        !product(dev, &mut parts, &dx, &dg, 1e-6).unwrap(),
        "{dtype} [64, {cols}] taken"
    );
    assert!(
        dev.download(&y).unwrap().iter().all(|v| v.is_nan()),
        "{dtype} [64, {cols}] written"
    );
}

/// The output head with the greedy pick in its launch (`ops::rms_norm_matvec_pick`,
/// `matvec_q8p_pick`): the logits bit for bit `rms_norm_matvec_q8s_many`'s, the pick the CPU
/// argmax of them (first maximum), on 0.5B's head shape, on fewer rows than the grid's blocks,
/// on rows that are all the same (every logit equal: index 0), and on rows longer than 1024
/// values (1.5B's width, and 7B's with a partial last group; `matvec_q8s` inside); twice each,
/// the block counter back at zero between launches.
#[test]
fn rms_norm_matvec_pick_matches_products_and_argmax() {
    let Some((dev, mut rng)) = device() else {
        return;
    };
    for (rows, cols, same_rows) in [
        (151_936, 896, false),
        (300, 512, false),
        (5000, 1024, true),
        (40_000, 1536, false),
        (9000, 3584, false),
        (3000, 2080, true),
    ] {
        let x = rng.vec(cols, 1.0);
        let g = rng.vec(cols, 1.0);
        let (dx, dg) = (dev.upload(&x).unwrap(), dev.upload(&g).unwrap());
        let mut bytes = random_weights(&mut rng, DType::Q8_0, rows, cols);
        if same_rows {
            let row_bytes = bytes.len() / rows;
            let first = bytes[..row_bytes].to_vec();
            for row in bytes.chunks_exact_mut(row_bytes) {
                row.copy_from_slice(&first);
            }
        }
        let mut w = DeviceMatrix::upload(&dev, DType::Q8_0, rows, cols, &bytes).unwrap();
        if !w.split_copy(&dev).unwrap() {
            eprintln!("no split copies on this GPU (sm_90+ only): skipped");
            return;
        }
        let mut want = poisoned(&dev, rows);
        {
            let mut parts = [ops::MatvecPart {
                w: &w,
                y: &mut want,
                bias: None,
            }];
            assert!(ops::rms_norm_matvec_q8s_many(&dev, &mut parts, &dx, &dg, 1e-6).unwrap());
        }
        let want = dev.download(&want).unwrap();
        for round in 0..2 {
            let mut y = poisoned(&dev, rows);
            let mut pick = dev.upload(&[-1i32]).unwrap();
            assert!(
                ops::rms_norm_matvec_pick(&dev, &mut y, &w, &dx, &dg, 1e-6, &mut pick).unwrap()
            );
            let got = dev.download(&y).unwrap();
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<u32>>();
            assert_same_outputs(
                &[bits(&got)],
                &[bits(&want)],
                &format!("pick head [{rows} x {cols}]"),
            );
            let expected = synaptix_sample::argmax(&want) as i32;
            if same_rows {
                assert_eq!(expected, 0);
            }
            assert_eq!(
                dev.download(&pick).unwrap(),
                vec![expected],
                "[{rows} x {cols}] round {round}"
            );
        }
        eprintln!("head with pick [{rows} x {cols}]: logits bit-equal, pick the CPU's argmax");
    }
    // A matrix without a split copy: refused, nothing launched.
    let bytes = random_weights(&mut rng, DType::Q8_0, 4000, 2048);
    let w = DeviceMatrix::upload(&dev, DType::Q8_0, 4000, 2048, &bytes).unwrap();
    let (dx, dg) = (
        dev.upload(&rng.vec(2048, 1.0)).unwrap(),
        dev.upload(&rng.vec(2048, 1.0)).unwrap(),
    );
    let mut y = poisoned(&dev, 4000);
    let mut pick = dev.upload(&[-1i32]).unwrap();
    assert!(!ops::rms_norm_matvec_pick(&dev, &mut y, &w, &dx, &dg, 1e-6, &mut pick).unwrap());
    assert_eq!(dev.download(&pick).unwrap(), vec![-1]);
}

/// RMSNorm inside the Q8_0 split-copy kernel (`ops::rms_norm_matvec_q8s_many`: each block
/// normalises and quantizes the row itself) gives bit for bit the separate norm, quantization
/// and products on the stored blocks (the row and tile kernels): gate and up of Qwen2.5 7B's
/// width, Q/K/V-like parts with biases, rows with a partial last group (2080, 8448), 6-7 rows a
/// warp (2 × 13,000 of 2080: sets of several rows where `matvec_q8p` takes them) and 0.5B's
/// output head (151,936 × 896, `matvec_q8p` by default); rows of 2049 to 4096 values take the
/// one-round prologue (`matvec_q8s_quad`), also with a norm weight that puts a NaN, an infinity
/// and a block of zeros into the normalised row (the quantizer's special cases); matrices without
/// split copies are refused.
#[test]
fn rms_norm_matvec_q8s_many_matches_norm_then_matvec() {
    let Some((dev, mut rng)) = device() else {
        return;
    };
    let cases: [(usize, &[(DType, usize)]); 8] = [
        (3584, &[(DType::Q8_0, 4000), (DType::Q8_0, 4000)]),
        (3584, &[(DType::Q8_0, 700)]),
        (2080, &[(DType::Q8_0, 500)]),
        (2080, &[(DType::Q8_0, 13000), (DType::Q8_0, 13000)]),
        (896, &[(DType::Q8_0, 151936)]),
        (
            3584,
            &[(DType::Q8_0, 896), (DType::Q8_0, 128), (DType::Q8_0, 128)],
        ),
        (2080, &[(DType::Q8_0, 1000)]),
        (8448, &[(DType::Q8_0, 600), (DType::Q8_0, 300)]),
    ];
    for (case, (cols, mats)) in cases.into_iter().enumerate() {
        let x = activations(&mut rng, 1, cols);
        let mut g = rng.vec(cols, 1.0);
        if case == 1 || case == 2 {
            g[5] = f32::NAN;
            g[100] = f32::INFINITY;
            for v in &mut g[64..96] {
                *v = 0.0;
            }
        }
        let (dx, dg) = (dev.upload(&x).unwrap(), dev.upload(&g).unwrap());
        let (mut weights, biases) = random_matrices(&dev, &mut rng, mats, cols);
        // Output heads get split copies at upload: set them aside for the separate ops.
        for w in weights.iter_mut() {
            w.split = None;
        }
        let download = |ys: &[DeviceBuffer<f32>]| -> Vec<Vec<u32>> {
            ys.iter()
                .map(|y| {
                    dev.download(y)
                        .unwrap()
                        .iter()
                        .map(|v| v.to_bits())
                        .collect()
                })
                .collect()
        };
        // The separate ops on the stored blocks, before any split copy exists.
        let mut ys: Vec<DeviceBuffer<f32>> =
            weights.iter().map(|w| poisoned(&dev, w.rows)).collect();
        {
            let mut parts = matvec_parts(&mut ys, &weights, &biases);
            let mut normed = poisoned(&dev, cols);
            ops::rms_norm(&dev, &mut normed, &dx, &dg, 1e-6).unwrap();
            let mut acts = ops::DeviceActs::new(&dev, DType::Q8_0, 1, cols).unwrap();
            ops::quantize_acts(&dev, &mut acts, &normed).unwrap();
            ops::matvec_many(&dev, &mut parts, &normed, Some(&acts)).unwrap();
        }
        let want = download(&ys);
        let mut split = true;
        for w in weights.iter_mut() {
            split &= w.split_copy(&dev).unwrap();
        }
        if !split {
            eprintln!("no split copies on this GPU (sm_90+ only): skipped");
            return;
        }
        let mut ys: Vec<DeviceBuffer<f32>> =
            weights.iter().map(|w| poisoned(&dev, w.rows)).collect();
        {
            let mut parts = matvec_parts(&mut ys, &weights, &biases);
            assert!(ops::rms_norm_matvec_q8s_many(&dev, &mut parts, &dx, &dg, 1e-6).unwrap());
        }
        let got = download(&ys);
        assert_same_outputs(&got, &want, &format!("cols {cols} {mats:?}"));
        eprintln!("q8s norm inside, cols {cols} {mats:?}: bit-equal to norm, quantize, matvec");
    }
    // A Q8_0 matrix without a split copy (too small for one at upload), or another format: not
    // taken, nothing written.
    assert_norm_product_refused(
        &dev,
        &mut rng,
        ops::rms_norm_matvec_q8s_many,
        DType::Q8_0,
        3584,
    );
    assert_norm_product_refused(
        &dev,
        &mut rng,
        ops::rms_norm_matvec_q8s_many,
        DType::Q4_0,
        3584,
    );
}

/// Decode of long k-quant rows (up to Qwen2.5 7B's MLP down projection, k = 18944), through
/// the one-row kernel (`matvec_q8_rows_*`, rounds of 32 super-blocks across row boundaries) or
/// the block-step kernel, bit for bit the CPU's.
#[test]
fn matvec_matches_cpu_long_k_quant_rows() {
    let Some((dev, mut rng)) = device() else {
        return;
    };
    // 7936 columns (31 super-blocks: rounds of 32 cross rows) take the row kernel for Q3_K to
    // Q5_K; 18944 columns the block-step kernel.
    for dtype in [DType::Q3K, DType::Q4K, DType::Q5K, DType::Q6K] {
        for cols in [7936, 18_944] {
            assert_matvec_bit_exact(&dev, &mut rng, dtype, (130, cols), &[1]);
        }
    }
}

/// The fused MLP activation + quantization gives bit for bit what `glu` then `quantize_acts`
/// give (SwiGLU and the GELU table; Q8_0, Q8_1 and Q8_K activations).
#[test]
fn fused_glu_quantize_matches_separate_ops() {
    let Some((dev, mut rng)) = device() else {
        return;
    };
    let dtable = dev.upload(&gelu_table()).unwrap();
    for kind in [ops::Glu::Silu, ops::Glu::GeluTanh] {
        for (weight, rows, cols) in [
            (DType::Q4_0, 1, 4864),
            (DType::Q4_1, 2, 1024),
            (DType::Q5_1, 3, 2048),
            (DType::Q4K, 1, 8960),
            (DType::Q6K, 2, 4864),
        ] {
            let gate = rng.vec(rows * cols, 4.0);
            let up = rng.vec(rows * cols, 2.0);
            let (dg, du) = (dev.upload(&gate).unwrap(), dev.upload(&up).unwrap());
            let mut want_y = poisoned(&dev, rows * cols);
            ops::glu(&dev, kind, &mut want_y, &dg, &du, cols, Some(&dtable)).unwrap();
            let mut want = ops::DeviceActs::new(&dev, weight, rows, cols).unwrap();
            ops::quantize_acts(&dev, &mut want, &want_y).unwrap();
            let mut got_y = poisoned(&dev, rows * cols);
            let mut got = ops::DeviceActs::new(&dev, weight, rows, cols).unwrap();
            synaptix_kernels_cuda::fused::glu_quantized(
                &dev,
                kind,
                &mut got_y,
                &mut got,
                &dg,
                &du,
                Some(&dtable),
            )
            .unwrap();
            let bits = |b: &DeviceBuffer<f32>| -> Vec<u32> {
                dev.download(b)
                    .unwrap()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect()
            };
            assert_eq!(
                bits(&got_y),
                bits(&want_y),
                "{kind:?} {weight}: activations"
            );
            assert_eq!(
                got.to_ggml_bytes(&dev).unwrap(),
                want.to_ggml_bytes(&dev).unwrap(),
                "{kind:?} {weight}: quantized activations"
            );
        }
    }
}

/// Two or three matrices of one format in one launch (`matvec_many`: Q, K and V; gate and up)
/// give bit for bit the CPU's products plus bias, for every kernel that shares launches (short
/// and long legacy rows, the k-quant row kernel, floats), with matrices of different heights so
/// that rounds and warps cross from one matrix into the next.
#[test]
fn matvec_many_matches_separate_products() {
    let Some((dev, mut rng)) = device() else {
        return;
    };
    // Q8_0 rows of 2048 values or more, and launches of 40,000 rows or more, from split copies
    // on Hopper (matvec_q8s_bulk): 3584 one copy per row, 8448 three (the last group partial).
    // 7B's gate and up (2 × 18944 × 3584: 8-9 rows a warp, sets of 4, 4 and 1 rows where
    // `matvec_q8p` takes them: `SYNAPTIX_KERNEL_DEFINES=Q8S_PIECES=65536`), 26,344 rows of 2080
    // (6-7 rows a warp: sets of 2 and 3 rows, a last group of one block, sets crossing into the
    // second matrix) and 50,000 rows of 896 (`matvec_q8p` by default: 11-12 rows a warp, a last
    // group of 12 blocks).
    // Q8_0 3072 × (3072, 768, 768) stays unsplit (below): 4,608 rows, more than one wave of
    // the one-row-per-warp kernel on an H200, so the staged kernel with 16 lanes a row.
    let cases: [(DType, usize, &[usize]); 20] = [
        (DType::Q8_0, 3072, &[3072, 768, 768]),
        (DType::Q5_0, 896, &[896, 128, 128]),
        (DType::Q8_0, 896, &[4864, 4864]),
        (DType::Q8_0, 1536, &[1536, 256, 256]),
        (DType::Q8_0, 3584, &[3584, 512, 512]),
        (DType::Q8_0, 8448, &[700, 300]),
        (DType::Q8_0, 3584, &[18944, 18944]),
        (DType::Q8_0, 2080, &[13000, 13344]),
        (DType::Q8_0, 896, &[30000, 20000]),
        (DType::Q4_0, 3584, &[9472, 9472]),
        (DType::IQ4NL, 3584, &[9472, 9472]),
        (DType::IQ4XS, 3584, &[9472, 9472]),
        (DType::IQ4XS, 1024, &[1024, 128, 128]),
        (DType::Q4_1, 2048, &[700, 300]),
        (DType::Q4K, 1536, &[1536, 256, 256]),
        (DType::Q5K, 2048, &[333, 77, 500]),
        (DType::Q4K, 3584, &[18944, 18944]),
        (DType::Q4K, 8448, &[600, 500]),
        (DType::Q6K, 1536, &[1536, 256, 256]),
        (DType::F16, 896, &[896, 128, 128]),
    ];
    for (dtype, cols, heights) in cases {
        let x = activations(&mut rng, 1, cols);
        let dx = dev.upload(&x).unwrap();
        let acts = ops::activation_format(dtype).map(|_| {
            let mut a = ops::DeviceActs::new(&dev, dtype, 1, cols).unwrap();
            ops::quantize_acts(&dev, &mut a, &dx).unwrap();
            a
        });
        let mut wants = Vec::new();
        let mut mats = Vec::new();
        let mut biases = Vec::new();
        for &rows in heights {
            let (bytes, bias, want) = weights_bias_and_product(&mut rng, dtype, rows, &x);
            wants.push(want);
            let mut m = DeviceMatrix::upload(&dev, dtype, rows, cols, &bytes).unwrap();
            let unsplit = cols == 3072;
            if dtype == DType::Q8_0
                && !unsplit
                && (cols >= 2048 || heights.iter().sum::<usize>() >= 40_000)
            {
                m.split_copy(&dev).unwrap();
            }
            mats.push(m);
            biases.push(dev.upload(&bias).unwrap());
        }
        let mut ys: Vec<DeviceBuffer<f32>> = heights.iter().map(|&r| poisoned(&dev, r)).collect();
        let mut parts: Vec<ops::MatvecPart> = ys
            .iter_mut()
            .zip(mats.iter().zip(&biases))
            .map(|(y, (w, b))| ops::MatvecPart {
                w,
                y,
                bias: Some(b),
            })
            .collect();
        ops::matvec_many(&dev, &mut parts, &dx, acts.as_ref()).unwrap();
        drop(parts);
        for (i, (y, want)) in ys.iter().zip(&wants).enumerate() {
            let got = dev.download(y).unwrap();
            let (n, first) = bit_mismatches(&got, want, heights[i]);
            assert!(
                n == 0,
                "{dtype} cols {cols} heights {heights:?}: matrix {i}: {n} of {} outputs differ:\n  {first}",
                got.len()
            );
        }
    }
}

/// `rope_qk_store` gives bit for bit what `rope_qk` then `kv_store` give: the rotated queries
/// and keys, and every f16 of both caches (paged in reverse order), for both RoPE layouts,
/// partial rotations and a query scale, with one and several rows.
#[test]
fn rope_qk_store_matches_rope_then_store() {
    let Some((dev, mut rng)) = device() else {
        return;
    };
    let (n_q, n_k, head_dim, cap) = (6, 2, 64, 200);
    let pages = cap / ops::KV_PAGE + 1;
    let reversed: Vec<usize> = (0..pages).map(|i| pages - 1 - i).collect();
    let all: Vec<i32> = (0..cap as i32).collect();
    let base_k = rng.vec(cap * n_k * head_dim, 1.0);
    let base_v = rng.vec(cap * n_k * head_dim, 1.0);
    let cache = || {
        let mut kv = DeviceKv::with_pages(&dev, n_k, head_dim, cap, pages, &reversed).unwrap();
        let (k, v) = (dev.upload(&base_k).unwrap(), dev.upload(&base_v).unwrap());
        ops::kv_store(&dev, &mut kv, &k, &v, &dev.upload(&all).unwrap()).unwrap();
        kv
    };
    let bits = |b: &DeviceBuffer<f32>| -> Vec<u32> {
        dev.download(b)
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect()
    };
    let cases: [(bool, usize, Option<f32>, &[i32]); 5] = [
        (true, 64, None, &[37]),
        (false, 64, Some(0.125), &[0]),
        (true, 48, None, &[199, 3, 17]),
        (false, 32, None, &[16]),
        (true, 64, Some(0.3), &[5, 6, 7, 8, 9, 10, 11]),
    ];
    for (neox, n_rot, q_scale, positions) in cases {
        let rows = positions.len();
        let p = RopeParams {
            n_heads: n_q,
            head_dim,
            n_rot,
            neox,
        };
        let q = rng.vec(rows * n_q * head_dim, 1.0);
        let k = rng.vec(rows * n_k * head_dim, 1.0);
        let v = rng.vec(rows * n_k * head_dim, 1.0);
        let table = dev.upload(&rng.vec(rows * n_rot, 1.0)).unwrap();
        let dpos = dev.upload(positions).unwrap();
        let dv = dev.upload(&v).unwrap();

        let (mut fq, mut fk, mut fused) =
            (dev.upload(&q).unwrap(), dev.upload(&k).unwrap(), cache());
        ops::rope_qk_store(
            &dev, &mut fq, &mut fk, &dv, &mut fused, &table, p, &dpos, q_scale,
        )
        .unwrap();
        let (mut sq, mut sk, mut separate) =
            (dev.upload(&q).unwrap(), dev.upload(&k).unwrap(), cache());
        ops::rope_qk(&dev, &mut sq, &mut sk, &table, p, n_k, q_scale).unwrap();
        ops::kv_store(&dev, &mut separate, &sk, &dv, &dpos).unwrap();

        let what = format!("neox={neox} n_rot={n_rot} scale={q_scale:?} positions {positions:?}");
        assert_eq!(bits(&fq), bits(&sq), "queries, {what}");
        assert_eq!(bits(&fk), bits(&sk), "keys, {what}");
        assert_eq!(
            dev.download(&fused.k).unwrap(),
            dev.download(&separate.k).unwrap(),
            "key cache, {what}"
        );
        assert_eq!(
            dev.download(&fused.v).unwrap(),
            dev.download(&separate.v).unwrap(),
            "value cache, {what}"
        );
    }
    // A query scale with a partial rotation would leave elements unscaled: refused.
    let p = RopeParams {
        n_heads: n_q,
        head_dim,
        n_rot: 32,
        neox: false,
    };
    let mut kv = cache();
    let (mut q, mut k) = (
        dev.upload(&vec![0f32; n_q * head_dim]).unwrap(),
        dev.upload(&vec![0f32; n_k * head_dim]).unwrap(),
    );
    let v = dev.upload(&vec![0f32; n_k * head_dim]).unwrap();
    let table = dev.upload(&[0f32; 32]).unwrap();
    let pos = dev.upload(&[3i32]).unwrap();
    let refused = ops::rope_qk_store(
        &dev,
        &mut q,
        &mut k,
        &v,
        &mut kv,
        &table,
        p,
        &pos,
        Some(0.5),
    );
    assert!(refused.is_err());
}

/// `attention_quantized` gives bit for bit what `attention` then `quantize_acts` give (the
/// output and the Q8_0 / Q8_1 / Q8_K activations), where the decode kernels quantize inside
/// (head dimensions 64, 128 and 256, up to four rows, Q8_K blocks shared by several heads) and
/// where it falls back to a separate launch (head dimension 80, a prompt of seven rows).
#[test]
fn attention_quantized_matches_attention_then_quantize() {
    let Some((dev, mut rng)) = device() else {
        return;
    };
    let cap = 300;
    // Positions beyond ATTN_SHORT take the split kernels, the others the one-pass kernel.
    let cases: [(usize, usize, usize, DType, &[usize]); 10] = [
        (14, 2, 64, DType::Q5_0, &[9]),
        (14, 2, 64, DType::Q4_1, &[290, 3]),
        (8, 8, 128, DType::Q8_0, &[0, 1, 2, 299]),
        (8, 2, 128, DType::Q5_1, &[150]),
        (6, 2, 80, DType::Q8_0, &[20]),
        (8, 2, 128, DType::Q4K, &[31]),
        (8, 2, 128, DType::Q4K, &[290, 7]),
        (16, 2, 64, DType::Q6K, &[200, 5, 77]),
        (4, 1, 256, DType::Q5K, &[100, 280]),
        (4, 2, 64, DType::Q4_0, &[10, 11, 12, 13, 14, 15, 16]),
    ];
    for (n_heads, n_kv, hd, weight, positions) in cases {
        let k = rng.vec(cap * n_kv * hd, 1.0);
        let v = rng.vec(cap * n_kv * hd, 1.0);
        let mut kv = DeviceKv::new(&dev, n_kv, hd, cap).unwrap();
        let all: Vec<i32> = (0..cap as i32).collect();
        ops::kv_store(
            &dev,
            &mut kv,
            &dev.upload(&k).unwrap(),
            &dev.upload(&v).unwrap(),
            &dev.upload(&all).unwrap(),
        )
        .unwrap();
        let rows = positions.len();
        let q = rng.vec(rows * n_heads * hd, 3.0);
        let dq = dev.upload(&q).unwrap();
        let pos32: Vec<i32> = positions.iter().map(|&p| p as i32).collect();
        let dpos = dev.upload(&pos32).unwrap();
        let params = AttentionParams {
            n_heads,
            scale: 1.0 / (hd as f32).sqrt(),
            window: None,
            max_pos: *positions.iter().max().unwrap(),
        };
        let width = n_heads * hd;
        let mut out = poisoned(&dev, rows * width);
        let mut acts = ops::DeviceActs::new(&dev, weight, rows, width).unwrap();
        ops::attention_quantized(&dev, &mut out, &mut acts, &dq, &mut kv, &dpos, params).unwrap();
        let mut want_out = poisoned(&dev, rows * width);
        ops::attention(&dev, &mut want_out, &dq, &mut kv, &dpos, params).unwrap();
        let mut want_acts = ops::DeviceActs::new(&dev, weight, rows, width).unwrap();
        ops::quantize_acts(&dev, &mut want_acts, &want_out).unwrap();
        let what = format!("heads {n_heads}/{n_kv} hd {hd} {weight} positions {positions:?}");
        let (got, want) = (
            dev.download(&out).unwrap(),
            dev.download(&want_out).unwrap(),
        );
        let (bad, first) = attention_bit_mismatches(&got, &want);
        assert_eq!(bad, 0, "{what}: outputs differ: {first:?}");
        assert_eq!(
            acts.to_ggml_bytes(&dev).unwrap(),
            want_acts.to_ggml_bytes(&dev).unwrap(),
            "{what}: activations differ"
        );
        let inside = ops::attention_quantizes_inside(hd, rows, acts.dtype());
        eprintln!("attention_quantized {what}: bit-equal (quantized inside: {inside})");
    }
}

/// The bulk-copy F16 / BF16 kernel (Hopper) with its activation prologues: RMSNorm inside the
/// product of up to three matrices (Q, K, V with biases) and SwiGLU / GeGLU inside the down
/// projection with its residual give the bits of the separate kernels. Row lengths cover a ring
/// chunk's partial tail (2056: 4096 + 16 bytes) and Qwen2.5 7B's 3584 and 18944; on cards
/// without bulk copies (or with rows under 2048) nothing is launched and false comes back.
#[test]
fn bulk_matvec_prologues_match_separate_ops() {
    let Some((dev, mut rng)) = device() else {
        return;
    };
    let hopper = dev.info.compute_capability.0 >= 9;
    let dtable = dev.upload(&gelu_table()).unwrap();
    let bits = |b: &DeviceBuffer<f32>| -> Vec<u32> {
        dev.download(b)
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect()
    };
    for dtype in [DType::F16, DType::BF16] {
        for (cols, heights) in [
            (2056, &[300usize, 40, 41][..]),
            (3584, &[3584, 512, 512][..]),
            (18944, &[200][..]),
        ] {
            let x = activations(&mut rng, 1, cols);
            let g = rng.vec(cols, 1.0);
            let (dx, dg) = (dev.upload(&x).unwrap(), dev.upload(&g).unwrap());
            let mats: Vec<(DType, usize)> = heights.iter().map(|&rows| (dtype, rows)).collect();
            let (weights, biases) = random_matrices(&dev, &mut rng, &mats, cols);
            let run = |fused: bool| -> Option<Vec<Vec<u32>>> {
                let mut ys: Vec<DeviceBuffer<f32>> =
                    weights.iter().map(|w| poisoned(&dev, w.rows)).collect();
                let mut parts = matvec_parts(&mut ys, &weights, &biases);
                if fused {
                    let taken =
                        ops::rms_norm_matvec_float_many(&dev, &mut parts, &dx, &dg, 1e-6).unwrap();
                    assert_eq!(taken, hopper, "{dtype} {cols}: bulk kernel taken");
                    if !taken {
                        return None;
                    }
                } else {
                    let mut normed = poisoned(&dev, cols);
                    ops::rms_norm(&dev, &mut normed, &dx, &dg, 1e-6).unwrap();
                    ops::matvec_many(&dev, &mut parts, &normed, None).unwrap();
                }
                drop(parts);
                Some(ys.iter().map(&bits).collect())
            };
            if let (Some(got), Some(want)) = (run(true), run(false)) {
                assert_same_outputs(&got, &want, &format!("{dtype} norm, cols {cols}"));
            }
            // The first matrix as a down projection: [rows, cols] from gate and up of cols.
            let w = &weights[0];
            let (gate, up) = (rng.vec(cols, 4.0), rng.vec(cols, 2.0));
            let (dgate, dup) = (dev.upload(&gate).unwrap(), dev.upload(&up).unwrap());
            let residual = dev.upload(&rng.vec(w.rows, 3.0)).unwrap();
            for kind in [ops::Glu::Silu, ops::Glu::GeluTanh] {
                let mut got = poisoned(&dev, w.rows);
                let taken = ops::glu_matvec(
                    &dev,
                    &mut got,
                    w,
                    &dgate,
                    &dup,
                    kind,
                    Some(&dtable),
                    Some(&residual),
                )
                .unwrap();
                assert_eq!(taken, hopper, "{dtype} {kind:?} {cols}: bulk kernel taken");
                if !taken {
                    assert!(dev.download(&got).unwrap().iter().all(|v| v.is_nan()));
                    continue;
                }
                let mut act = poisoned(&dev, cols);
                ops::glu(&dev, kind, &mut act, &dgate, &dup, cols, Some(&dtable)).unwrap();
                let mut want = poisoned(&dev, w.rows);
                let epi = ops::Epilogue {
                    bias: None,
                    residual: Some(&residual),
                };
                ops::matvec_with(&dev, &mut want, w, &act, epi).unwrap();
                assert_eq!(bits(&got), bits(&want), "{dtype} {kind:?} cols {cols}");
            }
        }
    }
    // Rows under 2048 values: the register kernels' business.
    assert_norm_product_refused(
        &dev,
        &mut rng,
        ops::rms_norm_matvec_float_many,
        DType::F16,
        896,
    );
}

/// One decode row through `rope_store_attention` (RoPE of q and of the new key, the cache store
/// and the one-pass attention in one launch) gives the bits of `rope_qk_store` then `attention`
/// (or `attention_quantized`): the output, the quantized output, the rotated queries and keys,
/// and the caches. GQA groups of 1 and 4, partial and full rotations, a query scale, a sliding
/// window, Q8_0 and Q8_K activations, head dimensions 32 to 256; a row at or past the one-pass
/// limit is refused (false, nothing written).
#[test]
fn rope_store_attention_matches_rope_store_then_attention() {
    let Some((dev, mut rng)) = device() else {
        return;
    };
    let bits = |b: &DeviceBuffer<f32>| -> Vec<u32> {
        dev.download(b)
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect()
    };
    // (n_q, n_k, head_dim, n_rot, neox, q_scale, window, position, activations)
    type Case = (
        usize,
        usize,
        usize,
        usize,
        bool,
        Option<f32>,
        Option<usize>,
        i32,
        Option<DType>,
    );
    let cases: [Case; 6] = [
        (8, 2, 64, 64, true, None, None, 37, None),
        (
            4,
            4,
            128,
            128,
            false,
            Some(0.125),
            None,
            0,
            Some(DType::Q8_0),
        ),
        (16, 2, 64, 32, true, None, None, 150, Some(DType::Q4K)),
        (8, 2, 128, 128, true, None, Some(16), 100, None),
        (
            6,
            2,
            256,
            256,
            false,
            Some(0.0625),
            None,
            90,
            Some(DType::Q8_0),
        ),
        (8, 1, 32, 32, true, None, None, 255, None),
    ];
    for (n_q, n_k, hd, n_rot, neox, q_scale, window, position, act) in cases {
        // Head dimension 256 stages K and V in shared memory up to about 150 positions.
        let cap: usize = if hd == 256 { 128 } else { 300 };
        let pages = cap.div_ceil(ops::KV_PAGE);
        let order: Vec<usize> = (0..pages).map(|i| (i * 7) % pages).collect();
        let base_k = rng.vec(cap * n_k * hd, 1.0);
        let base_v = rng.vec(cap * n_k * hd, 1.0);
        let all: Vec<i32> = (0..cap as i32).collect();
        let cache = || {
            let mut kv = DeviceKv::with_pages(&dev, n_k, hd, cap, pages, &order).unwrap();
            let (k, v) = (dev.upload(&base_k).unwrap(), dev.upload(&base_v).unwrap());
            ops::kv_store(&dev, &mut kv, &k, &v, &dev.upload(&all).unwrap()).unwrap();
            kv
        };
        let rope = RopeParams {
            n_heads: n_q,
            head_dim: hd,
            n_rot,
            neox,
        };
        let params = AttentionParams {
            n_heads: n_q,
            scale: 1.0 / (hd as f32).sqrt(),
            window,
            max_pos: position as usize,
        };
        let q = rng.vec(n_q * hd, 1.0);
        let k = rng.vec(n_k * hd, 1.0);
        let v = rng.vec(n_k * hd, 1.0);
        let table = dev.upload(&rng.vec(n_rot, 1.0)).unwrap();
        let dpos = dev.upload(&[position]).unwrap();
        let (dk, dv) = (dev.upload(&k).unwrap(), dev.upload(&v).unwrap());
        let what = format!("{n_q}/{n_k} heads × {hd}, n_rot {n_rot}, position {position}, {act:?}");

        let (mut fq, mut fkv) = (dev.upload(&q).unwrap(), cache());
        let mut fk_rot = poisoned(&dev, n_k * hd);
        let mut fout = poisoned(&dev, n_q * hd);
        let mut facts = act.map(|a| ops::DeviceActs::new(&dev, a, 1, n_q * hd).unwrap());
        let new = ops::NewRow {
            k: &dk,
            v: &dv,
            k_rot: &mut fk_rot,
            cos_sin: &table,
            rope,
            q_scale,
        };
        let taken = ops::rope_store_attention(
            &dev,
            &mut fout,
            facts.as_mut(),
            &mut fq,
            new,
            &mut fkv,
            &dpos,
            params,
        )
        .unwrap();
        assert!(taken, "{what}: the fused launch applies");

        let (mut sq, mut sk, mut skv) = (dev.upload(&q).unwrap(), dev.upload(&k).unwrap(), cache());
        ops::rope_qk_store(
            &dev, &mut sq, &mut sk, &dv, &mut skv, &table, rope, &dpos, q_scale,
        )
        .unwrap();
        let mut sout = poisoned(&dev, n_q * hd);
        let mut sacts = act.map(|a| ops::DeviceActs::new(&dev, a, 1, n_q * hd).unwrap());
        match sacts.as_mut() {
            Some(a) => {
                ops::attention_quantized(&dev, &mut sout, a, &sq, &mut skv, &dpos, params).unwrap()
            }
            None => ops::attention(&dev, &mut sout, &sq, &mut skv, &dpos, params).unwrap(),
        }
        assert_eq!(bits(&fout), bits(&sout), "output, {what}");
        assert_eq!(bits(&fq), bits(&sq), "rotated queries, {what}");
        assert_eq!(bits(&fk_rot), bits(&sk), "rotated keys, {what}");
        assert_eq!(
            dev.download(&fkv.k).unwrap(),
            dev.download(&skv.k).unwrap(),
            "key cache, {what}"
        );
        assert_eq!(
            dev.download(&fkv.v).unwrap(),
            dev.download(&skv.v).unwrap(),
            "value cache, {what}"
        );
        if let (Some(f), Some(s)) = (facts, sacts) {
            assert_eq!(
                f.to_ggml_bytes(&dev).unwrap(),
                s.to_ggml_bytes(&dev).unwrap(),
                "activations, {what}"
            );
        }
    }
    // Past the one-pass limit: refused, nothing written.
    let (n_q, n_k, hd) = (4, 2, 64);
    let cap = ops::attention_one_pass_max() + 64;
    let mut kv = DeviceKv::new(&dev, n_k, hd, cap).unwrap();
    let position = ops::attention_one_pass_max() as i32;
    let mut q = dev.upload(&rng.vec(n_q * hd, 1.0)).unwrap();
    let (k, v) = (
        dev.upload(&rng.vec(n_k * hd, 1.0)).unwrap(),
        dev.upload(&rng.vec(n_k * hd, 1.0)).unwrap(),
    );
    let mut k_rot = poisoned(&dev, n_k * hd);
    let mut out = poisoned(&dev, n_q * hd);
    let table = dev.upload(&rng.vec(hd, 1.0)).unwrap();
    let new = ops::NewRow {
        k: &k,
        v: &v,
        k_rot: &mut k_rot,
        cos_sin: &table,
        rope: RopeParams {
            n_heads: n_q,
            head_dim: hd,
            n_rot: hd,
            neox: true,
        },
        q_scale: None,
    };
    let params = AttentionParams {
        n_heads: n_q,
        scale: 0.125,
        window: None,
        max_pos: position as usize,
    };
    let dpos = dev.upload(&[position]).unwrap();
    assert!(
        !ops::rope_store_attention(&dev, &mut out, None, &mut q, new, &mut kv, &dpos, params)
            .unwrap()
    );
    assert!(dev.download(&out).unwrap().iter().all(|v| v.is_nan()));
    assert!(dev.download(&k_rot).unwrap().iter().all(|v| v.is_nan()));
}
