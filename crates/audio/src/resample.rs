//! Band-limited resampling with a Kaiser-windowed sinc (polyphase for rational rate ratios).

use rayon::prelude::*;

/// Zero crossings of the sinc on each side of the kernel centre.
const ZERO_CROSSINGS: usize = 32;
/// Kaiser window shape: beta 8.6 gives about 86 dB of stopband attenuation.
const KAISER_BETA: f64 = 8.6;
/// Largest polyphase table (phases x taps, f64) built; beyond it taps are computed per output.
const MAX_TABLE: usize = 1 << 20;
/// Outputs per parallel task.
const CHUNK: usize = 4096;

/// Resamples `samples` from `from_rate` to `to_rate` Hz with a band-limited interpolator.
///
/// The kernel is a sinc with its cutoff at the lower of the two Nyquist frequencies, windowed
/// by a Kaiser window (beta 8.6) spanning 32 zero crossings of that sinc on each side; each
/// of its phases is normalised to unit DC gain. Output sample `j` sits at input time
/// `j * from_rate / to_rate` (the first samples coincide); the output has
/// `ceil(len * to_rate / from_rate)` samples. Input beyond either end counts as silence.
///
/// Equal rates return a copy of the input; an empty input, or a zero rate, returns an empty
/// vector.
pub fn resample(samples: &[f32], from_rate: u32, to_rate: u32) -> Vec<f32> {
    if from_rate == to_rate {
        return samples.to_vec();
    }
    if samples.is_empty() || from_rate == 0 || to_rate == 0 {
        return Vec::new();
    }
    let g = gcd(from_rate, to_rate);
    // Output j lies at input position j * down / up.
    let up = u64::from(to_rate / g);
    let down = u64::from(from_rate / g);
    let n_out = (samples.len() as u128 * up as u128).div_ceil(down as u128);
    let Ok(n_out) = usize::try_from(n_out) else {
        return Vec::new();
    };

    // Cutoff as a fraction of the input Nyquist frequency.
    let fc = if up < down {
        up as f64 / down as f64
    } else {
        1.0
    };
    let kernel = Kernel::new(fc);
    // Taps k in (1 - reach)..=reach around floor(position): all |x| < half_width.
    let n_taps = 2 * kernel.reach;
    let table = (up as usize)
        .checked_mul(n_taps)
        .filter(|&size| size <= MAX_TABLE)
        .map(|_| {
            let mut t = vec![0f64; up as usize * n_taps];
            for (r, taps) in t.chunks_mut(n_taps).enumerate() {
                kernel.fill(r as f64 / up as f64, taps);
            }
            t
        });

    let mut out = vec![0f32; n_out];
    out.par_chunks_mut(CHUNK)
        .enumerate()
        .for_each(|(chunk, out)| {
            let j0 = (chunk * CHUNK) as u128;
            let start = j0 * down as u128;
            // The position of output j: base + r / up.
            let mut base = (start / up as u128) as u64;
            let mut r = (start % up as u128) as u64;
            let step_base = down / up;
            let step_r = down % up;
            let mut own_taps = vec![0f64; if table.is_some() { 0 } else { n_taps }];
            for y in out.iter_mut() {
                let taps: &[f64] = match &table {
                    Some(t) => &t[r as usize * n_taps..(r as usize + 1) * n_taps],
                    None => {
                        kernel.fill(r as f64 / up as f64, &mut own_taps);
                        &own_taps
                    }
                };
                *y = dot(samples, base as i64 + 1 - kernel.reach as i64, taps) as f32;
                base += step_base;
                r += step_r;
                if r >= up {
                    r -= up;
                    base += 1;
                }
            }
        });
    out
}

