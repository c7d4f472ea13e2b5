//! Prefill GEMM micro-benchmark: the tensor-core GEMM (`gemm::gemm_quantized` / `gemm_float`)
//! against `ops::matvec` (passes of 8 activation rows on the CUDA cores) for m activation rows
//! (512 by default), in TFLOPS (2·m·rows·cols / time).
//!
//! ```text
//! cargo run --release -p synaptix-kernels-cuda --example cuda_gemm_bench
//! cargo run --release -p synaptix-kernels-cuda --example cuda_gemm_bench -- --m 2048 --iters 50 --formats q4_0
//! ```
//!
//! Shapes (out × in): Qwen2.5 0.5B's 896×896 (attention), 4864×896 (gate/up), 896×4864 (down),
//! and Qwen2.5 7B's 3584×3584 (attention output), 4608×3584 (Q, K and V together),
//! 18944×3584 (gate/up) and 3584×18944 (down). On Hopper a line per F16 / BF16 shape gives
//! each wgmma tile's time.
//!
//! Columns (µs per call, averaged over `--iters` calls after a warm-up, by CUDA events around
//! the loop; the weights stay in one copy, the GEMM being compute-bound):
//! - `gemm`: the GEMM alone, automatic tile (quantized formats: activations quantized
//!   beforehand); `large` / `small`: the same with the tile forced;
//! - `gemm+q`: quantization of the activations and the GEMM (float formats: rounding x to the
//!   weight type is part of `gemm` already);
//! - `matvec`: `ops::matvec` (quantization included).
//!
//! K-quant formats (q2_k .. q6_k) run `gemm_k::gemm_k_quantized` (one tile: the three GEMM
//! columns are the same kernel). `ops::matvec` dispatches them to that GEMM too, unless
//! `SYNAPTIX_NO_GEMM=1` is set, which makes the `matvec` column the matvec kernel again (the
//! GEMM columns call the GEMMs directly):
//!
//! ```text
//! SYNAPTIX_NO_GEMM=1 cargo run --release -p synaptix-kernels-cuda --example cuda_gemm_bench -- --formats q4_k,q6_k
//! ```

use cudarc::driver::sys::CUevent_flags;
use synaptix_core::DType;
use synaptix_kernels_cuda::gemm::{self, GemmTile, WgTile};
use synaptix_kernels_cuda::gemm_k;
use synaptix_kernels_cuda::ops::{self, DeviceActs, DeviceMatrix};
use synaptix_kernels_cuda::{cuda_status, CudaDevice, CudaStatus, DeviceBuffer, Result};

const SHAPES: [(usize, usize); 7] = [
    (896, 896),
    (4864, 896),
    (896, 4864),
    (3584, 3584),
    (4608, 3584),
    (18944, 3584),
    (3584, 18944),
];

const FORMATS: [DType; 12] = [
    DType::F16,
    DType::BF16,
    DType::Q8_0,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q2K,
    DType::Q3K,
    DType::Q4K,
    DType::Q5K,
    DType::Q6K,
];

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
    let mut out = vec![0u8; n / dtype.block_len() * dtype.block_bytes()];
    if matches!(dtype, DType::F16 | DType::BF16) {
        for c in out.chunks_exact_mut(2) {
            let x = rng.uniform() * 0.5;
            let h = if dtype == DType::F16 {
                half::f16::from_f32(x).to_bits()
            } else {
                half::bf16::from_f32(x).to_bits()
            };
            c.copy_from_slice(&h.to_le_bytes());
        }
        return out;
    }
    for c in out.chunks_mut(8) {
        let r = rng.next().to_le_bytes();
        c.copy_from_slice(&r[..c.len()]);
    }
    let d = half::f16::from_f32(0.01).to_le_bytes();
    let fields: &[usize] = match dtype {
        DType::Q4_1 | DType::Q5_1 | DType::Q4K | DType::Q5K => &[0, 2],
        DType::Q2K => &[80, 82],
        DType::Q3K => &[108],
        DType::Q6K => &[208],
        _ => &[0],
    };
    for b in out.chunks_exact_mut(dtype.block_bytes()) {
        for &at in fields {
            b[at..at + 2].copy_from_slice(&d);
        }
    }
    out
}

/// Microseconds per call of `f` over `iters` calls (after a warm-up), by CUDA events.
fn time(dev: &CudaDevice, iters: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    for _ in 0..3 {
        f()?;
    }
    dev.synchronize()?;
    let stream = dev.stream();
    let start = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    for _ in 0..iters {
        f()?;
    }
    let end = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    dev.synchronize()?;
    Ok(start.elapsed_ms(&end)? as f64 * 1e3 / iters as f64)
}

struct Args {
    iters: usize,
    m: usize,
    formats: Vec<DType>,
}

