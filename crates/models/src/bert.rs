//! BERT (Devlin et al., 2018) as a sentence encoder: Hugging Face's `BertModel` forward pass
//! followed by sentence-transformers' pooling, loaded from a sentence-transformers model
//! directory (Hugging Face's layout: `model.safetensors`, `config.json`, `tokenizer.json`,
//! `modules.json`, `sentence_bert_config.json`, `1_Pooling/config.json`), e.g.
//! all-MiniLM-L6-v2.
//!
//! The arithmetic is `BertModel`'s in float32: word + absolute position + token-type (type 0)
//! embeddings and LayerNorm (`layer_norm_eps`), then post-norm layers: self-attention with
//! separate Q/K/V projections (biases), its output projection + residual + LayerNorm, the
//! intermediate projection + exact (erf) GELU + output projection + residual + LayerNorm. Then
//! the pooling of `1_Pooling/config.json` (mean over the sentence's tokens, or its first token,
//! CLS) and L2 normalisation when `modules.json` lists a `Normalize` module.
//!
//! Several sentences run as one batch: their tokens are packed into one matrix (no padding rows)
//! for every projection, and attention runs per sentence over that sentence's keys only, which is
//! exactly what `BertModel` computes for a padded batch with its attention mask (a padded key
//! gets the most negative float added to its score, so a weight of exactly 0) without computing
//! the padding. Runs on the CPU.

use std::path::{Path, PathBuf};

use serde_json::Value;
use synaptix_bundle::safetensors::SafetensorsFile;
use synaptix_kernels_cpu::dense::{attention, gelu_erf_inplace};
use synaptix_nn::dense::{DenseLinear, DenseWeight, LayerNorm};

use crate::{ModelError, Result};

fn bad(path: &Path, problem: impl Into<String>) -> ModelError {
    ModelError::BadHyperParameters {
        path: path.display().to_string(),
        problem: problem.into(),
    }
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|e| bad(path, format!("cannot read: {e}")))?;
    serde_json::from_str(&text).map_err(|e| bad(path, format!("invalid JSON: {e}")))
}

/// The hyper-parameters of `config.json` that the forward pass uses.
#[derive(Debug, Clone, PartialEq)]
pub struct BertConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    pub max_position_embeddings: usize,
    pub type_vocab_size: usize,
    pub layer_norm_eps: f32,
}

impl BertConfig {
    /// From a Hugging Face `config.json` of `model_type` "bert" with `hidden_act` "gelu" and
    /// absolute position embeddings.
    pub fn from_json(path: &Path, v: &Value) -> Result<BertConfig> {
        let model_type = v.get("model_type").and_then(Value::as_str).unwrap_or("");
        if model_type != "bert" {
            return Err(bad(
                path,
                format!(
                    "model_type '{model_type}' is not 'bert' (only BERT encoders are supported)"
                ),
            ));
        }
        let size = |key: &str| -> Result<usize> {
            v.get(key)
                .and_then(Value::as_u64)
                .and_then(|n| usize::try_from(n).ok())
                .filter(|&n| n > 0 && n <= 1 << 20)
                .ok_or_else(|| bad(path, format!("'{key}' missing or not a size in 1..=2^20")))
        };
        let act = v
            .get("hidden_act")
            .and_then(Value::as_str)
            .unwrap_or("gelu");
        if act != "gelu" {
            return Err(bad(
                path,
                format!("hidden_act '{act}' is not supported (only 'gelu', exact erf)"),
            ));
        }
        let pos = v
            .get("position_embedding_type")
            .and_then(Value::as_str)
            .unwrap_or("absolute");
        if pos != "absolute" {
            return Err(bad(
                path,
                format!("position_embedding_type '{pos}' is not supported (only 'absolute')"),
            ));
        }
        let eps = v
            .get("layer_norm_eps")
            .and_then(Value::as_f64)
            .unwrap_or(1e-12);
        if !(eps > 0.0 && eps < 1.0) {
            return Err(bad(path, format!("layer_norm_eps {eps} is not in (0, 1)")));
        }
        let c = BertConfig {
            vocab_size: size("vocab_size")?,
            hidden_size: size("hidden_size")?,
            num_hidden_layers: size("num_hidden_layers")?,
            num_attention_heads: size("num_attention_heads")?,
            intermediate_size: size("intermediate_size")?,
            max_position_embeddings: size("max_position_embeddings")?,
            type_vocab_size: v
                .get("type_vocab_size")
                .and_then(Value::as_u64)
                .map_or(2, |n| n as usize),
            layer_norm_eps: eps as f32,
        };
        if !c.hidden_size.is_multiple_of(c.num_attention_heads) {
            return Err(bad(
                path,
                format!(
                    "hidden_size {} is not a multiple of num_attention_heads {}",
                    c.hidden_size, c.num_attention_heads
                ),
            ));
        }
        if c.type_vocab_size == 0 {
            return Err(bad(path, "type_vocab_size is 0"));
        }
        Ok(c)
    }
}

