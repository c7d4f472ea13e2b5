//! Silero VAD (v6, the ONNX file faster-whisper ships as `silero_vad_v6.onnx`): the probability
//! that each 32 ms chunk of 16 kHz audio holds speech. The weights are the file's initializers
//! (the LSTM's by its graph node); the arithmetic mirrors the graph in float32:
//!
//! - each chunk is 64 samples of context (the previous chunk's tail) and 512 new samples (576),
//!   reflect-padded by 128 on both sides (832);
//! - an STFT as a strided convolution with the stored basis (256-sample windows, hop 128, 129
//!   bins): the magnitudes of frames 1 to 4, `[4, 129]`;
//! - four convolutions with ReLU (kernel 3, padding 1, strides from the graph: 4 → 4 → 2 → 1 → 1
//!   frames), giving one 128-value vector per chunk;
//! - an LSTM over the chunks in order (hidden 128, state carried across the whole audio), ReLU,
//!   a 1×1 convolution to one value and a sigmoid.

use std::path::Path;

use synaptix_bundle::onnx::{AttrValue, OnnxFile};
use synaptix_kernels_cpu::dense::{linear_f32, tanh_f32};

use crate::{ModelError, Result};

/// Samples per chunk, and of context before it.
pub const CHUNK: usize = 512;
pub const CONTEXT: usize = 64;
/// Reflect padding of each chunk before the STFT.
const STFT_PAD: usize = 128;
const SAMPLE_RATE: usize = 16_000;

fn bad(path: &Path, problem: impl Into<String>) -> ModelError {
    ModelError::BadHyperParameters {
        path: path.display().to_string(),
        problem: problem.into(),
    }
}

/// A convolution applied to every chunk: `[c_out, c_in · kernel]` weights (PyTorch's layout
/// flattened), with its stride and padding.
struct ChunkConv {
    w: Vec<f32>,
    b: Vec<f32>,
    c_in: usize,
    c_out: usize,
    kernel: usize,
    stride: usize,
    pad: usize,
}

impl ChunkConv {
    fn load(file: &OnnxFile, weight: &str) -> Result<ChunkConv> {
        let node = file
            .graph
            .nodes
            .iter()
            .find(|n| n.op_type == "Conv" && n.inputs.get(1).is_some_and(|i| i == weight))
            .ok_or_else(|| bad(file.path(), format!("no convolution uses '{weight}'")))?;
        let dims: Vec<usize> = file
            .tensor(weight)
            .map(|t| t.dims.iter().map(|&d| d.max(0) as usize).collect())
            .unwrap_or_default();
        let [c_out, c_in, kernel] = dims[..] else {
            return Err(bad(file.path(), format!("'{weight}' is not 3-D")));
        };
        let one = |name: &str, default: i64| match node.attribute(name) {
            Some(AttrValue::Ints(v)) if !v.is_empty() => v[0],
            _ => default,
        };
        let (stride, pad) = (one("strides", 1), one("pads", 0));
        if !(1..=16).contains(&stride) || !(0..=16).contains(&pad) {
            return Err(bad(
                file.path(),
                format!("'{weight}': stride {stride}, pad {pad}"),
            ));
        }
        let b = match node.inputs.get(2).filter(|b| !b.is_empty()) {
            Some(name) => file.f32_values(name)?,
            None => vec![0.0; c_out],
        };
        let w = file.f32_values(weight)?;
        if b.len() != c_out || w.len() != c_out * c_in * kernel {
            return Err(bad(
                file.path(),
                format!("'{weight}' and its bias disagree"),
            ));
        }
        Ok(ChunkConv {
            w,
            b,
            c_in,
            c_out,
            kernel,
            stride: stride as usize,
            pad: pad as usize,
        })
    }

    /// `x: [chunks, t_in, c_in]` → `([chunks, t_out, c_out], t_out)`, ReLU applied.
    fn forward_relu(&self, x: &[f32], chunks: usize, t_in: usize) -> Result<(Vec<f32>, usize)> {
        let (k, c_in) = (self.kernel, self.c_in);
        let t_out = (t_in + 2 * self.pad).saturating_sub(k) / self.stride + 1;
        let cols = c_in * k;
        let mut unrolled = vec![0f32; chunks * t_out * cols];
        for n in 0..chunks {
            for t in 0..t_out {
                let row = &mut unrolled[(n * t_out + t) * cols..(n * t_out + t + 1) * cols];
                for j in 0..k {
                    let Some(s) = (t * self.stride + j)
                        .checked_sub(self.pad)
                        .filter(|&s| s < t_in)
                    else {
                        continue;
                    };
                    let src = &x[(n * t_in + s) * c_in..(n * t_in + s + 1) * c_in];
                    for (c, &v) in src.iter().enumerate() {
                        row[c * k + j] = v;
                    }
                }
            }
        }
        let mut y = linear_f32(
            &unrolled,
            chunks * t_out,
            &self.w,
            self.c_out,
            cols,
            Some(&self.b),
        )?;
        y.iter_mut().for_each(|v| *v = v.max(0.0));
        Ok((y, t_out))
    }
}

