//! Whisper (OpenAI, "Robust Speech Recognition via Large-Scale Weak Supervision", 2022): a
//! Transformer encoder over 30 seconds of log-mel frames and a text decoder that attends to it,
//! loaded from a CTranslate2 model directory (`model.bin` with the `WhisperSpec` variables,
//! `config.json`), the layout faster-whisper ships. The arithmetic mirrors CTranslate2's
//! Whisper in float32: pre-norm layers with LayerNorm (eps 1e-5), fused Q/K/V with biases, exact
//! GELU, sinusoidal encoder positions and learned decoder positions as stored, the output
//! projection tied to the token embedding. Greedy decoding follows faster-whisper's defaults:
//! `config.suppress_ids` and the task tokens suppressed at every step, `suppress_ids_begin`
//! (the blank and end-of-text) at the first; with timestamp tokens under CTranslate2's timestamp
//! rules ([`Whisper::generate_with_timestamps`]) or without ([`Whisper::generate`]).
//! [`Whisper::transcribe`] runs faster-whisper's seeking over a whole recording: segments split
//! at timestamp pairs, each window starting where the last one's complete segments end, silent
//! windows skipped.
//!
//! Runs on the CPU (f32 weights converted once at load, about twice the f16 file in memory).

use std::path::{Path, PathBuf};
use std::time::Instant;

use synaptix_bundle::ct2::{Ct2DType, Ct2File};
use synaptix_kernels_cpu::dense::{
    attention, attention_heads, conv1d, gelu_erf_inplace, layer_norm, linear, HeadsKv, WeightRef,
};

use crate::{ModelError, Result};

/// Mel frames in one 30-second window (hop 160 at 16 kHz).
pub const WINDOW_FRAMES: usize = 3000;
const LN_EPS: f32 = 1e-5;
/// The decoder's learned positions: prompt and generated tokens together.
const MAX_TEXT_POSITIONS: usize = 448;

fn bad(path: &Path, problem: impl Into<String>) -> ModelError {
    ModelError::BadHyperParameters {
        path: path.display().to_string(),
        problem: problem.into(),
    }
}

/// A weight matrix `[rows, cols]` as the file stores it: float16 kept as half bits (the products
/// convert them exactly, so the results are those of an f32 copy, with half the bytes to read),
/// any other type converted to f32.
enum Stored {
    F32(Vec<f32>),
    F16(Vec<u16>),
}

impl Stored {
    fn load(file: &Ct2File, name: &str, rows: usize, cols: usize) -> Result<Stored> {
        match file.get(name) {
            Some(v) if v.dtype == Ct2DType::F16 && v.elements() == rows * cols => {
                let bytes = file.bytes(v);
                Ok(Stored::F16(
                    bytes
                        .chunks_exact(2)
                        .map(|b| u16::from_le_bytes([b[0], b[1]]))
                        .collect(),
                ))
            }
            // Any other case: f32_matrix converts, or names the missing variable or the shape.
            _ => Ok(Stored::F32(file.f32_matrix(name, rows, cols)?)),
        }
    }

    fn weight(&self) -> WeightRef<'_> {
        match self {
            Stored::F32(w) => WeightRef::F32(w),
            Stored::F16(w) => WeightRef::F16(w),
        }
    }

    /// Row `j` of `cols` values, as f32, appended to `out`.
    fn extend_row(&self, j: usize, cols: usize, out: &mut Vec<f32>) {
        match self {
            Stored::F32(w) => out.extend_from_slice(&w[j * cols..(j + 1) * cols]),
            Stored::F16(w) => out.extend(
                w[j * cols..(j + 1) * cols]
                    .iter()
                    .map(|&h| f16_bits_to_f32(h)),
            ),
        }
    }
}

fn f16_bits_to_f32(h: u16) -> f32 {
    half::f16::from_bits(h).to_f32()
}

/// `[out, in]` weight with its bias.
struct Dense {
    w: Stored,
    b: Option<Vec<f32>>,
    out: usize,
    inp: usize,
}

impl Dense {
    fn load(file: &Ct2File, prefix: &str, out: usize, inp: usize, bias: bool) -> Result<Dense> {
        let w = Stored::load(file, &format!("{prefix}/weight"), out, inp)?;
        let b = if bias {
            Some(file.f32_matrix(&format!("{prefix}/bias"), 1, out)?)
        } else {
            None
        };
        Ok(Dense { w, b, out, inp })
    }
    /// `x: [rows, inp]` → `[rows, out]`.
    fn forward(&self, x: &[f32], rows: usize) -> Result<Vec<f32>> {
        Ok(linear(
            x,
            rows,
            self.w.weight(),
            self.out,
            self.inp,
            self.b.as_deref(),
        )?)
    }
}

struct Norm {
    gamma: Vec<f32>,
    beta: Vec<f32>,
}

impl Norm {
    fn load(file: &Ct2File, prefix: &str, dim: usize) -> Result<Norm> {
        Ok(Norm {
            gamma: file.f32_matrix(&format!("{prefix}/gamma"), 1, dim)?,
            beta: file.f32_matrix(&format!("{prefix}/beta"), 1, dim)?,
        })
    }
    fn forward(&self, x: &[f32]) -> Result<Vec<f32>> {
        Ok(layer_norm(x, &self.gamma, &self.beta, LN_EPS)?)
    }
}

/// LayerNorm, `fc1` with exact GELU, `fc2`, added to `x`.
struct Ffn {
    norm: Norm,
    fc1: Dense,
    fc2: Dense,
}

