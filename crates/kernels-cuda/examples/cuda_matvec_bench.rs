//! Matvec micro-benchmark: weight bytes streamed per second by the GPU matvec kernels, per
//! weight format, for decode-sized products (one activation row by default).
//!
//! ```text
//! cargo run --release -p synaptix-kernels-cuda --example cuda_matvec_bench
//! cargo run --release -p synaptix-kernels-cuda --example cuda_matvec_bench -- --formats q4_0,q8_0 --iters 500 --m 1 --shapes 4096x4096
//! ```
//!
//! Shapes (out × in): the Qwen2.5 0.5B projections 4864×896 (gate/up), 896×4864 (down) and
//! 151936×896 (output), 4096×4096, and the Qwen2.5 7B MLP 18944×3584 and 3584×18944. K-quants need rows of whole 256-element blocks, so
//! they skip the 896-column shapes.
//!
//! Columns (times per call, averaged over `--iters` calls after a warm-up, taken with CUDA
//! events around the whole loop; GB/s = weight bytes / time):
//! - `kernel`: `matvec_quantized` alone (activations quantized beforehand), cycling through
//!   copies of the matrix totalling ≥ 256 MiB, so the weights come from DRAM and not from the
//!   50 MB L2: the number to compare with the H200's ~4300 GB/s copy bandwidth.
//! - `hot`: the same with one copy (served from L2 when the matrix fits there).
//! - `matvec`: `ops::matvec` as the model calls it: scratch allocation, activation quantization
//!   and the kernel (cold copies).
//! - `dequant`: the first kernels (dequantized weights × f32 activations), cold copies.
//!
//! The host clock over the same loop is printed too (`host µs`, for `matvec`): when it exceeds
//! the event time, the calls are limited by launch overhead rather than by the GPU.

use std::time::Instant;

use cudarc::driver::sys::CUevent_flags;
use synaptix_core::DType;
use synaptix_kernels_cuda::ops::{self, DeviceActs, DeviceMatrix};
use synaptix_kernels_cuda::{cuda_status, CudaDevice, CudaStatus, DeviceBuffer, Result};

const SHAPES: [(usize, usize); 6] = [
    (4864, 896),
    (896, 4864),
    (151_936, 896),
    (4096, 4096),
    (18944, 3584),
    (3584, 18944),
];

const FORMATS: [DType; 13] = [
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
];

/// Weight bytes the cold measurements cycle through (well beyond the L2).
const COLD_BYTES: usize = 256 << 20;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

/// Random weights with valid, modest scales (random bytes elsewhere).
fn weights(rng: &mut Rng, dtype: DType, rows: usize, cols: usize) -> Vec<u8> {
    let n = rows * cols;
    let bytes = n / dtype.block_len() * dtype.block_bytes();
    let mut out = vec![0u8; bytes];
    match dtype {
        DType::F32 => {
            for c in out.chunks_exact_mut(4) {
                c.copy_from_slice(&(rng.uniform() * 0.5).to_le_bytes());
            }
            return out;
        }
        DType::F16 | DType::BF16 => {
            for c in out.chunks_exact_mut(8) {
                let r = rng.next();
                let mut v = [0u16; 4];
                for (i, h) in v.iter_mut().enumerate() {
                    let x = ((r >> (16 * i)) & 0xffff) as f32 / 65536.0 - 0.5;
                    *h = if dtype == DType::F16 {
                        half::f16::from_f32(x).to_bits()
                    } else {
                        half::bf16::from_f32(x).to_bits()
                    };
                }
                for (i, h) in v.iter().enumerate() {
                    c[2 * i..2 * i + 2].copy_from_slice(&h.to_le_bytes());
                }
            }
            return out;
        }
        _ => {}
    }
    for c in out.chunks_mut(8) {
        let r = rng.next().to_le_bytes();
        c.copy_from_slice(&r[..c.len()]);
    }
    let d = half::f16::from_f32(0.01).to_le_bytes();
    let fields: &[usize] = match dtype {
        DType::Q4_0 | DType::Q5_0 | DType::Q8_0 => &[0],
        DType::Q4_1 | DType::Q5_1 | DType::Q4K | DType::Q5K => &[0, 2],
        DType::Q2K => &[80, 82],
        DType::Q3K => &[108],
        DType::Q6K => &[208],
        _ => &[],
    };
    for b in out.chunks_exact_mut(dtype.block_bytes()) {
        for &at in fields {
            b[at..at + 2].copy_from_slice(&d);
        }
    }
    out
}

/// Microseconds per call of `f` over `iters` calls (after a warm-up), by CUDA events; and by
/// the host clock.
fn time(
    dev: &CudaDevice,
    iters: usize,
    mut f: impl FnMut(usize) -> Result<()>,
) -> Result<(f64, f64)> {
    for i in 0..10 {
        f(i)?;
    }
    dev.synchronize()?;
    let stream = dev.stream();
    let start = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    let t0 = Instant::now();
    for i in 0..iters {
        f(i)?;
    }
    let end = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    dev.synchronize()?;
    let host = t0.elapsed().as_secs_f64() * 1e6 / iters as f64;
    let ms = start.elapsed_ms(&end)?;
    Ok((ms as f64 * 1e3 / iters as f64, host))
}

struct Args {
    iters: usize,
    m: usize,
    formats: Vec<DType>,
    shapes: Vec<(usize, usize)>,
}