/// How token states become one vector (sentence-transformers' `Pooling`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The mean over the sentence's tokens (padding excluded).
    Mean,
    /// The first token's state (`[CLS]`).
    Cls,
}

impl Pooling {
    pub fn name(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
        }
    }
}

/// The files of a sentence-transformers directory.
#[derive(Debug, Clone)]
pub struct BertPaths {
    pub dir: PathBuf,
    pub weights: PathBuf,
    pub config: PathBuf,
    pub tokenizer: PathBuf,
}

impl BertPaths {
    /// `dir` or a path to its `model.safetensors`; every required file must exist.
    pub fn resolve(path: &Path) -> Result<BertPaths> {
        let dir = if path.is_file() {
            path.parent().unwrap_or(Path::new(".")).to_path_buf()
        } else {
            path.to_path_buf()
        };
        if !dir.is_dir() {
            return Err(bad(
                path,
                "not a model directory (model.safetensors, config.json, tokenizer.json)",
            ));
        }
        let p = BertPaths {
            weights: if path.is_file() {
                path.to_path_buf()
            } else {
                dir.join("model.safetensors")
            },
            config: dir.join("config.json"),
            tokenizer: dir.join("tokenizer.json"),
            dir,
        };
        for f in [&p.weights, &p.config, &p.tokenizer] {
            if !f.is_file() {
                return Err(bad(
                    f,
                    "missing (a sentence-transformers model directory holds model.safetensors, config.json and tokenizer.json)",
                ));
            }
        }
        Ok(p)
    }
}

struct Layer {
    q: DenseLinear,
    k: DenseLinear,
    v: DenseLinear,
    attn_out: DenseLinear,
    attn_norm: LayerNorm,
    inter: DenseLinear,
    out: DenseLinear,
    out_norm: LayerNorm,
}

/// A BERT sentence encoder with its pooling.
pub struct BertEmbedder {
    paths: BertPaths,
    config: BertConfig,
    pooling: Pooling,
    normalize: bool,
    max_seq_length: usize,
    word: DenseWeight,
    position: DenseWeight,
    token_type: DenseWeight,
    emb_norm: LayerNorm,
    layers: Vec<Layer>,
}

