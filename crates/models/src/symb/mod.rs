//! `.symb` model directories (SYNAXIM's INT4 format, docs/symb.md) as LLMs.
//!
//! A directory holds `config.symb.json`, a `tokenizer/` directory as transformers saves one, and
//! one file per tensor (`embeddings.symb`, `lm_head.symb` unless tied, `final_norm.symb`,
//! `layers/layer_NN/{attn_q,attn_k,attn_v,attn_o,mlp_gate,mlp_up,mlp_down,norm_attn,norm_mlp}.symb`
//! and, for Qwen2-style models, `attn_{q,k,v}_bias.symb`). The layout has no files for QK-norms,
//! sandwich norms or RoPE scaling, so it describes Llama/Mistral-style models (no biases) and
//! Qwen2-style ones (q/k/v biases); [`open_symb_dir`] presents them as GGUF's `llama` and
//! `qwen2`.
//!
//! Tensors keep their values exactly:
//! - INT4 matrices whose rows are whole groups of 128 become [`DType::SYMB4`] blocks (the
//!   file's scale and code bytes side by side, executed as stored); INT4 tensors whose groups
//!   span rows, and INT8 ones, are dequantized to F32;
//! - FP16 matrices stay F16, FP32 ones F32, and vectors become F32;
//! - Llama's q/k rows are reordered from transformers' rotate-half pairs to GGUF's adjacent
//!   pairs, as for a Hugging Face directory.

use std::path::Path;

use serde_json::Value as Json;
use synaptix_bundle::symb::{read_tensor, SymbTensor};
use synaptix_bundle::{GgufFile, Value};
use synaptix_core::{Blob, DType, Shape};

use crate::hf::{permute_rotary_rows, tokenizer_keys};

pub mod write;
use crate::{ModelError, Result};
pub use write::{write_symb_dir, SymbMethod, SymbSummary};

/// The file that marks a `.symb` directory.
pub const SYMB_CONFIG: &str = "config.symb.json";

/// llama.cpp-style `general.file_type` for a model whose matrices are mostly SYMB4.
pub const SYMB4_FILE_TYPE: u32 = 1020;

/// Whether `dir` is a `.symb` model directory.
pub fn is_symb_dir(dir: &Path) -> bool {
    dir.is_dir() && dir.join(SYMB_CONFIG).is_file()
}

/// The fields of `config.symb.json` that decide how the model runs.
#[derive(Debug, Clone, PartialEq)]
pub struct SymbConfig {
    pub model_name: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub max_position_embeddings: Option<usize>,
    pub rope_theta: f64,
    pub rms_norm_eps: f64,
    pub tie_word_embeddings: bool,
    pub embedding_file: String,
    pub lm_head_file: String,
    pub layer_dir_pattern: String,
    pub tokenizer_dir: String,
}