/// The Silero VAD model.
pub struct SileroVad {
    /// STFT basis `[2 · bins, window]`: real parts, then imaginary.
    basis: Vec<f32>,
    window: usize,
    hop: usize,
    bins: usize,
    convs: Vec<ChunkConv>,
    /// LSTM (ONNX gate order i, o, f, c): `w: [4h, input]`, `r: [4h, h]`, `bias: [4h]` (the
    /// input and recurrent biases summed).
    lstm_w: Vec<f32>,
    lstm_r: Vec<f32>,
    lstm_bias: Vec<f32>,
    hidden: usize,
    /// The output layer: `[hidden]` weights and a bias.
    out_w: Vec<f32>,
    out_b: f32,
}

impl SileroVad {
    pub fn load(path: &Path) -> Result<SileroVad> {
        let file = OnnxFile::open(path)?;
        let basis_name = "encoder.feature_extractor.forward_basis_buffer";
        let basis_dims = file
            .tensor(basis_name)
            .map(|t| t.dims.clone())
            .ok_or_else(|| bad(path, "not a Silero VAD v6 file (no STFT basis)"))?;
        let (two_bins, window) = match basis_dims[..] {
            [b, 1, w] if b > 0 && b % 2 == 0 && w > 0 => (b as usize, w as usize),
            _ => return Err(bad(path, format!("STFT basis of shape {basis_dims:?}"))),
        };
        let stft = file
            .graph
            .nodes
            .iter()
            .find(|n| n.op_type == "Conv" && n.inputs.get(1).is_some_and(|i| i == basis_name))
            .ok_or_else(|| bad(path, "no STFT convolution"))?;
        let hop = match stft.attribute("strides") {
            Some(AttrValue::Ints(v)) if v.len() == 1 && v[0] > 0 => v[0] as usize,
            _ => return Err(bad(path, "STFT convolution without a stride")),
        };
        let convs = (0..)
            .map(|i| format!("encoder.conv_layers.{i}.weight"))
            .take_while(|name| file.initializer(name).is_some())
            .map(|name| ChunkConv::load(&file, &name))
            .collect::<Result<Vec<_>>>()?;
        let lstm = file
            .graph
            .nodes
            .iter()
            .find(|n| n.op_type == "LSTM")
            .ok_or_else(|| bad(path, "no LSTM"))?;
        let hidden = match lstm.attribute("hidden_size") {
            Some(AttrValue::Int(h)) if *h > 0 && *h <= 4096 => *h as usize,
            _ => return Err(bad(path, "LSTM without hidden_size")),
        };
        let input = |i: usize| -> Result<Vec<f32>> {
            let name = lstm.inputs.get(i).filter(|n| !n.is_empty());
            Ok(file.f32_values(name.ok_or_else(|| bad(path, "LSTM input missing"))?)?)
        };
        let (lstm_w, lstm_r, b) = (input(1)?, input(2)?, input(3)?);
        let features = convs.last().map_or(0, |c| c.c_out);
        let g = 4 * hidden;
        if convs.is_empty()
            || convs[0].c_in != two_bins / 2
            || lstm_w.len() != g * features
            || lstm_r.len() != g * hidden
            || b.len() != 2 * g
        {
            return Err(bad(path, "the encoder and the LSTM do not fit together"));
        }
        let lstm_bias = (0..g).map(|i| b[i] + b[g + i]).collect();
        let out_w = file.f32_values("decoder.conv1d.weight")?;
        let out_b = file.f32_values("decoder.conv1d.bias")?;
        if out_w.len() != hidden || out_b.len() != 1 {
            return Err(bad(path, "the output layer does not fit the LSTM"));
        }
        Ok(SileroVad {
            basis: file.f32_values(basis_name)?,
            window,
            hop,
            bins: two_bins / 2,
            convs,
            lstm_w,
            lstm_r,
            lstm_bias,
            hidden,
            out_w,
            out_b: out_b[0],
        })
    }

