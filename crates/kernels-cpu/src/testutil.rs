//! Deterministic random data for unit tests.

/// Every weight type with a dot-product kernel: the SIMD paths are checked against scalar for each.
pub(crate) const DOT_TYPES: [DType; 26] = [
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
    DType::MXFP8,
    DType::NVFP4,
    DType::SQ1,
    DType::SQ2,
    DType::SQ3,
    DType::SQ4,
    DType::SQ5,
    DType::SQ6,
    DType::SQ7,
    DType::SQ8,
    DType::SYMB4,
    DType::IQ4NL,
    DType::IQ4XS,
];

/// SplitMix64.
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x1234_5678)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub(crate) fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Approximately normal (sum of uniforms), scaled.
    pub(crate) fn normal(&mut self, scale: f32) -> f32 {
        let s: f32 = (0..4).map(|_| self.uniform()).sum();
        (s - 2.0) * 1.7 * scale
    }

    pub(crate) fn normal_vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.normal(scale)).collect()
    }

    pub(crate) fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

use synaptix_core::DType;

/// Byte offsets of the half-precision scale fields in a block of `dtype`.
pub(crate) fn scale_offsets(dtype: DType) -> &'static [usize] {
    match dtype {
        DType::Q4_0 | DType::Q5_0 | DType::Q8_0 | DType::IQ4NL | DType::IQ4XS => &[0],
        DType::Q4_1 | DType::Q5_1 | DType::Q4K | DType::Q5K => &[0, 2],
        d if d.sq_bits().is_some() => &[0, 2],
        DType::Q2K => &[80, 82],
        DType::Q3K => &[108],
        DType::Q6K => &[208],
        _ => &[],
    }
}

/// `rows` random rows of `k` elements of `dtype`: random quant bytes with modest random half
/// scales, or normal values for float types.
pub(crate) fn random_weights(rng: &mut Rng, dtype: DType, rows: usize, k: usize) -> Vec<u8> {
    let n = rows * k;
    match dtype {
        DType::F32 => rng
            .normal_vec(n, 1.0)
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect(),
        DType::F16 => (0..n)
            .flat_map(|_| half::f16::from_f32(rng.normal(1.0)).to_le_bytes())
            .collect(),
        DType::BF16 => (0..n)
            .flat_map(|_| half::bf16::from_f32(rng.normal(1.0)).to_le_bytes())
            .collect(),
        DType::NVFP4 => {
            // Tensor scale 2^-7, micro-block scales any finite E4M3 byte, any codes.
            let mut out = rng.bytes(n / 64 * 40);
            for blk in out.chunks_exact_mut(40) {
                blk[..4].copy_from_slice(&(1.0f32 / 128.0).to_le_bytes());
                for b in &mut blk[4..8] {
                    if *b & 0x7f == 0x7f {
                        *b ^= 1;
                    }
                }
            }
            out
        }
        DType::SYMB4 => {
            // Scales of about 2^-12 .. 2^-2 (either sign never occurs: absmax / 7), any codes.
            let mut out = rng.bytes(n / 128 * 68);
            for blk in out.chunks_exact_mut(68) {
                let scale = 2f32.powf(-10.0 * rng.uniform() - 2.0);
                blk[..4].copy_from_slice(&scale.to_le_bytes());
            }
            out
        }
        DType::MXFP8 => {
            // Scales of 2^-17 .. 2^2; elements any finite E4M3 byte (the NaN bytes moved off).
            let mut out = rng.bytes(n / 32 * 33);
            for blk in out.chunks_exact_mut(33) {
                blk[0] = 110 + (blk[0] % 20);
                for b in &mut blk[1..] {
                    if *b & 0x7f == 0x7f {
                        *b ^= 1;
                    }
                }
            }
            out
        }
        _ => {
            let bb = dtype.block_bytes();
            let mut out = rng.bytes(n / dtype.block_len() * bb);
            for blk in out.chunks_exact_mut(bb) {
                for &off in scale_offsets(dtype) {
                    let mag = 2f32.powf(-10.0 * rng.uniform() - 2.0);
                    let v = if rng.uniform() < 0.5 { -mag } else { mag };
                    blk[off..off + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
                }
            }
            out
        }
    }
}