impl SymbConfig {
    /// Reads and checks `config.symb.json` in `dir`.
    pub fn read(dir: &Path) -> Result<SymbConfig> {
        let path = dir.join(SYMB_CONFIG);
        let bad = |problem: String| ModelError::BadHyperParameters {
            path: path.display().to_string(),
            problem,
        };
        let raw = std::fs::read(&path).map_err(|e| bad(format!("cannot read: {e}")))?;
        let json: Json = serde_json::from_slice(&raw).map_err(|e| bad(e.to_string()))?;
        let usize_of = |key: &str| -> Result<Option<usize>> {
            match json.get(key) {
                None | Some(Json::Null) => Ok(None),
                Some(v) => v
                    .as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .map(Some)
                    .ok_or_else(|| bad(format!("{key} = {v} is not a count"))),
            }
        };
        let required = |key: &str| -> Result<usize> {
            match usize_of(key)? {
                Some(0) => Err(bad(format!("{key} must be positive"))),
                Some(n) => Ok(n),
                None => Err(bad(format!("missing {key}"))),
            }
        };
        let f64_of = |key: &str, default: f64| -> Result<f64> {
            match json.get(key) {
                None | Some(Json::Null) => Ok(default),
                Some(v) => v
                    .as_f64()
                    .filter(|x| x.is_finite() && *x > 0.0)
                    .ok_or_else(|| bad(format!("{key} = {v} is not a positive number"))),
            }
        };
        let str_of = |key: &str, default: &str| -> Result<String> {
            match json.get(key) {
                None | Some(Json::Null) => Ok(default.to_string()),
                Some(Json::String(s)) => Ok(s.clone()),
                Some(v) => Err(bad(format!("{key} = {v} is not a string"))),
            }
        };

        for key in ["architecture", "model_type"] {
            if let Some(kind) = json.get(key).and_then(Json::as_str) {
                if kind != "dense" {
                    return Err(bad(format!(
                        "{key} '{kind}': synaptix reads dense .symb models (mixture-of-experts \
                         ones are not supported yet)"
                    )));
                }
            }
        }
        let act = str_of("hidden_act", "silu")?;
        if act != "silu" {
            return Err(bad(format!(
                "hidden_act '{act}' is not supported (Llama- and Qwen2-style models use silu)"
            )));
        }
        let num_layers = required("num_layers")?;
        if let Some(types) = json.get("layer_types").and_then(Json::as_array) {
            if let Some(other) = types.iter().find(|t| t.as_str() != Some("full_attention")) {
                return Err(bad(format!(
                    "layer type {other}: synaptix reads .symb models whose layers are all \
                     full_attention"
                )));
            }
            if !types.is_empty() && types.len() != num_layers {
                return Err(bad(format!(
                    "{} layer types for {num_layers} layers",
                    types.len()
                )));
            }
        }
        let hidden_size = required("hidden_size")?;
        let num_attention_heads = required("num_attention_heads")?;
        let head_dim = match usize_of("head_dim")? {
            Some(0) => return Err(bad("head_dim must be positive".into())),
            Some(d) => d,
            None => hidden_size / num_attention_heads,
        };
        if head_dim % 2 != 0 {
            return Err(bad(format!("head_dim {head_dim} is odd; RoPE needs pairs")));
        }
        let num_key_value_heads = usize_of("num_key_value_heads")?.unwrap_or(num_attention_heads);
        if num_key_value_heads == 0 || num_attention_heads % num_key_value_heads != 0 {
            return Err(bad(format!(
                "{num_attention_heads} attention heads do not share {num_key_value_heads} KV heads \
                 evenly"
            )));
        }
        let tie_word_embeddings = match json.get("tie_word_embeddings") {
            None | Some(Json::Null) => false,
            Some(Json::Bool(b)) => *b,
            Some(v) => return Err(bad(format!("tie_word_embeddings = {v} is not a boolean"))),
        };
        let pattern = str_of("layer_dir_pattern", "layers/layer_{:02d}")?;
        layer_dir(&pattern, 0).map_err(bad)?;
        Ok(SymbConfig {
            model_name: str_of("model_name", "")?,
            vocab_size: required("vocab_size")?,
            hidden_size,
            intermediate_size: required("intermediate_size")?,
            num_layers,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            max_position_embeddings: usize_of("max_position_embeddings")?,
            rope_theta: f64_of("rope_theta", 10000.0)?,
            rms_norm_eps: f64_of("rms_norm_eps", 1e-6)?,
            tie_word_embeddings,
            embedding_file: str_of("embedding_file", "embeddings.symb")?,
            lm_head_file: str_of("lm_head_file", "lm_head.symb")?,
            layer_dir_pattern: pattern,
            tokenizer_dir: str_of("tokenizer_dir", "tokenizer")?,
        })
    }
}

/// A layer's directory from a Python format pattern with one integer field (`{}`, `{:d}`,
/// `{:02d}`, `{:0Nd}`).
pub fn layer_dir(pattern: &str, layer: usize) -> std::result::Result<String, String> {
    let open = pattern.find('{');
    let close = pattern.find('}');
    let (Some(open), Some(close)) = (open, close) else {
        return Err(format!(
            "layer_dir_pattern '{pattern}' has no {{}} for the layer"
        ));
    };
    let spec = &pattern[open + 1..close];
    let width = match spec {
        "" | ":d" => 0,
        s => s
            .strip_prefix(":0")
            .and_then(|w| w.strip_suffix('d'))
            .and_then(|w| w.parse::<usize>().ok())
            .filter(|&w| w <= 8)
            .ok_or_else(|| {
                format!("layer_dir_pattern '{pattern}': field {{{s}}} is not supported")
            })?,
    };
    let rest = &pattern[close + 1..];
    if rest.contains('{') || rest.contains('}') || pattern[..open].contains('}') {
        return Err(format!(
            "layer_dir_pattern '{pattern}' must have exactly one field"
        ));
    }
    if pattern.contains("..") || pattern.starts_with('/') {
        return Err(format!(
            "layer_dir_pattern '{pattern}' leaves the model directory"
        ));
    }
    Ok(format!("{}{layer:0width$}{rest}", &pattern[..open]))
}

