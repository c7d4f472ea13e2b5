//! Sampling micro-benchmark: time per call of the GPU top-k (`sample::top_k`, both launches and
//! its scratch allocation) and of the greedy arg-max (`ops::argmax`), on decode-sized logits.
//!
//! ```text
//! cargo run --release -p synaptix-kernels-cuda --example cuda_sample_bench
//! cargo run --release -p synaptix-kernels-cuda --example cuda_sample_bench -- --n 262144 --iters 2000
//! ```
//!
//! Each figure is the average of `--iters` (1000) back-to-back calls after a warm-up, with one
//! synchronisation at the end: `gpu` by CUDA events around the loop, `host` by the host clock
//! (when it exceeds `gpu`, the calls are limited by launch overhead, which a CUDA graph hides).

use std::time::Instant;

use cudarc::driver::sys::CUevent_flags;
use synaptix_kernels_cuda::{cuda_status, ops, sample, CudaDevice, CudaStatus, Result};

/// Microseconds per call of `f` over `iters` calls: (CUDA events, host clock).
fn time(dev: &CudaDevice, iters: usize, mut f: impl FnMut() -> Result<()>) -> Result<(f64, f64)> {
    for _ in 0..20 {
        f()?;
    }
    dev.synchronize()?;
    let stream = dev.stream();
    let start = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    let t0 = Instant::now();
    for _ in 0..iters {
        f()?;
    }
    let end = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    dev.synchronize()?;
    let host = t0.elapsed().as_secs_f64() * 1e6 / iters as f64;
    let ms = start.elapsed_ms(&end)?;
    Ok((ms as f64 * 1e3 / iters as f64, host))
}

fn main() -> Result<()> {
    if let CudaStatus::Unavailable(why) = cuda_status() {
        eprintln!("no usable GPU: {why}");
        return Ok(());
    }
    let (mut n, mut iters) = (151_936usize, 1000usize);
    let argv: Vec<String> = std::env::args().skip(1).collect();
    for pair in argv.chunks(2) {
        let value = pair.get(1).map(String::as_str).unwrap_or_default();
        match pair[0].as_str() {
            "--n" => n = value.parse().expect("--n N"),
            "--iters" => iters = value.parse::<usize>().expect("--iters N").max(1),
            other => panic!("unknown argument {other} (--n N, --iters N)"),
        }
    }
    let dev = CudaDevice::new(0)?;
    println!(
        "{} ({}), n = {n} logits, {iters} calls per figure, µs per call",
        dev.info.name,
        dev.info.arch()
    );

    // Logits shaped like a language model's: mostly small, a handful of large ones.
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let logits: Vec<f32> = (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let u = (state >> 40) as f32 / (1u64 << 24) as f32;
            (u * 2.0 - 1.0) * 4.0 + if u > 0.9995 { 12.0 } else { 0.0 }
        })
        .collect();
    let x = dev.upload(&logits)?;
    let mut ids = dev.zeros::<i32>(sample::MAX_TOP_K)?;
    let mut vals = dev.zeros::<f32>(sample::MAX_TOP_K)?;
    let mut count = dev.zeros::<i32>(1)?;

    println!("{:>14} {:>8} {:>8}", "", "gpu", "host");
    for k in [1, 40, 256] {
        let (gpu, host) = time(&dev, iters, || {
            sample::top_k(&dev, &x, k, &mut ids, &mut vals, &mut count)
        })?;
        println!("{:>14} {gpu:>8.2} {host:>8.2}", format!("top_k k={k}"));
    }
    let mut best = dev.zeros::<i32>(1)?;
    let (gpu, host) = time(&dev, iters, || ops::argmax(&dev, &x, &mut best))?;
    println!("{:>14} {gpu:>8.2} {host:>8.2}", "argmax");

    // Sanity: the top-1 is the arg-max.
    sample::top_k(&dev, &x, 1, &mut ids, &mut vals, &mut count)?;
    ops::argmax(&dev, &x, &mut best)?;
    let (top1, am) = (dev.download(&ids)?[0], dev.download(&best)?[0]);
    if top1 != am {
        eprintln!("warning: top_k(1) = {top1} but argmax = {am}");
    }
    Ok(())
}
