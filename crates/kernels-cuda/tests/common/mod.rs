//! Helpers shared by the GPU test files: a seeded generator, the device (or a visible skip),
//! NaN-poisoned outputs, the CPU matmul reference and bit-exact comparison.
#![allow(dead_code)] // each test file uses a different subset

use synaptix_core::DType;
use synaptix_kernels_cuda::{cuda_status, CudaDevice, CudaStatus, DeviceBuffer};

pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    pub fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform() * scale).collect()
    }
}

pub fn device() -> Option<(CudaDevice, Rng)> {
    match cuda_status() {
        CudaStatus::Unavailable(why) => {
            eprintln!("SKIPPED: no usable GPU ({why})");
            None
        }
        CudaStatus::Available { .. } => {
            let seed = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64);
            eprintln!("seed {seed}");
            Some((CudaDevice::new(0).expect("device 0"), Rng(seed)))
        }
    }
}

pub fn nmse(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    assert!(
        got.iter().all(|v| v.is_finite()),
        "unwritten (NaN) or non-finite output"
    );
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
        .sum();
    let den: f64 = want.iter().map(|b| (*b as f64).powi(2)).sum();
    let e = num / den.max(1e-30);
    if e > 1e-6 {
        let worst: Vec<(usize, f32, f32)> = got
            .iter()
            .zip(want)
            .enumerate()
            .filter(|(_, (a, b))| (*a - *b).abs() > 1e-3 * b.abs().max(1e-3))
            .take(6)
            .map(|(i, (a, b))| (i, *a, *b))
            .collect();
        eprintln!("first mismatches (index, gpu, cpu): {worst:?}");
    }
    e
}

pub fn poisoned(dev: &CudaDevice, n: usize) -> DeviceBuffer<f32> {
    dev.upload(&vec![f32::NAN; n]).unwrap()
}

/// The CPU result (ggml's arithmetic: activations quantized, integer block sums, f32 block terms).
pub fn cpu_matmul(
    dtype: DType,
    w: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    m: usize,
) -> Vec<f32> {
    let mut y = vec![0f32; m * rows];
    let view = synaptix_kernels_cpu::WeightView {
        dtype,
        data: w,
        rows,
        cols,
    };
    synaptix_kernels_cpu::matmul(view, x, m, &mut y).unwrap();
    y
}

/// Outputs `got[i][r]` (row-major `[m, rows]`) whose bits differ from the CPU's: their count
/// and the first few, spelled out.
pub fn bit_mismatches(got: &[f32], want: &[f32], rows: usize) -> (usize, String) {
    assert_eq!(got.len(), want.len());
    let bad: Vec<usize> = (0..want.len())
        .filter(|&i| got[i].to_bits() != want[i].to_bits())
        .collect();
    let first: Vec<String> = bad
        .iter()
        .take(8)
        .map(|&i| {
            format!(
                "y[{}][{}]: gpu {:e} ({:#010x}), cpu {:e} ({:#010x})",
                i / rows,
                i % rows,
                got[i],
                got[i].to_bits(),
                want[i],
                want[i].to_bits()
            )
        })
        .collect();
    (bad.len(), first.join("\n  "))
}