/// The GGUF architecture a `.symb` directory runs as: Qwen2 when its first layer has q biases.
fn architecture(dir: &Path, cfg: &SymbConfig) -> Result<&'static str> {
    let layer0 = dir.join(layer_dir(&cfg.layer_dir_pattern, 0).map_err(|problem| {
        ModelError::BadHyperParameters {
            path: dir.display().to_string(),
            problem,
        }
    })?);
    Ok(if layer0.join("attn_q_bias.symb").is_file() {
        "qwen2"
    } else {
        "llama"
    })
}

fn f32_blob(values: &[f32]) -> Blob {
    Blob::from_vec(values.iter().flat_map(|v| v.to_le_bytes()).collect())
}

/// A file's tensor in the type it executes as (see the module notes), with its `[rows, cols]`.
fn to_stored(t: SymbTensor, dims: [usize; 2], vector: bool) -> (DType, Blob) {
    match t {
        SymbTensor::Int4 {
            group_size,
            scales,
            codes,
            ..
        } if !vector && group_size == 128 && dims[1].is_multiple_of(128) => {
            let mut out = Vec::with_capacity(scales.len() * DType::SYMB4.block_bytes());
            for (scale, group) in scales.iter().zip(codes.chunks(64)) {
                out.extend_from_slice(&scale.to_le_bytes());
                out.extend_from_slice(group);
            }
            (DType::SYMB4, Blob::from_vec(out))
        }
        SymbTensor::F16(bytes) if !vector => (DType::F16, Blob::from_vec(bytes)),
        SymbTensor::F32(bytes) => (DType::F32, Blob::from_vec(bytes)),
        other => (DType::F32, f32_blob(&other.to_f32())),
    }
}

/// One tensor of a `.symb` directory and the GGUF tensor it is.
#[derive(Debug, Clone, PartialEq)]
pub struct SymbEntry {
    pub gguf_name: String,
    /// Relative to the model directory.
    pub file: String,
    /// `[rows, cols]` as transformers holds it (`[n, 1]` for a vector).
    pub dims: [usize; 2],
    pub vector: bool,
    /// For Llama's q/k projections, the heads whose rows GGUF orders as adjacent pairs.
    pub rotary_heads: Option<usize>,
}

/// Every tensor of a model of `arch` (`llama` or `qwen2`) described by `cfg`, in the order
/// the files are read.
pub fn layout(cfg: &SymbConfig, arch: &str) -> std::result::Result<Vec<SymbEntry>, String> {
    let (d, ff, hd) = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim);
    let (n_head, n_kv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
    let entry =
        |gguf_name: String, file: String, dims: [usize; 2], vector, rotary_heads| SymbEntry {
            gguf_name,
            file,
            dims,
            vector,
            rotary_heads,
        };
    let mut plan = vec![
        entry(
            "token_embd.weight".into(),
            cfg.embedding_file.clone(),
            [cfg.vocab_size, d],
            false,
            None,
        ),
        entry(
            "output_norm.weight".into(),
            "final_norm.symb".into(),
            [d, 1],
            true,
            None,
        ),
    ];
    if !cfg.tie_word_embeddings {
        plan.push(entry(
            "output.weight".into(),
            cfg.lm_head_file.clone(),
            [cfg.vocab_size, d],
            false,
            None,
        ));
    }
    let rotary = |heads: usize| (arch == "llama").then_some(heads);
    for layer in 0..cfg.num_layers {
        let ldir = layer_dir(&cfg.layer_dir_pattern, layer)?;
        let mut add = |gguf: &str, file: &str, dims: [usize; 2], vector: bool, rot| {
            plan.push(entry(
                format!("blk.{layer}.{gguf}"),
                format!("{ldir}/{file}.symb"),
                dims,
                vector,
                rot,
            ));
        };
        add("attn_norm.weight", "norm_attn", [d, 1], true, None);
        add(
            "attn_q.weight",
            "attn_q",
            [n_head * hd, d],
            false,
            rotary(n_head),
        );
        add(
            "attn_k.weight",
            "attn_k",
            [n_kv * hd, d],
            false,
            rotary(n_kv),
        );
        add("attn_v.weight", "attn_v", [n_kv * hd, d], false, None);
        add(
            "attn_output.weight",
            "attn_o",
            [d, n_head * hd],
            false,
            None,
        );
        if arch == "qwen2" {
            add("attn_q.bias", "attn_q_bias", [n_head * hd, 1], true, None);
            add("attn_k.bias", "attn_k_bias", [n_kv * hd, 1], true, None);
            add("attn_v.bias", "attn_v_bias", [n_kv * hd, 1], true, None);
        }
        add("ffn_norm.weight", "norm_mlp", [d, 1], true, None);
        add("ffn_gate.weight", "mlp_gate", [ff, d], false, None);
        add("ffn_up.weight", "mlp_up", [ff, d], false, None);
        add("ffn_down.weight", "mlp_down", [d, ff], false, None);
    }
    Ok(plan)
}