impl Ffn {
    fn load(file: &Ct2File, path: &Path, prefix: &str, d: usize) -> Result<Ffn> {
        let hidden = file
            .get(&format!("{prefix}/linear_0/weight"))
            .map(|v| v.shape.first().copied().unwrap_or(0))
            .unwrap_or(0);
        if hidden == 0 {
            return Err(bad(
                path,
                format!("'{prefix}/linear_0/weight' is missing or empty"),
            ));
        }
        Ok(Ffn {
            norm: Norm::load(file, &format!("{prefix}/layer_norm"), d)?,
            fc1: Dense::load(file, &format!("{prefix}/linear_0"), hidden, d, true)?,
            fc2: Dense::load(file, &format!("{prefix}/linear_1"), d, hidden, true)?,
        })
    }
    fn add_to(&self, x: &mut [f32], rows: usize) -> Result<()> {
        let h = self.norm.forward(x)?;
        let mut h = self.fc1.forward(&h, rows)?;
        gelu_erf_inplace(&mut h);
        let h = self.fc2.forward(&h, rows)?;
        x.iter_mut().zip(&h).for_each(|(a, b)| *a += b);
        Ok(())
    }
}

struct EncoderLayer {
    norm: Norm,
    qkv: Dense,
    out: Dense,
    ffn: Ffn,
}

struct DecoderLayer {
    self_norm: Norm,
    self_qkv: Dense,
    self_out: Dense,
    cross_norm: Norm,
    cross_q: Dense,
    cross_kv: Dense,
    cross_out: Dense,
    ffn: Ffn,
}

/// Sizes read from the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WhisperDims {
    pub n_mels: usize,
    pub d_model: usize,
    pub encoder_layers: usize,
    pub decoder_layers: usize,
    pub encoder_heads: usize,
    pub decoder_heads: usize,
    /// Encoder positions: half the window's frames (1500).
    pub audio_positions: usize,
    pub vocab: usize,
}

/// The token ids decoding needs, from `config.json` and the tokenizer's special tokens.
#[derive(Debug, Clone)]
pub struct WhisperTokens {
    pub sot: u32,
    pub eot: u32,
    pub transcribe: u32,
    pub translate: u32,
    pub no_timestamps: u32,
    /// The first timestamp token, `<|0.00|>` (`no_timestamps + 1`); every id from it to the end
    /// of the vocabulary is a timestamp, 0.02 s apart.
    pub timestamp_begin: u32,
    /// `<|nospeech|>` (`<|nocaptions|>` in older vocabularies), whose probability after
    /// start-of-transcript says how likely the window holds no speech.
    pub no_speech: Option<u32>,
    /// Language tokens (`<|en|>`, ...) in the model's order, with their codes.
    pub languages: Vec<(u32, String)>,
    /// Suppressed at every step: `config.suppress_ids` plus the task and start tokens.
    pub suppress: Vec<u32>,
    /// Suppressed at the first generated step only (the blank and end-of-text).
    pub suppress_begin: Vec<u32>,
}

pub struct Whisper {
    dims: WhisperDims,
    /// `[d_model, n_mels · 3]` and `[d_model, d_model · 3]` with their biases.
    conv1: (Stored, Vec<f32>),
    conv2: (Stored, Vec<f32>),
    /// `[audio_positions, d_model]`.
    encoder_positions: Vec<f32>,
    encoder_layers: Vec<EncoderLayer>,
    encoder_norm: Norm,
    /// `[vocab, d_model]`, also the output projection.
    embedding: Stored,
    /// `[MAX_TEXT_POSITIONS, d_model]`.
    decoder_positions: Vec<f32>,
    decoder_layers: Vec<DecoderLayer>,
    decoder_norm: Norm,
}

/// The encoder's output for one window and each decoder layer's cross-attention keys and values.
pub struct EncodedAudio {
    /// Per decoder layer: K and V of the `audio_positions` rows, split by head.
    cross: Vec<HeadsKv>,
}

/// The decoder's self-attention cache: per layer K and V, `[len, d_model]`.
struct SelfCache {
    kv: Vec<(Vec<f32>, Vec<f32>)>,
    len: usize,
}

/// A model directory's files.
pub struct WhisperFiles {
    pub model: PathBuf,
    pub config: PathBuf,
    pub tokenizer: PathBuf,
}

impl WhisperFiles {
    /// `dir/model.bin`, `dir/config.json`, `dir/tokenizer.json`; a path to `model.bin` itself is
    /// taken as its directory. Every file must exist.
    pub fn in_dir(path: &Path) -> Result<WhisperFiles> {
        let dir = if path.is_file() {
            path.parent().unwrap_or(Path::new("."))
        } else {
            path
        };
        if !dir.is_dir() {
            return Err(bad(
                path,
                "not a Whisper model directory (model.bin, config.json, tokenizer.json)",
            ));
        }
        let files = WhisperFiles {
            model: dir.join("model.bin"),
            config: dir.join("config.json"),
            tokenizer: dir.join("tokenizer.json"),
        };
        for f in [&files.model, &files.config, &files.tokenizer] {
            if !f.is_file() {
                return Err(bad(f, "missing (a Whisper model directory holds model.bin, config.json and tokenizer.json)"));
            }
        }
        Ok(files)
    }
}