impl BertEmbedder {
    /// Loads a sentence-transformers directory (or its `model.safetensors`).
    pub fn load(path: &Path) -> Result<BertEmbedder> {
        let paths = BertPaths::resolve(path)?;
        let config = BertConfig::from_json(&paths.config, &read_json(&paths.config)?)?;
        let (pooling, normalize) = read_modules(&paths.dir)?;
        let st_config = paths.dir.join("sentence_bert_config.json");
        let max_seq_length = if st_config.is_file() {
            match read_json(&st_config)?.get("max_seq_length") {
                Some(v) => v
                    .as_u64()
                    .map(|n| n as usize)
                    .filter(|&n| n >= 2)
                    .ok_or_else(|| bad(&st_config, "max_seq_length is not a size of at least 2"))?,
                None => config.max_position_embeddings,
            }
        } else {
            config.max_position_embeddings
        }
        .min(config.max_position_embeddings);

        let file = SafetensorsFile::open(&paths.weights)?;
        // Some exports prefix every name with "bert.".
        let prefix = if file.get("embeddings.word_embeddings.weight").is_none()
            && file.get("bert.embeddings.word_embeddings.weight").is_some()
        {
            "bert."
        } else {
            ""
        };
        let c = &config;
        let d = c.hidden_size;
        let lin = |name: &str, out: usize, inp: usize| {
            DenseLinear::load_named(
                &file,
                &format!("{prefix}{name}.weight"),
                Some(&format!("{prefix}{name}.bias")),
                out,
                inp,
            )
        };
        let norm = |name: &str| {
            LayerNorm::load_named(
                &file,
                &format!("{prefix}{name}.weight"),
                &format!("{prefix}{name}.bias"),
                d,
                c.layer_norm_eps,
            )
        };
        let emb = |name: &str, rows: usize| {
            DenseWeight::load(&file, &format!("{prefix}embeddings.{name}.weight"), rows, d)
        };
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            let p = format!("encoder.layer.{i}");
            layers.push(Layer {
                q: lin(&format!("{p}.attention.self.query"), d, d)?,
                k: lin(&format!("{p}.attention.self.key"), d, d)?,
                v: lin(&format!("{p}.attention.self.value"), d, d)?,
                attn_out: lin(&format!("{p}.attention.output.dense"), d, d)?,
                attn_norm: norm(&format!("{p}.attention.output.LayerNorm"))?,
                inter: lin(&format!("{p}.intermediate.dense"), c.intermediate_size, d)?,
                out: lin(&format!("{p}.output.dense"), d, c.intermediate_size)?,
                out_norm: norm(&format!("{p}.output.LayerNorm"))?,
            });
        }
        Ok(BertEmbedder {
            word: emb("word_embeddings", c.vocab_size)?,
            position: emb("position_embeddings", c.max_position_embeddings)?,
            token_type: emb("token_type_embeddings", c.type_vocab_size)?,
            emb_norm: norm("embeddings.LayerNorm")?,
            layers,
            paths,
            config,
            pooling,
            normalize,
            max_seq_length,
        })
    }

    pub fn paths(&self) -> &BertPaths {
        &self.paths
    }

    pub fn config(&self) -> &BertConfig {
        &self.config
    }

    /// The embedding size.
    pub fn dim(&self) -> usize {
        self.config.hidden_size
    }

    pub fn pooling(&self) -> Pooling {
        self.pooling
    }

    /// Whether embeddings are L2-normalised (a `Normalize` module in `modules.json`).
    pub fn normalize(&self) -> bool {
        self.normalize
    }

    /// The most tokens a text keeps (`sentence_bert_config.json`'s `max_seq_length`, at most
    /// `max_position_embeddings`).
    pub fn max_seq_length(&self) -> usize {
        self.max_seq_length
    }

    /// A tokenized text (with its `[CLS]` … `[SEP]`) cut to [`BertEmbedder::max_seq_length`] as
    /// sentence-transformers truncates: the first tokens, then the last one (the `[SEP]`).
    pub fn truncate(&self, mut ids: Vec<u32>) -> Vec<u32> {
        let max = self.max_seq_length;
        if ids.len() > max {
            let last = ids[ids.len() - 1];
            ids.truncate(max - 1);
            ids.push(last);
        }
        ids
    }

    /// The last layer's token states of each sequence, `[len_i, dim]`.
    pub fn hidden_states(&self, batch: &[Vec<u32>]) -> Result<Vec<Vec<f32>>> {
        let c = &self.config;
        let d = c.hidden_size;
        for ids in batch {
            if ids.is_empty() {
                return Err(ModelError::EmptyInput);
            }
            if ids.len() > c.max_position_embeddings {
                return Err(ModelError::TooManyTokens {
                    tokens: ids.len(),
                    max: c.max_position_embeddings,
                });
            }
            if let Some(&id) = ids.iter().find(|&&id| id as usize >= c.vocab_size) {
                return Err(bad(
                    &self.paths.config,
                    format!(
                        "token id {id} is outside the vocabulary of {}",
                        c.vocab_size
                    ),
                ));
            }
        }
        let total: usize = batch.iter().map(Vec::len).sum();
        if total == 0 {
            return Ok(Vec::new());
        }
        let mut type0 = Vec::with_capacity(d);
        self.token_type.extend_row(0, d, &mut type0);
        let mut x = Vec::with_capacity(total * d);
        let mut pos = Vec::with_capacity(d);
        for ids in batch {
            for (p, &id) in ids.iter().enumerate() {
                let at = x.len();
                self.word.extend_row(id as usize, d, &mut x);
                pos.clear();
                self.position.extend_row(p, d, &mut pos);
                for ((v, &p), &t) in x[at..].iter_mut().zip(&pos).zip(&type0) {
                    *v = *v + t + p;
                }
            }
        }
        let mut x = self.emb_norm.forward(&x)?;
        for layer in &self.layers {
            let q = layer.q.forward(&x, total)?;
            let k = layer.k.forward(&x, total)?;
            let v = layer.v.forward(&x, total)?;
            let mut ctx = Vec::with_capacity(total * d);
            let mut at = 0;
            for ids in batch {
                let n = ids.len();
                let r = at * d..(at + n) * d;
                ctx.extend(attention(
                    &q[r.clone()],
                    &k[r.clone()],
                    &v[r],
                    (n, n),
                    c.num_attention_heads,
                    None,
                )?);
                at += n;
            }
            let mut a = layer.attn_out.forward(&ctx, total)?;
            a.iter_mut().zip(&x).for_each(|(a, x)| *a += x);
            x = layer.attn_norm.forward(&a)?;
            let mut h = layer.inter.forward(&x, total)?;
            gelu_erf_inplace(&mut h);
            let mut o = layer.out.forward(&h, total)?;
            o.iter_mut().zip(&x).for_each(|(o, x)| *o += x);
            x = layer.out_norm.forward(&o)?;
        }
        let mut out = Vec::with_capacity(batch.len());
        let mut at = 0;
        for ids in batch {
            out.push(x[at * d..(at + ids.len()) * d].to_vec());
            at += ids.len();
        }
        Ok(out)
    }

    /// One embedding per sequence of token ids (each with its `[CLS]` … `[SEP]`, at most
    /// `max_position_embeddings` long: see [`BertEmbedder::truncate`]).
    pub fn embed(&self, batch: &[Vec<u32>]) -> Result<Vec<Vec<f32>>> {
        let d = self.dim();
        let states = self.hidden_states(batch)?;
        Ok(states
            .iter()
            .map(|h| {
                let mut e = match self.pooling {
                    Pooling::Cls => h[..d].to_vec(),
                    Pooling::Mean => {
                        let n = h.len() / d;
                        let mut sum = vec![0f64; d];
                        for row in h.chunks_exact(d) {
                            sum.iter_mut().zip(row).for_each(|(s, &v)| *s += v as f64);
                        }
                        sum.iter().map(|&s| (s / n as f64) as f32).collect()
                    }
                };
                if self.normalize {
                    l2_normalize(&mut e);
                }
                e
            })
            .collect())
    }
}