    pub fn sample_rate(&self) -> usize {
        SAMPLE_RATE
    }

    /// Speech probabilities of `audio` (16 kHz), one per 512 samples. As faster-whisper calls
    /// the model: the audio is zero-padded to a multiple of 512 (a whole extra chunk when it
    /// already is one), each chunk gets the previous chunk's last 64 samples as context (zeros
    /// for the first), and the last chunk's own last 64 samples are zeroed first (faster-whisper
    /// writes the first chunk's zero context through a view of the audio).
    pub fn speech_probs(&self, audio: &[f32]) -> Result<Vec<f32>> {
        let mut padded = audio.to_vec();
        padded.resize(audio.len() + CHUNK - audio.len() % CHUNK, 0.0);
        let chunks = padded.len() / CHUNK;
        let tail = padded.len() - CONTEXT;
        padded[tail..].fill(0.0);

        // Each chunk with its context, reflect-padded: [chunks, 832].
        let span = CONTEXT + CHUNK;
        let width = span + 2 * STFT_PAD;
        let mut framed = vec![0f32; chunks * width];
        for n in 0..chunks {
            let dst = &mut framed[n * width..(n + 1) * width];
            let mut samples = vec![0f32; span];
            if n > 0 {
                samples[..CONTEXT].copy_from_slice(&padded[n * CHUNK - CONTEXT..n * CHUNK]);
            }
            samples[CONTEXT..].copy_from_slice(&padded[n * CHUNK..(n + 1) * CHUNK]);
            for (i, d) in dst.iter_mut().enumerate() {
                // Reflection without repeating the edge sample.
                let at = i as isize - STFT_PAD as isize;
                let at = if at < 0 {
                    -at
                } else if at >= span as isize {
                    2 * (span as isize - 1) - at
                } else {
                    at
                };
                *d = samples[at as usize];
            }
        }
        // STFT frames 1.. (the graph drops frame 0): magnitudes [chunks, frames, bins].
        let all_frames = (width - self.window) / self.hop + 1;
        let frames = all_frames - 1;
        let mut windows = Vec::with_capacity(chunks * frames * self.window);
        for n in 0..chunks {
            for f in 1..all_frames {
                let at = n * width + f * self.hop;
                windows.extend_from_slice(&framed[at..at + self.window]);
            }
        }
        let spectrum = linear_f32(
            &windows,
            chunks * frames,
            &self.basis,
            2 * self.bins,
            self.window,
            None,
        )?;
        let mut x: Vec<f32> = spectrum
            .chunks_exact(2 * self.bins)
            .flat_map(|r| {
                let (re, im) = r.split_at(self.bins);
                re.iter().zip(im).map(|(a, b)| (a * a + b * b).sqrt())
            })
            .collect();
        let mut t = frames;
        for conv in &self.convs {
            let (y, t_out) = conv.forward_relu(&x, chunks, t)?;
            x = y;
            t = t_out;
        }
        let features = self.convs.last().map_or(0, |c| c.c_out);
        if t != 1 {
            return Err(ModelError::BadInput(format!(
                "the VAD encoder leaves {t} frames per chunk, expected 1"
            )));
        }
        // The LSTM over the chunks: input projections for all steps at once, then the steps.
        let h4 = 4 * self.hidden;
        let projected = linear_f32(
            &x,
            chunks,
            &self.lstm_w,
            h4,
            features,
            Some(&self.lstm_bias),
        )?;
        let sigmoid = |v: f32| 1.0 / (1.0 + (-v).exp());
        let (mut h, mut c) = (vec![0f32; self.hidden], vec![0f32; self.hidden]);
        let mut probs = Vec::with_capacity(chunks);
        for step in projected.chunks_exact(h4) {
            let rec = linear_f32(&h, 1, &self.lstm_r, h4, self.hidden, None)?;
            let hd = self.hidden;
            for k in 0..hd {
                let gate = |g: usize| step[g * hd + k] + rec[g * hd + k];
                let (i, o, f, cand) = (
                    sigmoid(gate(0)),
                    sigmoid(gate(1)),
                    sigmoid(gate(2)),
                    tanh_f32(gate(3)),
                );
                c[k] = f * c[k] + i * cand;
                h[k] = o * tanh_f32(c[k]);
            }
            let logit: f32 = h
                .iter()
                .zip(&self.out_w)
                .map(|(&v, &w)| v.max(0.0) * w)
                .sum::<f32>()
                + self.out_b;
            probs.push(sigmoid(logit));
        }
        Ok(probs)
    }
}
