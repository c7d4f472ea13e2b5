//! Whisper's log-mel spectrogram, as faster-whisper 1.2.1's `FeatureExtractor.__call__`
//! computes it with numpy (OpenAI Whisper's `log_mel_spectrogram` does the same in torch,
//! without the 160 trailing zeros).
//!
//! Steps and precisions follow numpy: the waveform (f32) gets 160 zeros appended, is
//! reflection-padded by 200 samples each side, cut into 400-sample frames every 160 samples,
//! multiplied by a periodic Hann window (f32 product), transformed, and the last frame is
//! dropped. The FFT runs in f64 (numpy's runs in f32; the difference is far below the
//! tolerance of the goldens); the power `|X|^2` is taken from the spectrum rounded to f32 as
//! numpy's `abs(complex64) ** 2`. Then a Slaney mel filter bank (built in f64, stored f32),
//! `log10(max(mel, 1e-10))`, a floor 8 below the global maximum and `(x + 4) / 4`, in f32.

use std::sync::Arc;

use rayon::prelude::*;
use rustfft::num_complex::Complex;
use rustfft::{Fft, FftPlanner};

use crate::{AudioError, WHISPER_SAMPLE_RATE};

/// FFT size (samples per frame): 25 ms at 16 kHz.
pub const N_FFT: usize = 400;
/// Frame step: 10 ms at 16 kHz.
pub const HOP_LENGTH: usize = 160;
/// One-sided spectrum bins.
const N_FREQS: usize = N_FFT / 2 + 1;
/// faster-whisper's default `padding`: zeros appended to the waveform.
const PAD_END: usize = 160;
/// Frames per parallel task.
const FRAMES_PER_TASK: usize = 64;

/// A log-mel spectrogram, row-major `[n_mels][frames]`.
#[derive(Debug, Clone, PartialEq)]
pub struct LogMel {
    pub n_mels: usize,
    pub frames: usize,
    pub values: Vec<f32>,
}

impl LogMel {
    /// The values of mel band `mel` over all frames.
    pub fn row(&self, mel: usize) -> &[f32] {
        &self.values[mel * self.frames..(mel + 1) * self.frames]
    }
}

/// The log-mel spectrogram of 16 kHz mono `samples` with `n_mels` bands (80, or 128 for
/// large-v3), equal to faster-whisper 1.2.1's `FeatureExtractor(feature_size=n_mels)(samples)`
/// (default `padding=160`).
///
/// There are `(samples.len() + 160) / 160` frames (rounded down): the centred STFT of the
/// zero-extended waveform has one more, which Whisper drops. No truncation or padding to 30 s
/// happens here.
///
/// Short inputs need no special case: the reflection padding reflects back and forth as
/// numpy's `np.pad(mode="reflect")` does when the signal (at least 161 samples once the 160
/// zeros are appended) is shorter than the 200-sample pad, so even a 1-sample input matches
/// faster-whisper.
///
/// Errors: no samples, a NaN or infinite sample, or `n_mels` other than 80 and 128.
pub fn whisper_log_mel(samples: &[f32], n_mels: usize) -> Result<LogMel, AudioError> {
    if n_mels != 80 && n_mels != 128 {
        return Err(AudioError::MelBands(n_mels));
    }
    if samples.is_empty() {
        return Err(AudioError::EmptyInput);
    }
    if let Some((index, &value)) = samples.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        return Err(AudioError::NonFinite { index, value });
    }

    // The waveform with its trailing zeros: n samples; reflected 200 each side: n + 400.
    let n = samples.len() + PAD_END;
    let signal = |i: usize| samples.get(i).copied().unwrap_or(0.0);
    let half = (N_FFT / 2) as i64;
    let padded: Vec<f32> = (0..(n + N_FFT) as i64)
        .map(|i| signal(reflect(i - half, n)))
        .collect();
    // numpy: 1 + (n + 400 - 400) / 160 frames, minus the dropped last one.
    let frames = n / HOP_LENGTH;

    let window = hann_window();
    let bank = MelBank::new(n_mels);
    let fft: Arc<dyn Fft<f64>> = FftPlanner::new().plan_fft_forward(N_FFT);

    // Frame-major [frames][n_mels] log10 values, transposed at the end.
    let mut logs = vec![0f32; frames * n_mels];
    logs.par_chunks_mut(FRAMES_PER_TASK * n_mels)
        .enumerate()
        .for_each(|(task, out)| {
            let mut buf = vec![Complex::new(0f64, 0f64); N_FFT];
            let mut scratch = vec![Complex::new(0f64, 0f64); fft.get_inplace_scratch_len()];
            let mut power = [0f32; N_FREQS];
            for (k, frame_out) in out.chunks_mut(n_mels).enumerate() {
                let start = (task * FRAMES_PER_TASK + k) * HOP_LENGTH;
                let frame = &padded[start..start + N_FFT];
                for ((b, &x), &w) in buf.iter_mut().zip(frame).zip(&window) {
                    *b = Complex::new(f64::from(x * w), 0.0);
                }
                fft.process_with_scratch(&mut buf, &mut scratch);
                for (p, c) in power.iter_mut().zip(&buf[..N_FREQS]) {
                    let magnitude = (c.re as f32).hypot(c.im as f32);
                    *p = magnitude * magnitude;
                }
                bank.apply_log10(&power, frame_out);
            }
        });

    let global_max = logs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let floor = global_max - 8.0;
    let mut values = vec![0f32; n_mels * frames];
    for (t, frame) in logs.chunks_exact(n_mels).enumerate() {
        for (m, &v) in frame.iter().enumerate() {
            values[m * frames + t] = (v.max(floor) + 4.0) / 4.0;
        }
    }
    Ok(LogMel {
        n_mels,
        frames,
        values,
    })
}

