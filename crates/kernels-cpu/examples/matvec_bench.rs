//! Matvec / small-matmul throughput of the quantized kernels (not a test).
//!
//! ```text
//! cargo run --release -p synaptix-kernels-cpu --example matvec_bench [-- N K [TYPES...]]
//! SYNAPTIX_CPU_KERNELS=avx2 cargo run ...   # cap the kernel path (scalar | avx2 | avx512 | neon)
//! ```
//! Reports GB/s of weight bytes streamed for m = 1 (decode) with 1 and 2 rayon threads, and
//! for m = 8 (prefill) with 2 threads, each the best of five timing windows. Weights are random
//! blocks with modest half scales.

use std::time::{Duration, Instant};

use synaptix_core::DType;
use synaptix_kernels_cpu::{cpu_features, kernel_path, matmul, quantize_acts, WeightView};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    }
}

fn weights(rng: &mut Rng, dtype: DType, n: usize, k: usize) -> Vec<u8> {
    let count = n * k;
    match dtype {
        DType::F32 => (0..count).flat_map(|_| rng.f32().to_le_bytes()).collect(),
        DType::F16 => (0..count)
            .flat_map(|_| half::f16::from_f32(rng.f32()).to_le_bytes())
            .collect(),
        DType::BF16 => (0..count)
            .flat_map(|_| half::bf16::from_f32(rng.f32()).to_le_bytes())
            .collect(),
        _ => {
            let bb = dtype.block_bytes();
            let mut out: Vec<u8> = (0..count / dtype.block_len() * bb)
                .map(|_| rng.next() as u8)
                .collect();
            let offs: &[usize] = match dtype {
                DType::Q4_1 | DType::Q5_1 | DType::Q4K | DType::Q5K => &[0, 2],
                DType::Q2K => &[80, 82],
                DType::Q3K => &[108],
                DType::Q6K => &[208],
                _ => &[0],
            };
            let scale = half::f16::from_f32(0.01).to_le_bytes();
            for blk in out.chunks_exact_mut(bb) {
                for &o in offs {
                    blk[o..o + 2].copy_from_slice(&scale);
                }
            }
            out
        }
    }
}

/// Seconds per call: the best of several windows of repeated calls (each at least `min` / 5 of
/// wall time), which filters out interference from other processes on a shared machine.
fn time(min: Duration, mut f: impl FnMut()) -> f64 {
    f();
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let start = Instant::now();
        let mut iters = 0u32;
        while start.elapsed() < min / 5 {
            f();
            iters += 1;
        }
        best = best.min(start.elapsed().as_secs_f64() / iters as f64);
    }
    best
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n: usize = args.first().and_then(|s| s.parse().ok()).unwrap_or(4096);
    let k: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(4096);
    let types: Vec<DType> = if args.len() > 2 {
        args[2..]
            .iter()
            .filter_map(|s| DType::from_name(s))
            .collect()
    } else {
        vec![
            DType::Q4K,
            DType::Q8_0,
            DType::Q5_0,
            DType::Q6K,
            DType::F16,
            DType::F32,
        ]
    };
    println!(
        "kernel path: {}   features: {:?}",
        kernel_path(),
        cpu_features()
    );
    println!("matrix {n}x{k}; GB/s of weight bytes (m=8: effective, weights read once per call)");
    println!(
        "{:<6} {:>9} {:>12} {:>12} {:>12}",
        "type", "MiB", "m=1 1thr", "m=1 2thr", "m=8 2thr"
    );
    let mut rng = Rng(42);
    let pool = |t| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(t)
            .build()
            .expect("pool")
    };
    let (p1, p2) = (pool(1), pool(2));
    for dtype in types {
        if !k.is_multiple_of(dtype.block_len()) {
            println!(
                "{:<6} skipped: {k} is not a multiple of {}",
                dtype.name(),
                dtype.block_len()
            );
            continue;
        }
        let w = weights(&mut rng, dtype, n, k);
        let view = WeightView {
            dtype,
            data: &w,
            rows: n,
            cols: k,
        };
        let x: Vec<f32> = (0..8 * k).map(|_| rng.f32()).collect();
        let mut y = vec![0f32; 8 * n];
        let min = Duration::from_millis(700);
        let mut run = |pool: &rayon::ThreadPool, m: usize| {
            let secs = pool.install(|| {
                time(min, || {
                    matmul(view, &x[..m * k], m, &mut y[..m * n]).expect("matmul");
                })
            });
            w.len() as f64 / secs / 1e9
        };
        let (a, b, c) = (run(&p1, 1), run(&p2, 1), run(&p2, 8));
        let mib = w.len() as f64 / (1 << 20) as f64;
        println!(
            "{:<6} {mib:>9.1} {a:>12.2} {b:>12.2} {c:>12.2}",
            dtype.name()
        );
    }
    let x: Vec<f32> = (0..k).map(|_| rng.f32()).collect();
    for dtype in [DType::Q8_0, DType::Q4K, DType::F16] {
        if !k.is_multiple_of(dtype.block_len()) {
            continue;
        }
        let secs = time(Duration::from_millis(300), || {
            std::hint::black_box(quantize_acts(dtype, &x).expect("quantize"));
        });
        println!("quantize_acts for {dtype} (k={k}): {:.2} us", secs * 1e6);
    }
}
