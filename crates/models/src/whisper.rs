//! Whisper (OpenAI, "Robust Speech Recognition via Large-Scale Weak Supervision", 2022): a
//! Transformer encoder over 30 seconds of log-mel frames and a text decoder that attends to it,
//! loaded from a CTranslate2 model directory (`model.bin` with the `WhisperSpec` variables,
//! `config.json`), the layout faster-whisper ships. The arithmetic mirrors CTranslate2's
//! Whisper in float32: pre-norm layers with LayerNorm (eps 1e-5), fused Q/K/V with biases, exact
//! GELU, sinusoidal encoder positions and learned decoder positions as stored, the output
//! projection tied to the token embedding.
//!
//! This file is the model: [`Whisper::encode`] (one window to each decoder layer's
//! cross-attention keys and values), [`Whisper::decode`] and [`Whisper::decode_step`] (decoder
//! steps over per-sequence self-attention caches, [`DecoderCache`], several sequences of a beam
//! in one step), [`Whisper::detect_language`], and the token ids decoding needs
//! ([`WhisperTokens`], from `config.json`). Decoding itself (greedy and beam search, suppression
//! and timestamp rules, segments, seeking) is synaptix-infer's `transcribe`.
//!
//! Runs on the CPU (float16 weights kept as stored, converted exactly inside the products).

use std::path::{Path, PathBuf};

use synaptix_bundle::ct2::Ct2File;
use synaptix_kernels_cpu::dense::{
    attention, attention_heads, conv1d, gelu_erf_inplace, linear, HeadsKv,
};
use synaptix_nn::dense::{split_columns, DenseLinear, DenseWeight, LayerNorm, PreNormGeluMlp};

use crate::{ModelError, Result};

/// Mel frames in one 30-second window (hop 160 at 16 kHz).
pub const WINDOW_FRAMES: usize = 3000;
const LN_EPS: f32 = 1e-5;
/// The decoder's learned positions: prompt and generated tokens together.
pub const MAX_TEXT_POSITIONS: usize = 448;

fn bad(path: &Path, problem: impl Into<String>) -> ModelError {
    ModelError::BadHyperParameters {
        path: path.display().to_string(),
        problem: problem.into(),
    }
}

struct EncoderLayer {
    norm: LayerNorm,
    qkv: DenseLinear,
    out: DenseLinear,
    ffn: PreNormGeluMlp,
}

struct DecoderLayer {
    self_norm: LayerNorm,
    self_qkv: DenseLinear,
    self_out: DenseLinear,
    cross_norm: LayerNorm,
    cross_q: DenseLinear,
    cross_kv: DenseLinear,
    cross_out: DenseLinear,
    ffn: PreNormGeluMlp,
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
    /// `<|startofprev|>`, before previous text in a prompt.
    pub sot_prev: Option<u32>,
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
    /// `config.alignment_heads`: the `(decoder layer, head)` pairs whose cross-attention follows
    /// the timing of words (empty when the config has none).
    pub alignment_heads: Vec<(usize, usize)>,
}

pub struct Whisper {
    dims: WhisperDims,
    /// `[d_model, n_mels · 3]` and `[d_model, d_model · 3]` with their biases.
    conv1: (DenseWeight, Vec<f32>),
    conv2: (DenseWeight, Vec<f32>),
    /// `[audio_positions, d_model]`.
    encoder_positions: Vec<f32>,
    encoder_layers: Vec<EncoderLayer>,
    encoder_norm: LayerNorm,
    /// `[vocab, d_model]`, also the output projection.
    embedding: DenseWeight,
    /// `[MAX_TEXT_POSITIONS, d_model]`.
    decoder_positions: Vec<f32>,
    decoder_layers: Vec<DecoderLayer>,
    decoder_norm: LayerNorm,
}