fn args() -> Args {
    let mut a = Args {
        iters: 20,
        m: 512,
        formats: vec![DType::F16, DType::Q8_0, DType::Q4_0],
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
            other => panic!(
                "unknown argument {other} (--iters N, --m N, --formats f16,q8_0,q4_0,q4_k,q6_k)"
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
        "{} ({}), m = {} activation rows, {} calls per measurement",
        dev.info.name,
        dev.info.arch(),
        a.m,
        a.iters
    );
    println!("µs per call and TFLOPS (2·m·rows·cols / time)");
    println!(
        "{:>12} {:>5} | {:>9} {:>6} | {:>9} {:>6} | {:>9} {:>6} | {:>9} {:>6} | {:>10} {:>6} | {:>7}",
        "shape",
        "fmt",
        "gemm",
        "TF",
        "large",
        "TF",
        "small",
        "TF",
        "gemm+q",
        "TF",
        "matvec",
        "TF",
        "speedup"
    );
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for (rows, cols) in SHAPES {
        let x: Vec<f32> = (0..a.m * cols).map(|_| rng.uniform()).collect();
        let dx: DeviceBuffer<f32> = dev.upload(&x)?;
        let mut y: DeviceBuffer<f32> = dev.zeros(a.m * rows)?;
        let flops = 2.0 * a.m as f64 * rows as f64 * cols as f64;
        let tf = |us: f64| flops / (us * 1e-6) / 1e12;
        for &dtype in &a.formats {
            let k_quant = gemm_k::gemm_k_supported(dtype, a.m, cols);
            if !gemm::gemm_supported(dtype, a.m, cols) && !k_quant {
                println!(
                    "{:>12} {:>5} | not supported by the GEMM",
                    format!("{rows}x{cols}"),
                    ops::format_suffix(dtype).unwrap_or("?")
                );
                continue;
            }
            let w = DeviceMatrix::upload(
                &dev,
                dtype,
                rows,
                cols,
                &weights(&mut rng, dtype, rows, cols),
            )?;
            let quantized = ops::activation_format(dtype).is_some();
            let mut acts = if quantized {
                let mut acts = DeviceActs::new(&dev, dtype, a.m, cols)?;
                ops::quantize_acts(&dev, &mut acts, &dx)?;
                Some(acts)
            } else {
                None
            };
            let run = |y: &mut DeviceBuffer<f32>, tile: GemmTile| match &acts {
                Some(acts) if k_quant => gemm_k::gemm_k_quantized(&dev, y, &w, acts),
                Some(acts) => gemm::gemm_quantized_with(&dev, y, &w, acts, tile),
                None => gemm::gemm_float_with(&dev, y, &w, &dx, tile),
            };
            let auto = time(&dev, a.iters, || run(&mut y, GemmTile::Auto))?;
            let large = time(&dev, a.iters, || run(&mut y, GemmTile::Large))?;
            let small = time(&dev, a.iters, || run(&mut y, GemmTile::Small))?;
            // Hopper: the float GEMM's wgmma kernels, tile by tile (`gemm` is the automatic
            // choice among them; `large` / `small` are the mma.sync kernels).
            let mut wg_line = None;
            if acts.is_none() && gemm::wgmma_available(&dev) {
                let mut line = String::from("             wgmma |");
                for t in WgTile::ALL {
                    let us = time(&dev, a.iters, || run(&mut y, GemmTile::Wgmma(t)))?;
                    line.push_str(&format!(" {t:?} {us:.1} µs {:.1} TF |", tf(us)));
                }
                wg_line = Some(line);
            }
            let with_q = match acts.as_mut() {
                Some(acts) => time(&dev, a.iters, || {
                    ops::quantize_acts(&dev, acts, &dx)?;
                    if k_quant {
                        gemm_k::gemm_k_quantized(&dev, &mut y, &w, acts)
                    } else {
                        gemm::gemm_quantized(&dev, &mut y, &w, acts)
                    }
                })?,
                None => auto,
            };
            let mv = time(&dev, a.iters, || ops::matvec(&dev, &mut y, &w, &dx))?;
            println!(
                "{:>12} {:>5} | {:>9.1} {:>6.1} | {:>9.1} {:>6.1} | {:>9.1} {:>6.1} | {:>9.1} {:>6.1} | {:>10.1} {:>6.1} | {:>6.1}x",
                format!("{rows}x{cols}"),
                ops::format_suffix(dtype).unwrap_or("?"),
                auto,
                tf(auto),
                large,
                tf(large),
                small,
                tf(small),
                with_q,
                tf(with_q),
                mv,
                tf(mv),
                mv / with_q
            );
            if let Some(line) = &wg_line {
                println!("{line}");
            }
        }
    }
    Ok(())
}
