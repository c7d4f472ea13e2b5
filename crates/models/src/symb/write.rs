//! Writing a model as a `.symb` directory, as SYNAXIM's converter lays one out: matrices in the
//! chosen encoding (INT4 groups of 128 over the flattened tensor, INT8 with one scale, FP16 or
//! FP32), vectors and the final norm in FP16, transformers' orientation and q/k row order, the
//! Hugging Face tokenizer under `tokenizer/`, and `config.symb.json` (with every field SYNAXIM's
//! own config class has, so that its loader reads it) written last.

use std::path::Path;

use half::f16;
use rayon::prelude::*;
use serde_json::json;
use synaptix_bundle::symb::{write_tensor, SymbTensor};
use synaptix_bundle::GgufFile;
use synaptix_tokenizer::{Tokenizer, KEY_HF_JSON};

use super::{layout, SymbConfig, SymbEntry, SYMB_CONFIG};
use crate::{HParams, ModelError, Result};

/// INT4 group size (SYNAXIM's default, and the one synaptix executes as stored).
pub const GROUP_SIZE: usize = 128;

/// How the matrices are stored (`config.symb.json`'s `quantization.method`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SymbMethod {
    Int4,
    Int8,
    Fp16,
    Fp32,
}

impl SymbMethod {
    pub fn name(self) -> &'static str {
        match self {
            SymbMethod::Int4 => "int4",
            SymbMethod::Int8 => "int8",
            SymbMethod::Fp16 => "fp16",
            SymbMethod::Fp32 => "fp32",
        }
    }

    pub fn from_name(name: &str) -> Option<SymbMethod> {
        [
            SymbMethod::Int4,
            SymbMethod::Int8,
            SymbMethod::Fp16,
            SymbMethod::Fp32,
        ]
        .into_iter()
        .find(|m| m.name().eq_ignore_ascii_case(name))
    }
}

/// What [`write_symb_dir`] wrote.
#[derive(Debug, Clone)]
pub struct SymbSummary {
    pub architecture: String,
    pub files: usize,
    pub bytes: u64,
}

fn bad(path: &Path, problem: impl Into<String>) -> ModelError {
    ModelError::BadHyperParameters {
        path: path.display().to_string(),
        problem: problem.into(),
    }
}

/// Reorders a q or k projection's rows within each head from GGUF's adjacent pairs back to
/// transformers' rotate-half pairs: row `h·d + j·d/2 + i` comes from row `h·d + 2i + j`.
fn unpermute_rotary_rows(values: &[f32], heads: usize, cols: usize) -> Option<Vec<f32>> {
    let rows = values.len() / cols.max(1);
    if cols == 0 || heads == 0 || !rows.is_multiple_of(heads) || !(rows / heads).is_multiple_of(2) {
        return None;
    }
    let head = rows / heads;
    let half = head / 2;
    let mut out = vec![0f32; values.len()];
    for h in 0..heads {
        for j in 0..2 {
            for i in 0..half {
                let to = h * head + j * half + i;
                let from = h * head + 2 * i + j;
                out[to * cols..(to + 1) * cols]
                    .copy_from_slice(&values[from * cols..(from + 1) * cols]);
            }
        }
    }
    Some(out)
}

/// `values` in `method`, as SYNAXIM's packer writes them.
fn encode(values: &[f32], dims: [usize; 2], method: SymbMethod) -> SymbTensor {
    match method {
        SymbMethod::Int4 => {
            let groups: Vec<(f32, [u8; GROUP_SIZE / 2])> = values
                .par_chunks(GROUP_SIZE)
                .map(synaptix_kernels_cpu::symb4_encode_group)
                .collect();
            let mut scales = Vec::with_capacity(groups.len());
            let mut codes = Vec::with_capacity(groups.len() * GROUP_SIZE / 2);
            for (scale, group) in &groups {
                scales.push(*scale);
                codes.extend_from_slice(group);
            }
            codes.truncate(values.len().div_ceil(2));
            SymbTensor::Int4 {
                group_size: GROUP_SIZE,
                dims,
                numel: values.len(),
                scales,
                codes,
            }
        }
        SymbMethod::Int8 => {
            let amax = values.iter().fold(0f32, |m, v| m.max(v.abs()));
            let scale = if amax > 0.0 { amax / 127.0 } else { 1.0 };
            let values = values
                .par_iter()
                .map(|v| (v / scale).round_ties_even().clamp(-128.0, 127.0) as i8 as u8)
                .collect();
            SymbTensor::Int8 { scale, values }
        }
        SymbMethod::Fp16 => SymbTensor::F16(
            values
                .iter()
                .flat_map(|&v| f16::from_f32(v).to_le_bytes())
                .collect(),
        ),
        SymbMethod::Fp32 => SymbTensor::F32(values.iter().flat_map(|v| v.to_le_bytes()).collect()),
    }
}