impl Whisper {
    /// Loads `model.bin` (CTranslate2 `WhisperSpec`), converting every weight to f32.
    pub fn load(model_bin: &Path) -> Result<Whisper> {
        let file = Ct2File::open(model_bin)?;
        if file.spec() != "WhisperSpec" {
            return Err(bad(
                model_bin,
                format!("a CTranslate2 '{}' model, not Whisper", file.spec()),
            ));
        }
        let shape = |name: &str| -> Result<Vec<usize>> {
            file.get(name)
                .map(|v| v.shape.clone())
                .ok_or_else(|| bad(model_bin, format!("variable '{name}' is missing")))
        };
        let conv1 = shape("encoder/conv1/weight")?;
        let emb = shape("decoder/embeddings/weight")?;
        let enc_pos = shape("encoder/position_encodings/encodings")?;
        let dec_pos = shape("decoder/position_encodings/encodings")?;
        let [d_model, n_mels, 3] = conv1[..] else {
            return Err(bad(
                model_bin,
                format!("encoder/conv1/weight has shape {conv1:?}, expected [d, mels, 3]"),
            ));
        };
        let [vocab, d_emb] = emb[..] else {
            return Err(bad(
                model_bin,
                format!("decoder/embeddings/weight has shape {emb:?}"),
            ));
        };
        let audio_positions = enc_pos.first().copied().unwrap_or(0);
        if d_emb != d_model
            || enc_pos.get(1) != Some(&d_model)
            || dec_pos.first() != Some(&MAX_TEXT_POSITIONS)
            || audio_positions * 2 != WINDOW_FRAMES
        {
            return Err(bad(
                model_bin,
                format!("inconsistent sizes: d_model {d_model}, embeddings {emb:?}, positions {enc_pos:?} / {dec_pos:?}"),
            ));
        }
        let count = |prefix: &str| {
            (0..)
                .take_while(|i| {
                    file.get(&format!("{prefix}/layer_{i}/ffn/linear_0/weight"))
                        .is_some()
                })
                .count()
        };
        let heads = |name: &str| -> Result<usize> {
            match file.scalar_i64(name)? {
                Some(h) if h > 0 && d_model % h as usize == 0 => Ok(h as usize),
                other => Err(bad(
                    model_bin,
                    format!("'{name}' is {other:?}, expected a divisor of {d_model}"),
                )),
            }
        };
        let dims = WhisperDims {
            n_mels,
            d_model,
            encoder_layers: count("encoder"),
            decoder_layers: count("decoder"),
            encoder_heads: heads("encoder/num_heads")?,
            decoder_heads: heads("decoder/num_heads")?,
            audio_positions,
            vocab,
        };
        if dims.encoder_layers == 0 || dims.decoder_layers == 0 {
            return Err(bad(model_bin, "no encoder or decoder layers"));
        }
        let d = d_model;
        let conv = |name: &str, c_in: usize| -> Result<(Stored, Vec<f32>)> {
            Ok((
                Stored::load(&file, &format!("encoder/{name}/weight"), d, c_in * 3)?,
                file.f32_matrix(&format!("encoder/{name}/bias"), 1, d)?,
            ))
        };
        let encoder_layers = (0..dims.encoder_layers)
            .map(|i| {
                let p = format!("encoder/layer_{i}");
                Ok(EncoderLayer {
                    norm: Norm::load(&file, &format!("{p}/self_attention/layer_norm"), d)?,
                    qkv: Dense::load(
                        &file,
                        &format!("{p}/self_attention/linear_0"),
                        3 * d,
                        d,
                        true,
                    )?,
                    out: Dense::load(&file, &format!("{p}/self_attention/linear_1"), d, d, true)?,
                    ffn: Ffn::load(&file, model_bin, &format!("{p}/ffn"), d)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let decoder_layers = (0..dims.decoder_layers)
            .map(|i| {
                let p = format!("decoder/layer_{i}");
                Ok(DecoderLayer {
                    self_norm: Norm::load(&file, &format!("{p}/self_attention/layer_norm"), d)?,
                    self_qkv: Dense::load(
                        &file,
                        &format!("{p}/self_attention/linear_0"),
                        3 * d,
                        d,
                        true,
                    )?,
                    self_out: Dense::load(
                        &file,
                        &format!("{p}/self_attention/linear_1"),
                        d,
                        d,
                        true,
                    )?,
                    cross_norm: Norm::load(&file, &format!("{p}/attention/layer_norm"), d)?,
                    cross_q: Dense::load(&file, &format!("{p}/attention/linear_0"), d, d, true)?,
                    cross_kv: Dense::load(
                        &file,
                        &format!("{p}/attention/linear_1"),
                        2 * d,
                        d,
                        true,
                    )?,
                    cross_out: Dense::load(&file, &format!("{p}/attention/linear_2"), d, d, true)?,
                    ffn: Ffn::load(&file, model_bin, &format!("{p}/ffn"), d)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Whisper {
            dims,
            conv1: conv("conv1", n_mels)?,
            conv2: conv("conv2", d)?,
            encoder_positions: file.f32_matrix(
                "encoder/position_encodings/encodings",
                audio_positions,
                d,
            )?,
            encoder_layers,
            encoder_norm: Norm::load(&file, "encoder/layer_norm", d)?,
            embedding: Stored::load(&file, "decoder/embeddings/weight", vocab, d)?,
            decoder_positions: file.f32_matrix(
                "decoder/position_encodings/encodings",
                MAX_TEXT_POSITIONS,
                d,
            )?,
            decoder_layers,
            decoder_norm: Norm::load(&file, "decoder/layer_norm", d)?,
        })
    }

    pub fn dims(&self) -> WhisperDims {
        self.dims
    }

    /// Encodes one window of log-mel features, `mel: [n_mels, WINDOW_FRAMES]` row-major (shorter
    /// audio zero-padded in the log-mel domain, as faster-whisper pads), and prepares every
    /// decoder layer's cross-attention keys and values.
    pub fn encode(&self, mel: &[f32]) -> Result<EncodedAudio> {
        let WhisperDims {
            n_mels,
            d_model: d,
            audio_positions,
            ..
        } = self.dims;
        if mel.len() != n_mels * WINDOW_FRAMES {
            return Err(ModelError::Kernel(synaptix_core::Error::ShapeMismatch {
                op: "whisper encode",
                detail: format!(
                    "{} mel values, expected {n_mels}×{WINDOW_FRAMES}",
                    mel.len()
                ),
            }));
        }
        // [mels, frames] → [frames, mels]: the convolutions run over time-major rows.
        let mut frames = vec![0f32; mel.len()];
        for (c, row) in mel.chunks_exact(WINDOW_FRAMES).enumerate() {
            for (t, &v) in row.iter().enumerate() {
                frames[t * n_mels + c] = v;
            }
        }
        let (mut x, t1) = conv1d(
            &frames,
            WINDOW_FRAMES,
            n_mels,
            self.conv1.0.weight(),
            d,
            3,
            Some(&self.conv1.1),
            1,
            1,
        )?;
        gelu_erf_inplace(&mut x);
        let (mut x, t2) = conv1d(
            &x,
            t1,
            d,
            self.conv2.0.weight(),
            d,
            3,
            Some(&self.conv2.1),
            2,
            1,
        )?;
        gelu_erf_inplace(&mut x);
        debug_assert_eq!(t2, audio_positions);
        x.iter_mut()
            .zip(&self.encoder_positions)
            .for_each(|(a, p)| *a += p);
        let rows = audio_positions;
        for layer in &self.encoder_layers {
            let h = layer.norm.forward(&x)?;
            let qkv = layer.qkv.forward(&h, rows)?;
            let (q, k, v) = split3(&qkv, rows, d);
            let a = attention(&q, &k, &v, (rows, rows), self.dims.encoder_heads, None)?;
            let o = layer.out.forward(&a, rows)?;
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
            layer.ffn.add_to(&mut x, rows)?;
        }
        let x = self.encoder_norm.forward(&x)?;
        let cross = self
            .decoder_layers
            .iter()
            .map(|layer| {
                let kv = layer.cross_kv.forward(&x, rows)?;
                let (k, v) = split2(&kv, rows, d);
                Ok(HeadsKv::from_rows(&k, &v, rows, self.dims.decoder_heads)?)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(EncodedAudio { cross })
    }

    /// Runs `tokens` (positions `cache.len ..`) through the decoder and returns the last
    /// position's logits `[vocab]`.
    fn decode(
        &self,
        audio: &EncodedAudio,
        cache: &mut SelfCache,
        tokens: &[u32],
    ) -> Result<Vec<f32>> {
        let WhisperDims {
            d_model: d, vocab, ..
        } = self.dims;
        let rows = tokens.len();
        let past = cache.len;
        if rows == 0 || past + rows > MAX_TEXT_POSITIONS {
            return Err(ModelError::ContextOverflow(rows, MAX_TEXT_POSITIONS, past));
        }
        let mut x = Vec::with_capacity(rows * d);
        for (i, &t) in tokens.iter().enumerate() {
            let t = t as usize;
            if t >= vocab {
                return Err(bad(
                    Path::new("whisper"),
                    format!("token {t} is outside the vocabulary of {vocab}"),
                ));
            }
            let pos = &self.decoder_positions[(past + i) * d..(past + i + 1) * d];
            let at = x.len();
            self.embedding.extend_row(t, d, &mut x);
            x[at..].iter_mut().zip(pos).for_each(|(e, p)| *e += p);
        }
        let heads = self.dims.decoder_heads;
        for (layer, (cross, (sk, sv))) in self
            .decoder_layers
            .iter()
            .zip(audio.cross.iter().zip(cache.kv.iter_mut()))
        {
            let h = layer.self_norm.forward(&x)?;
            let qkv = layer.self_qkv.forward(&h, rows)?;
            let (q, k, v) = split3(&qkv, rows, d);
            sk.extend_from_slice(&k);
            sv.extend_from_slice(&v);
            let a = attention(&q, sk, sv, (rows, past + rows), heads, Some(past))?;
            let o = layer.self_out.forward(&a, rows)?;
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);

            let h = layer.cross_norm.forward(&x)?;
            let q = layer.cross_q.forward(&h, rows)?;
            let a = attention_heads(&q, rows, cross, None)?;
            let o = layer.cross_out.forward(&a, rows)?;
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);

            layer.ffn.add_to(&mut x, rows)?;
        }
        cache.len += rows;
        let last = self.decoder_norm.forward(&x[(rows - 1) * d..])?;
        Ok(linear(&last, 1, self.embedding.weight(), vocab, d, None)?)
    }

    fn new_cache(&self) -> SelfCache {
        SelfCache {
            kv: (0..self.dims.decoder_layers)
                .map(|_| (Vec::new(), Vec::new()))
                .collect(),
            len: 0,
        }
    }

    /// The language whose token the decoder finds most likely after start-of-transcript, with
    /// its probability among the language tokens (CTranslate2's `detect_language`).
    pub fn detect_language(
        &self,
        audio: &EncodedAudio,
        tokens: &WhisperTokens,
    ) -> Result<(String, f32)> {
        let logits = self.decode(audio, &mut self.new_cache(), &[tokens.sot])?;
        let scores: Vec<f32> = tokens
            .languages
            .iter()
            .map(|(id, _)| logits[*id as usize])
            .collect();
        let max = scores.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = scores.iter().map(|s| ((s - max) as f64).exp()).sum();
        let (best, score) =
            scores
                .iter()
                .enumerate()
                .fold((0, f32::NEG_INFINITY), |(bi, bs), (i, &s)| {
                    if s > bs {
                        (i, s)
                    } else {
                        (bi, bs)
                    }
                });
        let code = tokens
            .languages
            .get(best)
            .map(|(_, c)| c.clone())
            .unwrap_or_default();
        Ok((code, (((score - max) as f64).exp() / sum) as f32))
    }

    /// Greedy decoding of one encoded window after `prompt` (start-of-transcript, language, task,
    /// no-timestamps): each step's arg-max (lowest id on ties) after suppression, until
    /// end-of-text or the decoder's 448 positions. `on_token` sees each token as it is chosen.
    /// Returns the generated tokens without end-of-text, and the first step's logits before
    /// suppression (for checks against a reference).
    pub fn generate(
        &self,
        audio: &EncodedAudio,
        prompt: &[u32],
        tokens: &WhisperTokens,
        on_token: &mut dyn FnMut(u32),
    ) -> Result<(Vec<u32>, Vec<f32>)> {
        let mut cache = self.new_cache();
        let mut logits = self.decode(audio, &mut cache, prompt)?;
        let first = logits.clone();
        let mut out = Vec::new();
        while cache.len < MAX_TEXT_POSITIONS {
            for &id in &tokens.suppress {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
            if out.is_empty() {
                for &id in &tokens.suppress_begin {
                    if let Some(l) = logits.get_mut(id as usize) {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
            let next = argmax(&logits);
            if next == tokens.eot {
                break;
            }
            out.push(next);
            on_token(next);
            if cache.len >= MAX_TEXT_POSITIONS {
                break;
            }
            logits = self.decode(audio, &mut cache, &[next])?;
        }
        Ok((out, first))
    }

    /// Greedy decoding with timestamp tokens, as CTranslate2 decodes a prompt that does not end
    /// in `<|notimestamps|>` (faster-whisper's default mode). On top of [`Whisper::generate`]'s
    /// suppression, CTranslate2's Whisper timestamp rules apply at each step:
    ///
    /// - `<|notimestamps|>` is suppressed;
    /// - the first step must be a timestamp no later than `max_initial_timestamp_index` (0.02 s
    ///   each; faster-whisper passes 50, one second);
    /// - timestamps come in pairs, except right before end-of-text: after a timestamp that
    ///   followed text only a timestamp or end-of-text may come; after two timestamps in a row
    ///   (or the first one) no timestamp;
    /// - timestamps never decrease (none below the last one);
    /// - when text may come, but the timestamps' total probability exceeds the most likely text
    ///   token's (log-sum-exp of the timestamps' logits against the largest text logit, the
    ///   same comparison as on log-softmax values), text is suppressed.
    ///
    /// At most `min(224, 448 - prompt.len() + 1)` steps, CTranslate2's `max_length` for
    /// faster-whisper's 448. The no-speech probability is the softmax of `<|nospeech|>` after
    /// start-of-transcript (CTranslate2's `return_no_speech_prob`, before any suppression); the
    /// log-probabilities summed are those of the chosen tokens, end-of-text's included, under the
    /// suppressed distribution (CTranslate2's score).
    pub fn generate_with_timestamps(
        &self,
        audio: &EncodedAudio,
        prompt: &[u32],
        tokens: &WhisperTokens,
        max_initial_timestamp_index: usize,
        on_token: &mut dyn FnMut(u32),
    ) -> Result<Generation> {
        let vocab = self.dims.vocab;
        let ts_begin = tokens.timestamp_begin as usize;
        let eot = tokens.eot as usize;
        if eot >= ts_begin || ts_begin >= vocab {
            return Err(bad(
                Path::new("whisper"),
                format!("end-of-text {eot} and the first timestamp {ts_begin} do not fit a vocabulary of {vocab}"),
            ));
        }
        let sot_at = prompt
            .iter()
            .position(|&t| t == tokens.sot)
            .ok_or_else(|| {
                bad(
                    Path::new("whisper"),
                    "the prompt has no <|startoftranscript|>",
                )
            })?;
        let mut cache = self.new_cache();
        let at_sot = self.decode(audio, &mut cache, &prompt[..=sot_at])?;
        let no_speech_prob = match tokens.no_speech {
            Some(id) if (id as usize) < vocab => {
                (at_sot[id as usize] as f64 - log_sum_exp(&at_sot)).exp() as f32
            }
            _ => 0.0,
        };
        let mut logits = if sot_at + 1 < prompt.len() {
            self.decode(audio, &mut cache, &prompt[sot_at + 1..])?
        } else {
            at_sot
        };
        let max_steps =
            (MAX_TEXT_POSITIONS / 2).min((MAX_TEXT_POSITIONS + 1).saturating_sub(prompt.len()));
        let off = |l: &mut [f32]| l.iter_mut().for_each(|v| *v = f32::NEG_INFINITY);
        let mut out: Vec<u32> = Vec::new();
        let mut sum_logprob = 0f64;
        for step in 0..max_steps {
            for &id in tokens.suppress.iter().chain(if step == 0 {
                &tokens.suppress_begin[..]
            } else {
                &[][..]
            }) {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
            if let Some(l) = logits.get_mut(tokens.no_timestamps as usize) {
                *l = f32::NEG_INFINITY;
            }
            let mut weigh_timestamps = false;
            if step == 0 {
                off(&mut logits[..ts_begin]);
                let last_allowed = ts_begin.saturating_add(max_initial_timestamp_index);
                if last_allowed + 1 < vocab {
                    off(&mut logits[last_allowed + 1..]);
                }
            } else {
                let last = out[step - 1] as usize;
                if last >= ts_begin {
                    let penultimate = if step >= 2 {
                        out[step - 2] as usize
                    } else {
                        last
                    };
                    if penultimate >= ts_begin {
                        off(&mut logits[ts_begin..]);
                    } else {
                        off(&mut logits[..eot]);
                        weigh_timestamps = true;
                    }
                } else {
                    weigh_timestamps = true;
                }
                if let Some(&ts) = out.iter().rev().find(|&&t| t as usize >= ts_begin) {
                    off(&mut logits[ts_begin..ts as usize]);
                }
            }
            if weigh_timestamps {
                let text_max = logits[..ts_begin]
                    .iter()
                    .fold(f32::NEG_INFINITY, |m, &v| m.max(v));
                if log_sum_exp(&logits[ts_begin..]) > text_max as f64 {
                    off(&mut logits[..ts_begin]);
                }
            }
            let next = argmax(&logits);
            sum_logprob += logits[next as usize] as f64 - log_sum_exp(&logits);
            if next == tokens.eot {
                break;
            }
            out.push(next);
            on_token(next);
            if step + 1 == max_steps {
                break;
            }
            logits = self.decode(audio, &mut cache, &[next])?;
        }
        Ok(Generation {
            tokens: out,
            sum_logprob,
            no_speech_prob,
        })
    }

    /// Transcribes a whole log-mel spectrogram (`mel: [n_mels, frames]` row-major, as
    /// `whisper_log_mel` returns it) window by window, following faster-whisper 1.2.1's
    /// `generate_segments` for greedy decoding at temperature 0 without fallback, without
    /// conditioning on previous text, VAD, word timestamps or an initial prompt.
    ///
    /// With timestamps (the default): the content frames (all but the last) are read in windows
    /// of up to 3000 frames starting at `seek`; each is decoded with
    /// [`Whisper::generate_with_timestamps`] after start-of-transcript, language and task. A
    /// window whose no-speech probability exceeds `no_speech_threshold` while its average
    /// log-probability (sum / (tokens + 1)) does not exceed `log_prob_threshold` is skipped as
    /// silence. Otherwise its tokens split into segments at each pair of consecutive timestamps
    /// ([`split_at_timestamps`]); segments with equal start and end or blank text are dropped,
    /// and `seek` moves past the window when it ends in a single timestamp (or has no timestamp
    /// pair), else to the last timestamp.
    ///
    /// Without timestamps (`options.timestamps == false`): consecutive 3000-frame windows with
    /// `<|notimestamps|>` in the prompt ([`Whisper::generate`]), one segment per window, never
    /// skipped (one window even for audio shorter than a frame).
    ///
    /// `decode_text` turns text tokens (those below end-of-text) into text. `on_event` sees the
    /// detected language, every generated token and each segment as it is final.
    pub fn transcribe(
        &self,
        mel: &[f32],
        frames: usize,
        tokens: &WhisperTokens,
        options: &TranscribeOptions,
        decode_text: &dyn Fn(&[u32]) -> String,
        on_event: &mut dyn FnMut(TranscribeEvent),
    ) -> Result<Transcription> {
        let n_mels = self.dims.n_mels;
        if mel.len() != n_mels * frames {
            return Err(ModelError::Kernel(synaptix_core::Error::ShapeMismatch {
                op: "whisper transcribe",
                detail: format!("{} mel values, expected {n_mels}×{frames}", mel.len()),
            }));
        }
        let text_of = |ids: &[u32]| {
            let text: Vec<u32> = ids.iter().copied().filter(|&t| t < tokens.eot).collect();
            decode_text(&text)
        };
        let max_initial_index = (options.max_initial_timestamp / TIME_PRECISION)
            .round_ties_even()
            .max(0.0) as usize;
        // faster-whisper's content frames: the features but their last frame.
        let content = frames.saturating_sub(1);
        let mut result = Transcription {
            language: None,
            segments: Vec::new(),
            windows: 0,
            skipped: 0,
            encode_s: 0.0,
            decode_s: 0.0,
        };
        let mut language_token = options.language;
        let mut seek = 0usize;
        loop {
            let more = if options.timestamps {
                seek < content
            } else {
                seek < content || (seek == 0 && content == 0)
            };
            if !more {
                break;
            }
            let size = WINDOW_FRAMES.min(content - seek);
            // The window [seek, seek + size) of every mel row, zero-padded to WINDOW_FRAMES.
            let mut window = vec![0f32; n_mels * WINDOW_FRAMES];
            for (c, row) in window.chunks_exact_mut(WINDOW_FRAMES).enumerate() {
                row[..size].copy_from_slice(&mel[c * frames + seek..c * frames + seek + size]);
            }
            let started = Instant::now();
            let encoded = self.encode(&window)?;
            result.encode_s += started.elapsed().as_secs_f64();
            let started = Instant::now();
            let language = match language_token {
                Some(t) => t,
                None => {
                    let (code, p) = self.detect_language(&encoded, tokens)?;
                    on_event(TranscribeEvent::Language {
                        code: &code,
                        probability: p,
                    });
                    let t = tokens.language(&code).unwrap_or(tokens.languages[0].0);
                    result.language = Some((code, p));
                    language_token = Some(t);
                    t
                }
            };
            result.windows += 1;
            let time_offset = seek as f64 * TIME_PER_FRAME;
            let on_token = &mut |id| on_event(TranscribeEvent::Token(id));
            if !options.timestamps {
                let prompt = [tokens.sot, language, options.task, tokens.no_timestamps];
                let (ids, _) = self.generate(&encoded, &prompt, tokens, on_token)?;
                result.decode_s += started.elapsed().as_secs_f64();
                let segment = Segment {
                    seek,
                    start: time_offset,
                    end: time_offset + size as f64 * TIME_PER_FRAME,
                    text: text_of(&ids),
                    tokens: ids,
                    avg_logprob: None,
                    no_speech_prob: None,
                };
                on_event(TranscribeEvent::Segment(&segment));
                result.segments.push(segment);
                seek += WINDOW_FRAMES;
                if content == 0 {
                    break;
                }
                continue;
            }
            let prompt = [tokens.sot, language, options.task];
            let generated = self.generate_with_timestamps(
                &encoded,
                &prompt,
                tokens,
                max_initial_index,
                on_token,
            )?;
            result.decode_s += started.elapsed().as_secs_f64();
            let avg_logprob = generated.avg_logprob();
            if let Some(threshold) = options.no_speech_threshold {
                let mut silent = generated.no_speech_prob as f64 > threshold;
                if options
                    .log_prob_threshold
                    .is_some_and(|lp| avg_logprob > lp)
                {
                    silent = false;
                }
                if silent {
                    result.skipped += 1;
                    seek += size;
                    continue;
                }
            }
            let (pieces, next_seek) =
                split_at_timestamps(&generated.tokens, tokens.timestamp_begin, seek, size);
            for piece in pieces {
                let text = text_of(&piece.tokens);
                if piece.start == piece.end || text.trim().is_empty() {
                    continue;
                }
                let segment = Segment {
                    seek,
                    start: piece.start,
                    end: piece.end,
                    tokens: piece.tokens,
                    text,
                    avg_logprob: Some(avg_logprob),
                    no_speech_prob: Some(generated.no_speech_prob),
                };
                on_event(TranscribeEvent::Segment(&segment));
                result.segments.push(segment);
            }
            // faster-whisper would decode the same window forever when the last timestamp pair
            // sits at 0.00; move past the window instead.
            seek = if next_seek > seek {
                next_seek
            } else {
                seek + size
            };
        }
        Ok(result)
    }
}

/// Seconds per mel frame (hop 160 at 16 kHz).
pub const TIME_PER_FRAME: f64 = 0.01;
/// Seconds per timestamp token.
pub const TIME_PRECISION: f64 = 0.02;
/// Mel frames per timestamp step (the encoder's second convolution has stride 2).
const INPUT_STRIDE: usize = 2;

/// One window's greedy decoding with timestamps.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// The generated tokens, end-of-text excluded.
    pub tokens: Vec<u32>,
    /// The sum of the chosen tokens' log-probabilities, end-of-text's included.
    pub sum_logprob: f64,
    /// The probability of `<|nospeech|>` right after start-of-transcript.
    pub no_speech_prob: f32,
}

impl Generation {
    /// faster-whisper's `avg_logprob`: the sum over the tokens plus one (for end-of-text).
    pub fn avg_logprob(&self) -> f64 {
        self.sum_logprob / (self.tokens.len() + 1) as f64
    }
}

/// How [`Whisper::transcribe`] decodes.
#[derive(Debug, Clone, PartialEq)]
pub struct TranscribeOptions {
    /// `<|transcribe|>` or `<|translate|>`.
    pub task: u32,
    /// The language token; `None` detects it on the first window.
    pub language: Option<u32>,
    /// Timestamp tokens, segments and faster-whisper's seeking; `false` decodes consecutive
    /// 30-second windows with `<|notimestamps|>`.
    pub timestamps: bool,
    /// A window more likely than this to hold no speech ...
    pub no_speech_threshold: Option<f64>,
    /// ... whose average log-probability is not above this is skipped as silence.
    pub log_prob_threshold: Option<f64>,
    /// Seconds: the first timestamp of a window is no later.
    pub max_initial_timestamp: f64,
}

impl TranscribeOptions {
    /// faster-whisper's defaults: timestamps, no-speech threshold 0.6, log-probability
    /// threshold -1.0, first timestamp within 1 s.
    pub fn new(task: u32, language: Option<u32>) -> TranscribeOptions {
        TranscribeOptions {
            task,
            language,
            timestamps: true,
            no_speech_threshold: Some(0.6),
            log_prob_threshold: Some(-1.0),
            max_initial_timestamp: 1.0,
        }
    }
}

/// A stretch of transcribed speech.
#[derive(Debug, Clone, PartialEq)]
pub struct Segment {
    /// The frame its window started at.
    pub seek: usize,
    /// Seconds from the start of the audio.
    pub start: f64,
    pub end: f64,
    /// Its tokens, timestamps included (with timestamps they open and, but for a window's
    /// unfinished last segment, close it).
    pub tokens: Vec<u32>,
    /// The text of its text tokens.
    pub text: String,
    /// The window's average log-probability and no-speech probability (with timestamps).
    pub avg_logprob: Option<f64>,
    pub no_speech_prob: Option<f32>,
}

/// What [`Whisper::transcribe`] reports as it goes.
#[derive(Debug)]
pub enum TranscribeEvent<'a> {
    /// The language detected on the first window.
    Language { code: &'a str, probability: f32 },
    /// A generated token (timestamps included).
    Token(u32),
    /// A final segment.
    Segment(&'a Segment),
}

/// The result of [`Whisper::transcribe`].
#[derive(Debug, Clone, PartialEq)]
pub struct Transcription {
    /// The detected language and its probability (`None` when given).
    pub language: Option<(String, f32)>,
    pub segments: Vec<Segment>,
    /// Windows decoded, and those of them skipped as silence.
    pub windows: usize,
    pub skipped: usize,
    /// Seconds in the encoder, and in language detection and decoding.
    pub encode_s: f64,
    pub decode_s: f64,
}

/// A piece of a window's tokens between timestamps, before the blank ones are dropped.
#[derive(Debug, Clone, PartialEq)]
pub struct TimedTokens {
    pub start: f64,
    pub end: f64,
    pub tokens: Vec<u32>,
}

/// faster-whisper's `_split_segments_by_timestamps` for the window of `size` frames at `seek`:
/// the tokens split before each timestamp that follows a timestamp, every piece timed by its
/// first and last token; when the tokens end in a single timestamp the remainder is a piece
/// too and the next seek is past the window, otherwise the unfinished remainder is left out and
/// the next seek is the last timestamp of the pieces. Without a timestamp pair the whole window
/// is one piece, ending at its last timestamp when that is not 0.00, else at the window's end.
/// Returns the pieces and the next seek.
pub fn split_at_timestamps(
    tokens: &[u32],
    timestamp_begin: u32,
    seek: usize,
    size: usize,
) -> (Vec<TimedTokens>, usize) {
    let time_offset = seek as f64 * TIME_PER_FRAME;
    let is_ts = |t: u32| t >= timestamp_begin;
    let position = |t: u32| t as i64 - timestamp_begin as i64;
    let n = tokens.len();
    let single_ending = n >= 2 && !is_ts(tokens[n - 2]) && is_ts(tokens[n - 1]);
    let mut cuts: Vec<usize> = (1..n)
        .filter(|&i| is_ts(tokens[i]) && is_ts(tokens[i - 1]))
        .collect();
    if cuts.is_empty() {
        let mut duration = size as f64 * TIME_PER_FRAME;
        if let Some(&last) = tokens.iter().rev().find(|&&t| is_ts(t)) {
            if last != timestamp_begin {
                duration = position(last) as f64 * TIME_PRECISION;
            }
        }
        let piece = TimedTokens {
            start: time_offset,
            end: time_offset + duration,
            tokens: tokens.to_vec(),
        };
        return (vec![piece], seek + size);
    }
    if single_ending {
        cuts.push(n);
    }
    let mut pieces = Vec::with_capacity(cuts.len());
    let mut from = 0;
    for &cut in &cuts {
        let slice = &tokens[from..cut];
        pieces.push(TimedTokens {
            start: time_offset + position(slice[0]) as f64 * TIME_PRECISION,
            end: time_offset + position(slice[slice.len() - 1]) as f64 * TIME_PRECISION,
            tokens: slice.to_vec(),
        });
        from = cut;
    }
    let next = if single_ending {
        seek + size
    } else {
        let last = position(tokens[from - 1]);
        (seek as i64 + last * INPUT_STRIDE as i64).max(0) as usize
    };
    (pieces, next)
}

/// `ln Σ exp(x)` in f64; `-inf` when every value is `-inf`.
fn log_sum_exp(x: &[f32]) -> f64 {
    let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    if max == f32::NEG_INFINITY {
        return f64::NEG_INFINITY;
    }
    let max = max as f64;
    max + x.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln()
}

fn argmax(x: &[f32]) -> u32 {
    let mut best = (0usize, f32::NEG_INFINITY);
    for (i, &v) in x.iter().enumerate() {
        if v > best.1 {
            best = (i, v);
        }
    }
    best.0 as u32
}

/// Columns `[0, d)`, `[d, 2d)`, `[2d, 3d)` of `x: [rows, 3d]` as three `[rows, d]` matrices.
fn split3(x: &[f32], rows: usize, d: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (mut a, mut b, mut c) = (
        Vec::with_capacity(rows * d),
        Vec::with_capacity(rows * d),
        Vec::with_capacity(rows * d),
    );
    for r in x.chunks_exact(3 * d) {
        a.extend_from_slice(&r[..d]);
        b.extend_from_slice(&r[d..2 * d]);
        c.extend_from_slice(&r[2 * d..]);
    }
    (a, b, c)
}

fn split2(x: &[f32], rows: usize, d: usize) -> (Vec<f32>, Vec<f32>) {
    let (mut a, mut b) = (Vec::with_capacity(rows * d), Vec::with_capacity(rows * d));
    for r in x.chunks_exact(2 * d) {
        a.extend_from_slice(&r[..d]);
        b.extend_from_slice(&r[d..]);
    }
    (a, b)
}

impl WhisperTokens {
    /// From `config.json` (`lang_ids`, `suppress_ids`, `suppress_ids_begin`) and a lookup of
    /// special tokens by text (the tokenizer's `<|startoftranscript|>`, `<|en|>`, ...).
    pub fn from_config(
        config: &Path,
        token_id: &dyn Fn(&str) -> Option<u32>,
        id_text: &dyn Fn(u32) -> Option<String>,
    ) -> Result<WhisperTokens> {
        let text = std::fs::read_to_string(config)
            .map_err(|e| bad(config, format!("cannot read: {e}")))?;
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| bad(config, format!("not JSON: {e}")))?;
        let ids = |key: &str| -> Result<Vec<u32>> {
            let Some(list) = json.get(key) else {
                return Ok(Vec::new());
            };
            list.as_array()
                .and_then(|a| {
                    a.iter()
                        .map(|v| v.as_u64().and_then(|x| u32::try_from(x).ok()))
                        .collect::<Option<Vec<u32>>>()
                })
                .ok_or_else(|| bad(config, format!("'{key}' is not a list of token ids")))
        };
        let special = |name: &str| {
            token_id(name)
                .ok_or_else(|| bad(config, format!("the tokenizer has no '{name}' token")))
        };
        let sot = special("<|startoftranscript|>")?;
        let eot = special("<|endoftext|>")?;
        let transcribe = special("<|transcribe|>")?;
        let translate = special("<|translate|>")?;
        let no_timestamps = special("<|notimestamps|>")?;
        let mut languages = Vec::new();
        for id in ids("lang_ids")? {
            let text = id_text(id).unwrap_or_default();
            let code = text.strip_prefix("<|").and_then(|t| t.strip_suffix("|>"));
            match code {
                Some(c) => languages.push((id, c.to_string())),
                None => {
                    return Err(bad(
                        config,
                        format!("language id {id} is not a <|code|> token"),
                    ))
                }
            }
        }
        if languages.is_empty() {
            return Err(bad(config, "no 'lang_ids'"));
        }
        let mut suppress = ids("suppress_ids")?;
        // faster-whisper's additions to the default set: the task and start tokens, and those
        // of the previous-text and no-speech prompts where the vocabulary has them.
        suppress.extend([transcribe, translate, sot]);
        suppress.extend(
            [
                "<|startofprev|>",
                "<|startoflm|>",
                "<|nospeech|>",
                "<|nocaptions|>",
            ]
            .iter()
            .filter_map(|n| token_id(n)),
        );
        suppress.sort_unstable();
        suppress.dedup();
        Ok(WhisperTokens {
            sot,
            eot,
            transcribe,
            translate,
            no_timestamps,
            timestamp_begin: no_timestamps + 1,
            no_speech: token_id("<|nospeech|>").or_else(|| token_id("<|nocaptions|>")),
            languages,
            suppress,
            suppress_begin: ids("suppress_ids_begin")?,
        })
    }

    pub fn language(&self, code: &str) -> Option<u32> {
        self.languages
            .iter()
            .find(|(_, c)| c == code)
            .map(|(id, _)| *id)
    }
}