/// What [`Whisper::forward_scores`] asks the decoder to keep.
struct Capture {
    /// `(layer, head)` pairs.
    heads: Vec<(usize, usize)>,
    /// Per pair: scores `[tokens, frames]`.
    scores: Vec<Vec<f32>>,
    /// `[tokens, vocab]`.
    logits: Vec<f32>,
}

/// The encoder's output for one window and each decoder layer's cross-attention keys and values.
pub struct EncodedAudio {
    /// Per decoder layer: K and V of the `audio_positions` rows, split by head.
    cross: Vec<HeadsKv>,
}

/// One sequence's decoder self-attention cache: per layer K and V, `[len, d_model]`. A beam
/// search clones it where a hypothesis branches.
#[derive(Clone)]
pub struct DecoderCache {
    kv: Vec<(Vec<f32>, Vec<f32>)>,
    len: usize,
}

impl DecoderCache {
    /// Positions decoded so far.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
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
        let conv = |name: &str, c_in: usize| -> Result<(DenseWeight, Vec<f32>)> {
            Ok((
                DenseWeight::load(&file, &format!("encoder/{name}/weight"), d, c_in * 3)?,
                file.f32_matrix(&format!("encoder/{name}/bias"), 1, d)?,
            ))
        };
        let encoder_layers = (0..dims.encoder_layers)
            .map(|i| {
                let p = format!("encoder/layer_{i}");
                Ok(EncoderLayer {
                    norm: LayerNorm::load(
                        &file,
                        &format!("{p}/self_attention/layer_norm"),
                        d,
                        LN_EPS,
                    )?,
                    qkv: DenseLinear::load(
                        &file,
                        &format!("{p}/self_attention/linear_0"),
                        3 * d,
                        d,
                        true,
                    )?,
                    out: DenseLinear::load(
                        &file,
                        &format!("{p}/self_attention/linear_1"),
                        d,
                        d,
                        true,
                    )?,
                    ffn: PreNormGeluMlp::load(&file, &format!("{p}/ffn"), d, LN_EPS)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let decoder_layers = (0..dims.decoder_layers)
            .map(|i| {
                let p = format!("decoder/layer_{i}");
                Ok(DecoderLayer {
                    self_norm: LayerNorm::load(
                        &file,
                        &format!("{p}/self_attention/layer_norm"),
                        d,
                        LN_EPS,
                    )?,
                    self_qkv: DenseLinear::load(
                        &file,
                        &format!("{p}/self_attention/linear_0"),
                        3 * d,
                        d,
                        true,
                    )?,
                    self_out: DenseLinear::load(
                        &file,
                        &format!("{p}/self_attention/linear_1"),
                        d,
                        d,
                        true,
                    )?,
                    cross_norm: LayerNorm::load(
                        &file,
                        &format!("{p}/attention/layer_norm"),
                        d,
                        LN_EPS,
                    )?,
                    cross_q: DenseLinear::load(
                        &file,
                        &format!("{p}/attention/linear_0"),
                        d,
                        d,
                        true,
                    )?,
                    cross_kv: DenseLinear::load(
                        &file,
                        &format!("{p}/attention/linear_1"),
                        2 * d,
                        d,
                        true,
                    )?,
                    cross_out: DenseLinear::load(
                        &file,
                        &format!("{p}/attention/linear_2"),
                        d,
                        d,
                        true,
                    )?,
                    ffn: PreNormGeluMlp::load(&file, &format!("{p}/ffn"), d, LN_EPS)?,
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
            encoder_norm: LayerNorm::load(&file, "encoder/layer_norm", d, LN_EPS)?,
            embedding: DenseWeight::load(&file, "decoder/embeddings/weight", vocab, d)?,
            decoder_positions: file.f32_matrix(
                "decoder/position_encodings/encodings",
                MAX_TEXT_POSITIONS,
                d,
            )?,
            decoder_layers,
            decoder_norm: LayerNorm::load(&file, "decoder/layer_norm", d, LN_EPS)?,
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
            let [q, k, v] = split_columns::<3>(&qkv, rows, d);
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
                let [k, v] = split_columns::<2>(&kv, rows, d);
                Ok(HeadsKv::from_rows(&k, &v, rows, self.dims.decoder_heads)?)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(EncodedAudio { cross })
    }

    /// Runs `tokens` through the decoder after the `cache.len()` positions already in `cache`
    /// (a prompt, or one token) and returns the last position's logits `[vocab]`.
    pub fn decode(
        &self,
        audio: &EncodedAudio,
        cache: &mut DecoderCache,
        tokens: &[u32],
    ) -> Result<Vec<f32>> {
        self.forward(audio, std::slice::from_mut(cache), tokens)
    }

    /// One decoding step of several sequences over the same audio (a beam): `tokens[i]`
    /// continues `caches[i]`. Returns the logits `[caches.len(), vocab]`. The linear layers run
    /// every sequence's row at once (each weight read once per step), the self-attention of each
    /// row over its own cache; the results are those of [`Whisper::decode`] on each sequence.
    pub fn decode_step(
        &self,
        audio: &EncodedAudio,
        caches: &mut [DecoderCache],
        tokens: &[u32],
    ) -> Result<Vec<f32>> {
        if tokens.len() != caches.len() {
            return Err(bad(
                Path::new("whisper"),
                format!("{} tokens for {} sequences", tokens.len(), caches.len()),
            ));
        }
        self.forward(audio, caches, tokens)
    }

    /// Runs a whole token sequence through the decoder (from position 0) for word alignment:
    /// every position's logits `[tokens, vocab]` and, for each `(layer, head)` of `heads`, that
    /// cross-attention head's scores before the softmax, `[tokens, frames]` (CTranslate2's
    /// `align` reads the same).
    pub fn forward_scores(
        &self,
        audio: &EncodedAudio,
        tokens: &[u32],
        heads: &[(usize, usize)],
    ) -> Result<(Vec<f32>, Vec<Vec<f32>>)> {
        let layers = self.decoder_layers.len();
        if let Some(&(l, h)) = heads
            .iter()
            .find(|&&(l, h)| l >= layers || h >= self.dims.decoder_heads)
        {
            return Err(bad(
                Path::new("whisper"),
                format!(
                    "alignment head ({l}, {h}) is outside {layers} layers of {} heads",
                    self.dims.decoder_heads
                ),
            ));
        }
        let mut capture = Capture {
            heads: heads.to_vec(),
            scores: vec![Vec::new(); heads.len()],
            logits: Vec::new(),
        };
        let mut cache = self.new_cache();
        self.forward_with(
            audio,
            std::slice::from_mut(&mut cache),
            tokens,
            Some(&mut capture),
        )?;
        Ok((capture.logits, capture.scores))
    }

    /// `tokens` split evenly over `caches` (sequence `i` gets the `i`-th run of
    /// `tokens.len() / caches.len()`), through the decoder; the logits of each run's last
    /// position, `[caches.len(), vocab]`.
    fn forward(
        &self,
        audio: &EncodedAudio,
        caches: &mut [DecoderCache],
        tokens: &[u32],
    ) -> Result<Vec<f32>> {
        self.forward_with(audio, caches, tokens, None)
    }

    /// [`Whisper::forward`], recording into `capture` (one sequence) the cross-attention scores
    /// it asks for and every position's logits instead of the last one's.
    fn forward_with(
        &self,
        audio: &EncodedAudio,
        caches: &mut [DecoderCache],
        tokens: &[u32],
        mut capture: Option<&mut Capture>,
    ) -> Result<Vec<f32>> {
        let WhisperDims {
            d_model: d,
            vocab,
            decoder_heads: heads,
            ..
        } = self.dims;
        let rows = tokens.len();
        let per = rows.checked_div(caches.len()).unwrap_or(0);
        if per == 0 || per * caches.len() != rows {
            return Err(ModelError::EmptyInput);
        }
        for cache in caches.iter() {
            if cache.len + per > MAX_TEXT_POSITIONS {
                return Err(ModelError::ContextOverflow(
                    per,
                    MAX_TEXT_POSITIONS,
                    cache.len,
                ));
            }
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
            let pos = caches[i / per].len + i % per;
            let at = x.len();
            self.embedding.extend_row(t, d, &mut x);
            let pos = &self.decoder_positions[pos * d..(pos + 1) * d];
            x[at..].iter_mut().zip(pos).for_each(|(e, p)| *e += p);
        }
        for (l, (layer, cross)) in self.decoder_layers.iter().zip(&audio.cross).enumerate() {
            let h = layer.self_norm.forward(&x)?;
            let qkv = layer.self_qkv.forward(&h, rows)?;
            let [q, k, v] = split_columns::<3>(&qkv, rows, d);
            let mut a = Vec::with_capacity(rows * d);
            for (s, cache) in caches.iter_mut().enumerate() {
                let (sk, sv) = &mut cache.kv[l];
                let past = cache.len;
                let run = s * per * d..(s + 1) * per * d;
                sk.extend_from_slice(&k[run.clone()]);
                sv.extend_from_slice(&v[run.clone()]);
                a.extend(attention(
                    &q[run],
                    sk,
                    sv,
                    (per, past + per),
                    heads,
                    Some(past),
                )?);
            }
            let o = layer.self_out.forward(&a, rows)?;
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);

            let h = layer.cross_norm.forward(&x)?;
            let q = layer.cross_q.forward(&h, rows)?;
            if let Some(c) = capture.as_deref_mut() {
                for (i, &(cl, head)) in c.heads.iter().enumerate() {
                    if cl == l {
                        c.scores[i] = cross.scores(&q, rows, head)?;
                    }
                }
            }
            let a = attention_heads(&q, rows, cross, None)?;
            let o = layer.cross_out.forward(&a, rows)?;
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);

            layer.ffn.add_to(&mut x, rows)?;
        }
        if let Some(c) = capture {
            for cache in caches.iter_mut() {
                cache.len += per;
            }
            let all = self.decoder_norm.forward(&x)?;
            c.logits = linear(&all, rows, self.embedding.weight(), vocab, d, None)?;
            return Ok(Vec::new());
        }
        let mut last = Vec::with_capacity(caches.len() * d);
        for (s, cache) in caches.iter_mut().enumerate() {
            cache.len += per;
            last.extend_from_slice(&x[((s + 1) * per - 1) * d..(s + 1) * per * d]);
        }
        let last = self.decoder_norm.forward(&last)?;
        Ok(linear(
            &last,
            caches.len(),
            self.embedding.weight(),
            vocab,
            d,
            None,
        )?)
    }

    /// An empty self-attention cache for [`Whisper::decode`].
    pub fn new_cache(&self) -> DecoderCache {
        DecoderCache {
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
        let alignment_heads = match json.get("alignment_heads") {
            None => Vec::new(),
            Some(list) => list
                .as_array()
                .and_then(|a| {
                    a.iter()
                        .map(|pair| match pair.as_array().map(Vec::as_slice) {
                            Some([l, h]) => Some((l.as_u64()? as usize, h.as_u64()? as usize)),
                            _ => None,
                        })
                        .collect::<Option<Vec<_>>>()
                })
                .ok_or_else(|| bad(config, "'alignment_heads' is not a list of [layer, head]"))?,
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
            sot_prev: token_id("<|startofprev|>"),
            timestamp_begin: no_timestamps + 1,
            no_speech: token_id("<|nospeech|>").or_else(|| token_id("<|nocaptions|>")),
            languages,
            suppress,
            suppress_begin: ids("suppress_ids_begin")?,
            alignment_heads,
        })
    }

    pub fn language(&self, code: &str) -> Option<u32> {
        self.languages
            .iter()
            .find(|(_, c)| c == code)
            .map(|(id, _)| *id)
    }
}