/// The `.symb` description of `input` (a `llama` or `qwen2` model), or why it has none.
fn config_for(input: &GgufFile, arch: &str, model_name: &str) -> Result<SymbConfig> {
    let path = input.path();
    let hp = HParams::from_gguf(input, arch)?;
    if hp.n_rot != hp.head_dim {
        return Err(bad(
            path,
            format!(
                "RoPE turns {} of {} dimensions per head; config.symb.json cannot say so",
                hp.n_rot, hp.head_dim
            ),
        ));
    }
    if hp.rope_freq_scale != 1.0 || input.tensor_info("rope_freqs.weight").is_some() {
        return Err(bad(
            path,
            "the model scales RoPE (linear or Llama 3 factors); config.symb.json has only \
             rope_theta",
        ));
    }
    let vocab = input
        .tensor_info("token_embd.weight")
        .and_then(|t| t.shape.dims().first().copied())
        .ok_or_else(|| bad(path, "no token_embd.weight"))?;
    Ok(SymbConfig {
        model_name: model_name.to_string(),
        vocab_size: vocab,
        hidden_size: hp.n_embd,
        intermediate_size: hp.n_ff,
        num_layers: hp.n_layer,
        num_attention_heads: hp.n_head,
        num_key_value_heads: hp.n_head_kv,
        head_dim: hp.head_dim,
        max_position_embeddings: Some(hp.n_ctx_train).filter(|&n| n > 0),
        rope_theta: hp.rope_freq_base as f64,
        rms_norm_eps: hp.rms_eps as f64,
        tie_word_embeddings: input.tensor_info("output.weight").is_none(),
        embedding_file: "embeddings.symb".into(),
        lm_head_file: "lm_head.symb".into(),
        layer_dir_pattern: "layers/layer_{:02d}".into(),
        tokenizer_dir: "tokenizer".into(),
    })
}

/// `config.symb.json` as SYNAXIM's `SymbioticConfig` serialises it (field order included).
fn config_json(cfg: &SymbConfig, source: &str, method: SymbMethod) -> serde_json::Value {
    // f32 hyper-parameters printed as the decimal that reads back to the same f32.
    let short = |x: f64| -> serde_json::Value {
        let s = format!("{}", x as f32);
        json!(s.parse::<f64>().unwrap_or(x))
    };
    json!({
        "model_name": cfg.model_name,
        "model_type": "dense",
        "source_model": source,
        "grrn_version": "0.1.0",
        "engine_name": "SYNAXIM",
        "architecture": "dense",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "max_position_embeddings": cfg.max_position_embeddings.unwrap_or(131072),
        "rope_theta": short(cfg.rope_theta),
        "rms_norm_eps": short(cfg.rms_norm_eps),
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "layer_types": vec!["full_attention"; cfg.num_layers],
        "num_experts": 1,
        "num_experts_per_tok": 1,
        "moe_layer_indices": [],
        "quantization": {"method": method.name(), "group_size": GROUP_SIZE, "symmetric": true},
        "hidden_act": "silu",
        "gate_alpha": 0.5,
        "gate_scale": 0.0039,
        "memory_lambda": 0.995,
        "embedding_file": cfg.embedding_file,
        "lm_head_file": cfg.lm_head_file,
        "layer_dir_pattern": cfg.layer_dir_pattern,
        "tokenizer_dir": cfg.tokenizer_dir,
    })
}

/// `tokenizer/tokenizer.json` (the one the model carries, or one rebuilt from llama.cpp's
/// byte-level BPE vocabulary) and a `tokenizer_config.json` with its BOS, EOS and chat
/// template.
fn write_tokenizer(input: &GgufFile, dir: &Path) -> Result<u64> {
    let json_text = match input.get_str(KEY_HF_JSON)? {
        Some(text) => text.to_string(),
        None => synaptix_tokenizer::tokenizer_json_from_vocab_keys(|k| input.get(k)).ok_or_else(
            || {
                bad(
                    input.path(),
                    "the model's tokenizer is llama.cpp's vocabulary of a kind that has no \
                     tokenizer.json equivalent here (byte-level BPE with the qwen2, llama-bpe or \
                     gpt-2 pre-tokenizer has); write from the Hugging Face directory instead",
                )
            },
        )?,
    };
    let tok = Tokenizer::from_gguf(input).map_err(|e| bad(input.path(), e.to_string()))?;
    let mut config = serde_json::Map::new();
    for (key, id) in [("bos_token", tok.bos()), ("eos_token", tok.eos())] {
        if let Some(text) = id.and_then(|id| tok.token_string(id)) {
            config.insert(key.into(), json!(text));
        }
    }
    if let Some(t) = tok.chat_template() {
        config.insert("chat_template".into(), json!(t));
    }
    config.insert("tokenizer_class".into(), json!("PreTrainedTokenizerFast"));
    std::fs::create_dir_all(dir).map_err(|e| bad(dir, format!("cannot create: {e}")))?;
    let config_text = serde_json::to_string_pretty(&serde_json::Value::Object(config))
        .map_err(|e| bad(dir, e.to_string()))?;
    for (name, text) in [
        ("tokenizer.json", &json_text),
        ("tokenizer_config.json", &config_text),
    ] {
        let p = dir.join(name);
        std::fs::write(&p, text).map_err(|e| bad(&p, format!("cannot write: {e}")))?;
    }
    Ok((json_text.len() + config_text.len()) as u64)
}