/// `sum_k taps[k] * samples[first + k]`, samples outside the slice counting as zero.
fn dot(samples: &[f32], first: i64, taps: &[f64]) -> f64 {
    let n = samples.len() as i64;
    let lo = first.max(0);
    let hi = (first + taps.len() as i64).min(n);
    if lo >= hi {
        return 0.0;
    }
    let x = &samples[lo as usize..hi as usize];
    let t = &taps[(lo - first) as usize..(hi - first) as usize];
    let mut acc = [0f64; 4];
    let mut xc = x.chunks_exact(4);
    let mut tc = t.chunks_exact(4);
    for (xs, ts) in (&mut xc).zip(&mut tc) {
        for i in 0..4 {
            acc[i] += f64::from(xs[i]) * ts[i];
        }
    }
    let mut sum = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    for (&xv, &tv) in xc.remainder().iter().zip(tc.remainder()) {
        sum += f64::from(xv) * tv;
    }
    sum
}

/// The windowed-sinc kernel `h(x) = fc * sinc(fc * x) * kaiser(x / half_width)`, x in input
/// samples.
struct Kernel {
    fc: f64,
    half_width: f64,
    reach: usize,
    inv_i0_beta: f64,
}

impl Kernel {
    fn new(fc: f64) -> Kernel {
        let half_width = ZERO_CROSSINGS as f64 / fc;
        Kernel {
            fc,
            half_width,
            reach: half_width.ceil() as usize,
            inv_i0_beta: 1.0 / bessel_i0(KAISER_BETA),
        }
    }

    /// Taps for an output at fractional position `frac` in [0, 1) past input sample `base`:
    /// `taps[i]` weighs input `base + 1 - reach + i`. Normalised to sum to 1.
    fn fill(&self, frac: f64, taps: &mut [f64]) {
        let mut sum = 0.0;
        for (i, tap) in taps.iter_mut().enumerate() {
            let x = (i as f64 + 1.0 - self.reach as f64) - frac;
            let t = x / self.half_width;
            *tap = if t.abs() >= 1.0 {
                0.0
            } else {
                let arg = std::f64::consts::PI * self.fc * x;
                let sinc = if arg == 0.0 { 1.0 } else { arg.sin() / arg };
                let window = bessel_i0(KAISER_BETA * (1.0 - t * t).sqrt()) * self.inv_i0_beta;
                self.fc * sinc * window
            };
            sum += *tap;
        }
        if sum != 0.0 {
            let inv = 1.0 / sum;
            taps.iter_mut().for_each(|t| *t *= inv);
        }
    }
}

/// Modified Bessel function of the first kind, order 0 (power series; converges fast for the
/// arguments a Kaiser window needs).
fn bessel_i0(x: f64) -> f64 {
    let q = x * x / 4.0;
    let mut term = 1.0;
    let mut sum = 1.0;
    let mut k = 1.0;
    while term > sum * 1e-17 {
        term *= q / (k * k);
        sum += term;
        k += 1.0;
    }
    sum
}

fn gcd(mut a: u32, mut b: u32) -> u32 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bessel_i0_known_values() {
        // I0(0) = 1, I0(1) = 1.2660658777520082, I0(8.6) = 800.2484...
        assert_eq!(bessel_i0(0.0), 1.0);
        assert!((bessel_i0(1.0) - 1.266_065_877_752_008_2).abs() < 1e-15);
        assert!((bessel_i0(5.0) - 27.239_871_823_604_45).abs() < 1e-12);
    }

    #[test]
    fn output_length_and_dc() {
        let x = vec![0.25f32; 44_100];
        let y = resample(&x, 44_100, 16_000);
        assert_eq!(y.len(), 16_000);
        // Unit DC gain for every phase, away from the edges.
        for &v in &y[100..15_900] {
            assert!((v - 0.25).abs() < 1e-6, "{v}");
        }
        let up = resample(&x[..100], 8_000, 16_000);
        assert_eq!(up.len(), 200);
        // A prime-ish pair whose phase table would be too large: taps computed per output.
        let odd = resample(&x[..2000], 44_100, 16_001);
        assert_eq!(odd.len(), (2000u64 * 16_001).div_ceil(44_100) as usize);
        for &v in &odd[200..odd.len() - 200] {
            assert!((v - 0.25).abs() < 1e-6, "{v}");
        }
    }
}