/// Scales `v` to unit length (as torch's `normalize`: the norm clamped to at least 1e-12).
pub fn l2_normalize(v: &mut [f32]) {
    let norm = v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    let inv = 1.0 / norm.max(1e-12);
    v.iter_mut().for_each(|x| *x = (*x as f64 * inv) as f32);
}

/// The cosine similarity of two vectors (0 when either is zero).
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let (mut ab, mut aa, mut bb) = (0f64, 0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        ab += x as f64 * y as f64;
        aa += x as f64 * x as f64;
        bb += y as f64 * y as f64;
    }
    if aa == 0.0 || bb == 0.0 {
        0.0
    } else {
        (ab / (aa.sqrt() * bb.sqrt())) as f32
    }
}

/// Pooling and normalisation from `modules.json` (and the pooling module's `config.json`);
/// without `modules.json`, `1_Pooling/config.json` if present, else mean pooling, unnormalised.
fn read_modules(dir: &Path) -> Result<(Pooling, bool)> {
    let modules = dir.join("modules.json");
    let (pool_dir, normalize) = if modules.is_file() {
        let v = read_json(&modules)?;
        let list = v
            .as_array()
            .ok_or_else(|| bad(&modules, "not a JSON list of modules"))?;
        let mut pool_dir = None;
        let mut normalize = false;
        for m in list {
            let ty = m.get("type").and_then(Value::as_str).unwrap_or("");
            let path = m.get("path").and_then(Value::as_str).unwrap_or("");
            match ty.rsplit('.').next().unwrap_or("") {
                "Transformer" => {}
                "Pooling" => pool_dir = Some(dir.join(path)),
                "Normalize" => normalize = true,
                other => {
                    return Err(bad(
                        &modules,
                        format!(
                        "module type '{other}' is not supported (Transformer, Pooling, Normalize)"
                    ),
                    ))
                }
            }
        }
        (pool_dir, normalize)
    } else {
        (Some(dir.join("1_Pooling")), false)
    };
    let pooling = match pool_dir.map(|p| p.join("config.json")) {
        Some(cfg) if cfg.is_file() => {
            let v = read_json(&cfg)?;
            let flag = |k: &str| v.get(k).and_then(Value::as_bool).unwrap_or(false);
            let modes = [
                "pooling_mode_cls_token",
                "pooling_mode_mean_tokens",
                "pooling_mode_max_tokens",
                "pooling_mode_mean_sqrt_len_tokens",
                "pooling_mode_weightedmean_tokens",
                "pooling_mode_lasttoken",
            ];
            let on: Vec<&str> = modes.iter().copied().filter(|k| flag(k)).collect();
            match on.as_slice() {
                ["pooling_mode_mean_tokens"] => Pooling::Mean,
                ["pooling_mode_cls_token"] => Pooling::Cls,
                _ => {
                    return Err(bad(
                        &cfg,
                        format!(
                            "pooling modes {on:?} are not supported (exactly one of mean_tokens, cls_token)"
                        ),
                    ))
                }
            }
        }
        _ => Pooling::Mean,
    };
    Ok((pooling, normalize))
}