/// Writes `input` (a Llama- or Qwen2-style model) as a `.symb` directory at `out`, which must
/// not exist or be empty, or be a `.symb` directory (replaced). `source` names the input in
/// `source_model`; `progress(done, total, file)` follows each tensor.
pub fn write_symb_dir(
    input: &GgufFile,
    source: &str,
    out: &Path,
    method: SymbMethod,
    progress: &mut dyn FnMut(usize, usize, &str),
) -> Result<SymbSummary> {
    let path = input.path();
    let arch = input
        .get_str("general.architecture")?
        .ok_or_else(|| bad(path, "missing general.architecture"))?
        .to_string();
    if arch != "llama" && arch != "qwen2" {
        return Err(bad(
            path,
            format!(
                "a .symb directory holds Llama- and Qwen2-style models (its layout has no files \
                 for {arch}'s other tensors, such as QK-norms)"
            ),
        ));
    }
    let name = input
        .get_str("general.name")?
        .map(str::to_string)
        .or_else(|| {
            Path::new(source)
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| arch.clone());
    let cfg = config_for(input, &arch, &name)?;
    let plan = layout(&cfg, &arch).map_err(|p| bad(path, p))?;
    let planned: std::collections::HashSet<&str> =
        plan.iter().map(|e| e.gguf_name.as_str()).collect();
    if let Some(extra) = input
        .tensors()
        .iter()
        .find(|t| !planned.contains(t.name.as_str()))
    {
        return Err(bad(
            path,
            format!("tensor {} has no place in the .symb layout", extra.name),
        ));
    }

    if out.exists() {
        let empty = std::fs::read_dir(out)
            .map(|mut d| d.next().is_none())
            .unwrap_or(false);
        if out.join(SYMB_CONFIG).is_file() {
            std::fs::remove_dir_all(out).map_err(|e| bad(out, format!("cannot replace: {e}")))?;
        } else if !empty {
            return Err(bad(
                out,
                "exists and is not an empty directory or a .symb directory; not overwriting it",
            ));
        }
    }
    std::fs::create_dir_all(out).map_err(|e| bad(out, format!("cannot create: {e}")))?;

    let mut bytes = write_tokenizer(input, &out.join(&cfg.tokenizer_dir))?;
    let total = plan.len();
    for (i, entry) in plan.iter().enumerate() {
        let SymbEntry {
            gguf_name,
            file,
            dims,
            vector,
            rotary_heads,
        } = entry;
        progress(i, total, file);
        let info = input
            .tensor_info(gguf_name)
            .ok_or_else(|| bad(path, format!("missing tensor {gguf_name}")))?;
        let n = dims[0] * dims[1];
        if info.elements() as usize != n {
            return Err(bad(
                path,
                format!(
                    "{gguf_name} has {} elements, not the {}x{} its hyper-parameters imply",
                    info.elements(),
                    dims[0],
                    dims[1]
                ),
            ));
        }
        let mut values = vec![0f32; n];
        synaptix_kernels_cpu::dequantize(info.dtype, input.tensor_bytes(info), &mut values)?;
        if let Some(heads) = rotary_heads {
            values = unpermute_rotary_rows(&values, *heads, dims[1])
                .ok_or_else(|| bad(path, format!("{gguf_name}: rows do not split into heads")))?;
        }
        // SYNAXIM's packer: vectors and the final norm always FP16.
        let tensor = if *vector {
            encode(&values, *dims, SymbMethod::Fp16)
        } else {
            encode(&values, *dims, method)
        };
        let target = out.join(file);
        write_tensor(&target, &tensor).map_err(|e| bad(&target, e.problem))?;
        bytes += tensor.to_bytes().len() as u64;
    }
    progress(total, total, "");
    let config = config_json(&cfg, source, method);
    let text = serde_json::to_string_pretty(&config).map_err(|e| bad(out, e.to_string()))?;
    let config_path = out.join(SYMB_CONFIG);
    std::fs::write(&config_path, &text)
        .map_err(|e| bad(&config_path, format!("cannot write: {e}")))?;
    bytes += text.len() as u64;
    Ok(SymbSummary {
        architecture: arch,
        files: total + 3,
        bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotary_rows_go_back_to_halves() {
        // One head of 4 rows (d = 4), 1 column: GGUF order is HF rows [0, 2, 1, 3].
        let gguf = [10.0, 12.0, 11.0, 13.0];
        assert_eq!(
            unpermute_rotary_rows(&gguf, 1, 1).unwrap(),
            vec![10.0, 11.0, 12.0, 13.0]
        );
        let hf: Vec<u8> = (0u8..8).collect();
        let there = crate::hf::permute_rotary_rows(&hf, 2, 1).unwrap();
        let back: Vec<f32> =
            unpermute_rotary_rows(&there.iter().map(|&b| b as f32).collect::<Vec<_>>(), 2, 1)
                .unwrap();
        assert_eq!(back, (0..8).map(|b| b as f32).collect::<Vec<_>>());
    }
}