/// numpy's `reflect` padding index: position `i` of the infinitely reflected signal of length
/// `n` (n >= 2), i.e. a triangle wave of period 2(n - 1) over 0..n.
fn reflect(i: i64, n: usize) -> usize {
    let period = 2 * (n as i64 - 1);
    let m = i.rem_euclid(period);
    (if m >= n as i64 { period - m } else { m }) as usize
}

/// `np.hanning(401)[:-1].astype(float32)`: the periodic Hann window of 400 samples.
fn hann_window() -> [f32; N_FFT] {
    let mut w = [0f32; N_FFT];
    let m = N_FFT as f64; // np.hanning(M + 1) divides by M
    for (k, v) in w.iter_mut().enumerate() {
        let n = 2.0 * k as f64 - m;
        *v = (0.5 + 0.5 * (std::f64::consts::PI * n / m).cos()) as f32;
    }
    w
}

/// The Slaney-normalised mel filter bank, `[n_mels][201]` f32, with each row's nonzero span.
struct MelBank {
    n_mels: usize,
    weights: Vec<f32>,
    spans: Vec<(usize, usize)>,
}

impl MelBank {
    /// faster-whisper's `get_mel_filters(16000, 400, n_mels)` (librosa's `mel(htk=False,
    /// norm="slaney")`), step for step in f64, then rounded to f32.
    fn new(n_mels: usize) -> MelBank {
        let sr = f64::from(WHISPER_SAMPLE_RATE);
        // np.fft.rfftfreq(n=400, d=1/sr)
        let val = 1.0 / (N_FFT as f64 * (1.0 / sr));
        let fftfreqs: Vec<f64> = (0..N_FREQS).map(|k| k as f64 * val).collect();

        // np.linspace(0, max_mel, n_mels + 2): i * step, the last one exactly max_mel.
        let max_mel = 45.245_640_471_924_965;
        let num = n_mels + 2;
        let step = max_mel / (num - 1) as f64;
        let mut mels: Vec<f64> = (0..num).map(|i| i as f64 * step).collect();
        mels[num - 1] = max_mel;

        // Linear below 1 kHz, logarithmic above.
        let f_min = 0.0;
        let f_sp = 200.0 / 3.0;
        let min_log_hz = 1000.0;
        let min_log_mel = (min_log_hz - f_min) / f_sp;
        let logstep = 6.4f64.ln() / 27.0;
        let freqs: Vec<f64> = mels
            .iter()
            .map(|&m| {
                if m >= min_log_mel {
                    min_log_hz * (logstep * (m - min_log_mel)).exp()
                } else {
                    f_min + f_sp * m
                }
            })
            .collect();

        let mut weights = vec![0f32; n_mels * N_FREQS];
        let mut spans = Vec::with_capacity(n_mels);
        for i in 0..n_mels {
            let fdiff_lo = freqs[i + 1] - freqs[i];
            let fdiff_hi = freqs[i + 2] - freqs[i + 1];
            let enorm = 2.0 / (freqs[i + 2] - freqs[i]);
            let row = &mut weights[i * N_FREQS..(i + 1) * N_FREQS];
            let (mut first, mut last) = (N_FREQS, 0);
            for (k, w) in row.iter_mut().enumerate() {
                let lower = -(freqs[i] - fftfreqs[k]) / fdiff_lo;
                let upper = (freqs[i + 2] - fftfreqs[k]) / fdiff_hi;
                let v = (0f64.max(lower.min(upper)) * enorm) as f32;
                *w = v;
                if v != 0.0 {
                    first = first.min(k);
                    last = k + 1;
                }
            }
            spans.push(if first < last { (first, last) } else { (0, 0) });
        }
        MelBank {
            n_mels,
            weights,
            spans,
        }
    }

    /// `out[m] = log10(max(sum_k w[m][k] * power[k], 1e-10))`, f32 throughout.
    fn apply_log10(&self, power: &[f32; N_FREQS], out: &mut [f32]) {
        for (m, o) in out.iter_mut().enumerate().take(self.n_mels) {
            let (a, b) = self.spans[m];
            let w = &self.weights[m * N_FREQS + a..m * N_FREQS + b];
            let s: f32 = w.iter().zip(&power[a..b]).map(|(&w, &p)| w * p).sum();
            *o = s.max(1e-10).log10();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reflect_matches_numpy() {
        // np.pad(np.arange(5), (12, 12), "reflect")
        let want = [
            4, 3, 2, 1, 0, 1, 2, 3, 4, 3, 2, 1, 0, 1, 2, 3, 4, 3, 2, 1, 0, 1, 2, 3, 4, 3, 2, 1, 0,
        ];
        let got: Vec<usize> = (-12..17).map(|i| reflect(i, 5)).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn window_is_periodic_hann() {
        let w = hann_window();
        assert_eq!(w[0], 0.0);
        assert_eq!(w[200], 1.0);
        assert_eq!(w[100], 0.5);
        assert_eq!(w[1], w[399]);
    }

    #[test]
    fn mel_bank_shape() {
        for n_mels in [80, 128] {
            let bank = MelBank::new(n_mels);
            assert_eq!(bank.weights.len(), n_mels * N_FREQS);
            assert!(bank.spans.iter().all(|&(a, b)| a < b && b <= N_FREQS));
        }
    }
}