/// Presents a `.symb` directory as a GGUF file (see the module notes).
pub fn open_symb_dir(dir: &Path) -> Result<GgufFile> {
    let cfg = SymbConfig::read(dir)?;
    let arch = architecture(dir, &cfg)?;
    let bad = |problem: String| ModelError::BadHyperParameters {
        path: dir.display().to_string(),
        problem,
    };
    let (d, ff, hd) = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim);
    let (n_head, n_kv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
    let plan = layout(&cfg, arch).map_err(bad)?;
    let mut tensors: Vec<(String, DType, Shape, Blob)> = Vec::with_capacity(plan.len());
    for SymbEntry {
        gguf_name: name,
        file,
        dims,
        vector,
        rotary_heads: rot,
    } in plan
    {
        if file.contains("..") || file.starts_with('/') {
            return Err(bad(format!("{file} leaves the model directory")));
        }
        let t = read_tensor(&dir.join(&file), dims).map_err(|e| bad(e.to_string()))?;
        let (dtype, mut blob) = to_stored(t, dims, vector);
        if let Some(heads) = rot {
            let row_bytes = dims[1] / dtype.block_len() * dtype.block_bytes();
            let permuted = permute_rotary_rows(blob.as_bytes(), heads, row_bytes)
                .ok_or_else(|| bad(format!("{file}: rows do not split into {heads} heads")))?;
            blob = Blob::from_vec(permuted);
        }
        let shape = if vector {
            Shape::new(vec![dims[0]])
        } else {
            Shape::new(dims.to_vec())
        };
        tensors.push((name, dtype, shape, blob));
    }

    let key = |k: &str| format!("{arch}.{k}");
    let u32_of = |k: &str, v: usize| -> Result<(String, Value)> {
        let v = u32::try_from(v).map_err(|_| bad(format!("{k} = {v} is too large")))?;
        Ok((key(k), Value::U32(v)))
    };
    let name = if cfg.model_name.is_empty() {
        dir.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| arch.to_string())
    } else {
        cfg.model_name.clone()
    };
    let mut meta: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(arch.into())),
        ("general.name".into(), Value::String(name)),
    ];
    if let Some(ctx) = cfg.max_position_embeddings {
        meta.push(u32_of("context_length", ctx)?);
    }
    meta.push(u32_of("embedding_length", d)?);
    meta.push(u32_of("block_count", cfg.num_layers)?);
    meta.push(u32_of("feed_forward_length", ff)?);
    meta.push(u32_of("attention.head_count", n_head)?);
    meta.push(u32_of("attention.head_count_kv", n_kv)?);
    meta.push(u32_of("attention.key_length", hd)?);
    meta.push(u32_of("attention.value_length", hd)?);
    meta.push(u32_of("rope.dimension_count", hd)?);
    meta.push((key("rope.freq_base"), Value::F32(cfg.rope_theta as f32)));
    meta.push((
        key("attention.layer_norm_rms_epsilon"),
        Value::F32(cfg.rms_norm_eps as f32),
    ));
    // llama.cpp's file type: what most matrix elements are stored as.
    let mut elements = [0u64; 3];
    for (_, dtype, shape, _) in tensors.iter().filter(|t| t.2.dims().len() == 2) {
        let n: u64 = shape.dims().iter().map(|&d| d as u64).product();
        match dtype {
            DType::SYMB4 => elements[0] += n,
            DType::F16 => elements[1] += n,
            _ => elements[2] += n,
        }
    }
    let most = (0..3).max_by_key(|&i| elements[i]).unwrap_or(0);
    meta.push((
        "general.file_type".into(),
        Value::U32([SYMB4_FILE_TYPE, 1, 0][most]),
    ));
    tokenizer_keys(&dir.join(&cfg.tokenizer_dir), cfg.vocab_size, &mut meta)?;
    Ok(GgufFile::assembled(
        dir.to_path_buf(),
        ".symb (SYNAXIM)",
        meta,
        tensors,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_patterns_format_like_python() {
        assert_eq!(
            layer_dir("layers/layer_{:02d}", 3).unwrap(),
            "layers/layer_03"
        );
        assert_eq!(layer_dir("l{}", 12).unwrap(), "l12");
        assert_eq!(layer_dir("l{:03d}/x", 7).unwrap(), "l007/x");
        assert!(layer_dir("layers", 0).is_err());
        assert!(layer_dir("{}/{}", 0).is_err());
        assert!(layer_dir("../{}", 0).is_err());
        assert!(layer_dir("l{:x}", 0).is_err());
    }
}