fn args() -> Args {
    let mut a = Args {
        iters: 200,
        m: 1,
        formats: FORMATS.to_vec(),
        shapes: SHAPES.to_vec(),
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let value = argv.get(i + 1).cloned().unwrap_or_default();
        match argv[i].as_str() {
            "--iters" => a.iters = value.parse::<usize>().expect("--iters N").max(1),
            "--m" => a.m = value.parse::<usize>().expect("--m N").max(1),
            "--formats" => {
                a.formats = value
                    .split(',')
                    .map(|s| {
                        *FORMATS
                            .iter()
                            .find(|d| ops::format_suffix(**d) == Some(s.trim()))
                            .unwrap_or_else(|| panic!("unknown format {s}"))
                    })
                    .collect()
            }
            "--shapes" => {
                a.shapes = value
                    .split(',')
                    .map(|s| {
                        let (r, c) = s.trim().split_once('x').expect("--shapes ROWSxCOLS,...");
                        (
                            r.parse().expect("--shapes ROWSxCOLS"),
                            c.parse().expect("--shapes ROWSxCOLS"),
                        )
                    })
                    .collect()
            }
            other => panic!(
                "unknown argument {other} (--iters N, --m N, --formats q4_0,q8_0, --shapes 4096x4096)"
            ),
        }
        i += 2;
    }
    a
}

fn main() -> Result<()> {
    if let CudaStatus::Unavailable(why) = cuda_status() {
        eprintln!("no usable GPU: {why}");
        return Ok(());
    }
    let a = args();
    let dev = CudaDevice::new(0)?;
    println!(
        "{} ({}), m = {} activation row(s), {} calls per measurement",
        dev.info.name,
        dev.info.arch(),
        a.m,
        a.iters
    );
    println!("times in µs per call, GB/s = weight bytes / time (H200 copy bandwidth ≈ 4300 GB/s)");
    println!(
        "{:>13} {:>5} {:>8} | {:>8} {:>6} | {:>8} {:>6} | {:>8} {:>6} {:>8} | {:>8} {:>6}",
        "shape",
        "fmt",
        "MB",
        "kernel",
        "GB/s",
        "hot",
        "GB/s",
        "matvec",
        "GB/s",
        "host",
        "dequant",
        "GB/s"
    );
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for &(rows, cols) in &a.shapes {
        for &dtype in &a.formats {
            if !cols.is_multiple_of(dtype.block_len()) {
                continue;
            }
            let bytes = weights(&mut rng, dtype, rows, cols);
            let mb = bytes.len() as f64 / 1e6;
            let copies = COLD_BYTES.div_ceil(bytes.len()).clamp(1, 512);
            let mats: Vec<DeviceMatrix> = (0..copies)
                .map(|_| DeviceMatrix::upload(&dev, dtype, rows, cols, &bytes))
                .collect::<Result<_>>()?;
            drop(bytes);
            let x: Vec<f32> = (0..a.m * cols).map(|_| rng.uniform()).collect();
            let dx: DeviceBuffer<f32> = dev.upload(&x)?;
            let mut y: DeviceBuffer<f32> = dev.zeros(a.m * rows)?;
            let gbs = |us: f64| mb * 1e6 / (us * 1e3);

            let acts = match ops::activation_format(dtype) {
                Some(_) => {
                    let mut acts = DeviceActs::new(&dev, dtype, a.m, cols)?;
                    ops::quantize_acts(&dev, &mut acts, &dx)?;
                    Some(acts)
                }
                None => None,
            };
            let kernel = |y: &mut DeviceBuffer<f32>, w: &DeviceMatrix| match &acts {
                Some(acts) => ops::matvec_quantized(&dev, y, w, acts),
                None => ops::matvec(&dev, y, w, &dx),
            };
            let (cold, _) = time(&dev, a.iters, |i| kernel(&mut y, &mats[i % copies]))?;
            let (hot, _) = time(&dev, a.iters, |_| kernel(&mut y, &mats[0]))?;
            let (full, host) = time(&dev, a.iters, |i| {
                ops::matvec(&dev, &mut y, &mats[i % copies], &dx)
            })?;
            let (old, _) = time(&dev, a.iters, |i| {
                ops::matvec_dequant(&dev, &mut y, &mats[i % copies], &dx)
            })?;
            println!(
                "{:>13} {:>5} {:>8.2} | {:>8.2} {:>6.0} | {:>8.2} {:>6.0} | {:>8.2} {:>6.0} {:>8.2} | {:>8.2} {:>6.0}",
                format!("{rows}x{cols}"),
                ops::format_suffix(dtype).unwrap_or("?"),
                mb,
                cold,
                gbs(cold),
                hot,
                gbs(hot),
                full,
                gbs(full),
                host,
                old,
                gbs(old)
            );
        }
    }

    // Activation quantization alone (part of `matvec` above).
    println!("\nactivation quantization, µs per call (m = {}):", a.m);
    for cols in [896, 4096, 4864] {
        let x: Vec<f32> = (0..a.m * cols).map(|_| rng.uniform()).collect();
        let dx = dev.upload(&x)?;
        for weight in [DType::Q8_0, DType::Q4_1, DType::Q4K] {
            if !cols.is_multiple_of(256) && weight == DType::Q4K {
                continue;
            }
            let mut acts = DeviceActs::new(&dev, weight, a.m, cols)?;
            let (us, host) = time(&dev, a.iters, |_| ops::quantize_acts(&dev, &mut acts, &dx))?;
            println!(
                "  {:>5} x {cols:>5}: {us:>6.2} (host {host:.2})",
                format!("{}", acts.dtype())
            );
        }
    }
    Ok(())
}
