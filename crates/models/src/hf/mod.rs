//! Hugging Face model directories as LLMs: `config.json`, the weights in safetensors
//! (`model.safetensors`, or shards listed by `model.safetensors.index.json`) and
//! `tokenizer.json`, as `transformers` saves them for `LlamaForCausalLM`, `MistralForCausalLM`,
//! `MixtralForCausalLM`, `Qwen2ForCausalLM`, `Qwen2MoeForCausalLM`, `Qwen3ForCausalLM`,
//! `Qwen3MoeForCausalLM` and
//! `Gemma3ForCausalLM` (mixture-of-experts tensors: [`experts`]).
//!
//! [`open_hf_dir`] presents such a directory as the GGUF file llama.cpp's
//! `convert_hf_to_gguf.py` would write from it, so that every model file, command and the
//! `.syn` writer read it unchanged:
//! - `config.json` becomes the `{arch}.*` keys;
//! - tensors get GGUF's names and keep their bytes (F32, F16 and BF16 matrices, borrowed from
//!   the mapped files), except where GGUF's convention differs from transformers':
//!   - Llama and Mistral's q/k rows are reordered from rotate-half pairs to adjacent pairs;
//!   - Gemma's norms hold `1 + w`;
//!   - 1-D tensors (norms, biases) become F32;
//! - a Llama 3 `rope_scaling` becomes the `rope_freqs.weight` factors;
//! - `tokenizer.json` travels whole in `tokenizer.huggingface.json` (GGUF's key for it), with
//!   BOS, EOS and the chat template from `tokenizer_config.json` (or `chat_template.jinja`);
//!   a byte-level BPE tokenizer also becomes llama.cpp's `tokenizer.ggml.*` vocabulary.
//!
//! A tensor that the architecture does not use is an error rather than silently ignored.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use serde_json::Value as Json;
use synaptix_bundle::safetensors::{SafetensorsFile, StDType, StTensor};
use synaptix_bundle::{GgufFile, Value};
use synaptix_core::{Blob, DType, Shape};

use crate::{ModelError, Result};

mod experts;
use experts::{expert_part, LayerExperts, Piece};

/// `model_type` values [`open_hf_dir`] reads, with the GGUF architecture each becomes.
pub const HF_MODEL_TYPES: &[(&str, &str)] = &[
    ("llama", "llama"),
    ("mistral", "llama"),
    ("mixtral", "llama"),
    ("qwen2", "qwen2"),
    ("qwen2_moe", "qwen2moe"),
    ("qwen3", "qwen3"),
    ("qwen3_moe", "qwen3moe"),
    ("gemma3_text", "gemma3"),
    ("gemma3", "gemma3"),
];

/// Whether `dir` looks like a Hugging Face LLM directory: a `config.json` whose `model_type`
/// is one of [`HF_MODEL_TYPES`] beside safetensors weights.
pub fn is_hf_llm_dir(dir: &Path) -> bool {
    if !dir.is_dir() || !has_weights(dir) {
        return false;
    }
    read_json(&dir.join("config.json"))
        .ok()
        .and_then(|c| {
            c.get("model_type")
                .and_then(Json::as_str)
                .map(|t| HF_MODEL_TYPES.iter().any(|(k, _)| *k == t))
        })
        .unwrap_or(false)
}

/// Opens a GGUF file or `.syn` bundle, a Hugging Face LLM directory ([`open_hf_dir`]) or a
/// `.symb` directory ([`crate::symb::open_symb_dir`]).
pub fn open_model_file(path: &Path) -> Result<GgufFile> {
    if crate::symb::is_symb_dir(path) {
        return crate::symb::open_symb_dir(path);
    }
    if path.is_dir() && path.join("config.json").is_file() {
        return open_hf_dir(path);
    }
    Ok(GgufFile::open(path)?)
}

fn has_weights(dir: &Path) -> bool {
    dir.join("model.safetensors").is_file() || dir.join("model.safetensors.index.json").is_file()
}

fn read_json(path: &Path) -> std::result::Result<Json, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", path.display()))
}

/// The directory's `config.json` with the fields the decoders need, whichever of
/// transformers' spellings the file uses.
struct Config<'a> {
    json: &'a Json,
    path: &'a Path,
}

impl Config<'_> {
    fn bad(&self, problem: impl Into<String>) -> ModelError {
        ModelError::BadHyperParameters {
            path: self.path.display().to_string(),
            problem: problem.into(),
        }
    }
    fn get(&self, key: &str) -> Option<&Json> {
        self.json.get(key).filter(|v| !v.is_null())
    }
    fn usize(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(|n| Some(n as usize))
                .ok_or_else(|| self.bad(format!("{key} is not a non-negative integer"))),
        }
    }
    fn required(&self, key: &str) -> Result<usize> {
        self.usize(key)?
            .ok_or_else(|| self.bad(format!("missing {key}")))
    }
    fn f64(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.bad(format!("{key} is not a number"))),
        }
    }
    fn str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Json::as_str)
    }
    /// RoPE settings: `rope_theta` and `rope_scaling` (transformers 4), or `rope_parameters`
    /// (transformers 5), which Gemma 3 splits by layer type.
    fn rope(&self, layer_type: &str) -> Result<(Option<f64>, Option<&Json>)> {
        if let Some(p) = self.get("rope_parameters") {
            let p = p.get(layer_type).unwrap_or(p);
            let theta = p.get("rope_theta").and_then(Json::as_f64);
            return Ok((theta, Some(p)));
        }
        Ok((self.f64("rope_theta")?, self.get("rope_scaling")))
    }
}

/// How a checkpoint's RoPE is scaled.
enum RopeScaling {
    None,
    Linear(f64),
    /// Llama 3.1: per-frequency factors.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_context: f64,
    },
}

fn rope_scaling(cfg: &Config, params: Option<&Json>) -> Result<RopeScaling> {
    let Some(p) = params else {
        return Ok(RopeScaling::None);
    };
    let kind = p
        .get("rope_type")
        .or_else(|| p.get("type"))
        .and_then(Json::as_str)
        .unwrap_or("default");
    let num = |k: &str, default: f64| p.get(k).and_then(Json::as_f64).unwrap_or(default);
    match kind {
        "default" => Ok(RopeScaling::None),
        "linear" => Ok(RopeScaling::Linear(num("factor", 1.0))),
        "llama3" => Ok(RopeScaling::Llama3 {
            factor: num("factor", 8.0),
            low_freq_factor: num("low_freq_factor", 1.0),
            high_freq_factor: num("high_freq_factor", 4.0),
            original_context: num("original_max_position_embeddings", 8192.0),
        }),
        other => Err(cfg.bad(format!("rope scaling '{other}' is not supported yet"))),
    }
}

/// Llama 3's per-frequency divisors of the rotation angle (`rope_freqs.weight`), one per pair
/// of the `n_rot` rotated dimensions, as `convert_hf_to_gguf.py` computes them.
fn llama3_rope_factors(
    base: f64,
    n_rot: usize,
    factor: f64,
    low: f64,
    high: f64,
    original: f64,
) -> Vec<f32> {
    let low_wavelen = original / low;
    let high_wavelen = original / high;
    (0..n_rot / 2)
        .map(|i| {
            let freq = 1.0 / (base as f32).powf((2 * i) as f32 / n_rot as f32);
            let wavelen = 2.0 * std::f64::consts::PI / freq as f64;
            if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor as f32
            } else {
                let smooth = (original / wavelen - low) / (high - low);
                (1.0 / ((1.0 - smooth) / factor + smooth)) as f32
            }
        })
        .collect()
}

/// The safetensors files of a directory, and which one holds each tensor.
struct Weights {
    files: Vec<SafetensorsFile>,
    /// Tensor name → (file, entry), in name order.
    entries: BTreeMap<String, (usize, StTensor)>,
}

fn open_weights(dir: &Path) -> Result<Weights> {
    let bad = |problem: String| ModelError::BadHyperParameters {
        path: dir.display().to_string(),
        problem,
    };
    let index_path = dir.join("model.safetensors.index.json");
    let mut names: Vec<PathBuf> = Vec::new();
    if index_path.is_file() {
        let index = read_json(&index_path).map_err(bad)?;
        let map = index
            .get("weight_map")
            .and_then(Json::as_object)
            .ok_or_else(|| bad("model.safetensors.index.json has no weight_map".into()))?;
        for file in map.values() {
            let file = file
                .as_str()
                .filter(|f| !f.contains('/') && !f.contains('\\') && !f.starts_with('.'))
                .ok_or_else(|| bad(format!("weight_map names an odd file {file}")))?;
            let p = dir.join(file);
            if !names.contains(&p) {
                names.push(p);
            }
        }
    } else {
        names.push(dir.join("model.safetensors"));
    }
    let mut files = Vec::with_capacity(names.len());
    let mut entries = BTreeMap::new();
    for (i, name) in names.iter().enumerate() {
        let file = SafetensorsFile::open(name)?;
        for t in file.tensors() {
            if entries.insert(t.name.clone(), (i, t.clone())).is_some() {
                return Err(bad(format!("tensor {} appears in two files", t.name)));
            }
        }
        files.push(file);
    }
    Ok(Weights { files, entries })
}

/// A transformers tensor name without the text model's prefix. Multimodal exports nest the
/// text model: `model.language_model.*` (transformers ≥ 4.52) or `language_model.model.*`.
fn without_model_prefix(hf: &str) -> &str {
    ["model.language_model.", "language_model.model.", "model."]
        .iter()
        .find_map(|p| hf.strip_prefix(p))
        .or_else(|| hf.strip_prefix("language_model."))
        .unwrap_or(hf)
}

/// A GGUF tensor name for a transformers one, or `None` for a name the architecture lacks.
/// `gemma` names Gemma's four norms of a block.
fn gguf_name(hf: &str, gemma: bool) -> Option<String> {
    let name = without_model_prefix(hf);
    match name {
        "embed_tokens.weight" => return Some("token_embd.weight".into()),
        "norm.weight" => return Some("output_norm.weight".into()),
        "lm_head.weight" => return Some("output.weight".into()),
        _ => {}
    }
    let rest = name.strip_prefix("layers.")?;
    let (layer, part) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (module, kind) = part.rsplit_once('.')?;
    if kind != "weight" && kind != "bias" {
        return None;
    }
    let gguf = match module {
        "input_layernorm" => "attn_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "self_attn.q_norm" => "attn_q_norm",
        "self_attn.k_norm" => "attn_k_norm",
        "post_attention_layernorm" if gemma => "post_attention_norm",
        "post_attention_layernorm" => "ffn_norm",
        "pre_feedforward_layernorm" if gemma => "ffn_norm",
        "post_feedforward_layernorm" if gemma => "post_ffw_norm",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        "mlp.shared_expert.gate_proj" => "ffn_gate_shexp",
        "mlp.shared_expert.up_proj" => "ffn_up_shexp",
        "mlp.shared_expert.down_proj" => "ffn_down_shexp",
        "mlp.shared_expert_gate" => "ffn_gate_inp_shexp",
        _ => return None,
    };
    Some(format!("blk.{layer}.{gguf}.{kind}"))
}

fn dtype_of(t: &StDType) -> Option<DType> {
    match t {
        StDType::F32 => Some(DType::F32),
        StDType::F16 => Some(DType::F16),
        StDType::BF16 => Some(DType::BF16),
        _ => None,
    }
}

/// Values of an F32, F16 or BF16 tensor's bytes.
fn to_f32(dtype: DType, bytes: &[u8]) -> Vec<f32> {
    match dtype {
        DType::F16 => bytes
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        DType::BF16 => bytes
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        _ => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
    }
}

fn f32_blob(values: &[f32]) -> Blob {
    Blob::from_vec(values.iter().flat_map(|v| v.to_le_bytes()).collect())
}

/// Reorders a q or k projection's rows within each head from transformers' rotate-half pairs
/// (`i`, `i + d/2`) to GGUF's adjacent pairs (`2i`, `2i + 1`): new row `h·d + 2i + j` is old
/// row `h·d + j·d/2 + i`. `row_bytes` is one row (a bias has rows of one element).
pub(crate) fn permute_rotary_rows(
    bytes: &[u8],
    n_heads: usize,
    row_bytes: usize,
) -> Option<Vec<u8>> {
    let rows = bytes.len() / row_bytes.max(1);
    if row_bytes == 0
        || n_heads == 0
        || !rows.is_multiple_of(n_heads)
        || !(rows / n_heads).is_multiple_of(2)
    {
        return None;
    }
    let head = rows / n_heads;
    let half = head / 2;
    let mut out = Vec::with_capacity(bytes.len());
    for h in 0..n_heads {
        for i in 0..half {
            for j in 0..2 {
                let old = h * head + j * half + i;
                out.extend_from_slice(&bytes[old * row_bytes..(old + 1) * row_bytes]);
            }
        }
    }
    Some(out)
}

/// The text model's part of a config: Gemma 3's multimodal exports keep it in `text_config`.
fn text_config(json: &Json) -> &Json {
    json.get("text_config")
        .filter(|t| t.is_object())
        .unwrap_or(json)
}

/// Presents a Hugging Face LLM directory as a GGUF file (see the module's notes).
pub fn open_hf_dir(dir: &Path) -> Result<GgufFile> {
    let config_path = dir.join("config.json");
    let root = read_json(&config_path).map_err(|problem| ModelError::BadHyperParameters {
        path: dir.display().to_string(),
        problem,
    })?;
    let json = text_config(&root);
    let cfg = Config {
        json,
        path: &config_path,
    };
    let model_type = root
        .get("model_type")
        .and_then(Json::as_str)
        .ok_or_else(|| cfg.bad("missing model_type"))?;
    let arch = HF_MODEL_TYPES
        .iter()
        .find(|(k, _)| *k == model_type)
        .map(|(_, a)| *a)
        .ok_or_else(|| ModelError::UnsupportedArchitecture {
            path: dir.display().to_string(),
            arch: model_type.to_string(),
        })?;
    let gemma = arch == "gemma3";
    let bad_weights = |problem: String| ModelError::BadHyperParameters {
        path: dir.display().to_string(),
        problem,
    };
    if !has_weights(dir) {
        return Err(cfg.bad("no model.safetensors or model.safetensors.index.json beside it"));
    }

    let n_embd = cfg.required("hidden_size")?;
    let n_head = cfg.required("num_attention_heads")?;
    let n_head_kv = cfg.usize("num_key_value_heads")?.unwrap_or(n_head);
    let n_layer = cfg.required("num_hidden_layers")?;
    let n_ff = cfg.required("intermediate_size")?;
    if n_head == 0 || n_embd == 0 {
        return Err(cfg.bad("hidden_size and num_attention_heads must be positive"));
    }
    let head_dim = cfg.usize("head_dim")?.unwrap_or(n_embd / n_head);
    let n_rot = match cfg.f64("partial_rotary_factor")? {
        Some(f) if f > 0.0 && f < 1.0 => (head_dim as f64 * f) as usize,
        _ => head_dim,
    };
    let act = cfg
        .str("hidden_act")
        .or_else(|| cfg.str("hidden_activation"))
        .unwrap_or(if gemma { "gelu_pytorch_tanh" } else { "silu" });
    let expected_act = if gemma { "gelu_pytorch_tanh" } else { "silu" };
    if act != expected_act {
        return Err(cfg.bad(format!(
            "hidden activation '{act}' is not supported for {model_type} (expected {expected_act})"
        )));
    }
    let full_layer = if gemma { "full_attention" } else { "" };
    let (theta, rope_params) = cfg.rope(full_layer)?;
    let scaling = rope_scaling(&cfg, rope_params)?;
    let rope_base = theta.unwrap_or(10000.0);

    let key = |k: &str| format!("{arch}.{k}");
    let mut meta: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String(arch.into())),
        (
            "general.name".into(),
            Value::String(
                root.get("_name_or_path")
                    .or_else(|| root.get("_model_name_or_path"))
                    .and_then(Json::as_str)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .or_else(|| dir.file_name().map(|n| n.to_string_lossy().into_owned()))
                    .unwrap_or_else(|| arch.to_string()),
            ),
        ),
    ];
    let put_u32 = |meta: &mut Vec<(String, Value)>, k: &str, v: usize| -> Result<()> {
        let v = u32::try_from(v).map_err(|_| cfg.bad(format!("{k} = {v} is too large")))?;
        meta.push((key(k), Value::U32(v)));
        Ok(())
    };
    if let Some(ctx) = cfg.usize("max_position_embeddings")? {
        put_u32(&mut meta, "context_length", ctx)?;
    }
    put_u32(&mut meta, "embedding_length", n_embd)?;
    put_u32(&mut meta, "block_count", n_layer)?;
    put_u32(&mut meta, "feed_forward_length", n_ff)?;
    put_u32(&mut meta, "attention.head_count", n_head)?;
    put_u32(&mut meta, "attention.head_count_kv", n_head_kv)?;
    put_u32(&mut meta, "attention.key_length", head_dim)?;
    put_u32(&mut meta, "attention.value_length", head_dim)?;
    put_u32(&mut meta, "rope.dimension_count", n_rot)?;
    meta.push((key("rope.freq_base"), Value::F32(rope_base as f32)));
    let eps = cfg
        .f64("rms_norm_eps")?
        .ok_or_else(|| cfg.bad("missing rms_norm_eps"))?;
    meta.push((
        key("attention.layer_norm_rms_epsilon"),
        Value::F32(eps as f32),
    ));
    if let RopeScaling::Linear(f) = scaling {
        meta.push((key("rope.scaling.type"), Value::String("linear".into())));
        meta.push((key("rope.scaling.factor"), Value::F32(f as f32)));
    }
    if gemma {
        gemma3_keys(&cfg, n_layer, head_dim, &mut meta)?;
    }
    let n_expert = moe_keys(&cfg, model_type, arch, &mut meta)?;

    let weights = open_weights(dir)?;
    let tied = json
        .get("tie_word_embeddings")
        .or_else(|| root.get("tie_word_embeddings"))
        .and_then(Json::as_bool)
        // transformers' default for every architecture here.
        .unwrap_or(true);
    let mut tensors: Vec<(String, DType, Shape, Blob)> = Vec::new();
    let mut layer_experts: BTreeMap<usize, LayerExperts> = BTreeMap::new();
    for (hf_name, (file, t)) in &weights.entries {
        if n_expert > 0 {
            if let Some((layer, part)) = expert_part(without_model_prefix(hf_name)) {
                let dtype = dtype_of(&t.dtype).ok_or_else(|| {
                    bad_weights(format!(
                        "tensor {hf_name} is {}; synaptix reads F32, F16 and BF16 checkpoints",
                        t.dtype.name()
                    ))
                })?;
                let piece = Piece {
                    dtype,
                    shape: t.shape.clone(),
                    blob: weights.files[*file].blob(t),
                };
                layer_experts
                    .entry(layer)
                    .or_default()
                    .add(part, piece)
                    .map_err(|p| bad_weights(format!("layer {layer}: {p}")))?;
                continue;
            }
        }
        // Buffers older exports saved beside the weights; the model recomputes them.
        if hf_name.ends_with("rotary_emb.inv_freq") {
            continue;
        }
        let Some(name) = gguf_name(hf_name, gemma) else {
            // A multimodal export's vision tower and projector are not the text model's.
            if gemma && (hf_name.contains("vision_tower") || hf_name.contains("multi_modal")) {
                continue;
            }
            return Err(bad_weights(format!(
                "tensor {hf_name} is not part of a {model_type} model as synaptix knows it"
            )));
        };
        if name == "output.weight" && tied {
            continue;
        }
        let dtype = dtype_of(&t.dtype).ok_or_else(|| {
            bad_weights(format!(
                "tensor {hf_name} is {}; synaptix reads F32, F16 and BF16 checkpoints",
                t.dtype.name()
            ))
        })?;
        let file = &weights.files[*file];
        let mut shape = Shape::new(t.shape.clone());
        let mut blob = file.blob(t);
        if name.ends_with("ffn_gate_inp_shexp.weight") {
            // `[1, d]` in transformers, a vector in GGUF.
            let values = to_f32(dtype, blob.as_bytes());
            shape = Shape::new(vec![values.len()]);
            blob = f32_blob(&values);
            tensors.push((name, DType::F32, shape, blob));
            continue;
        }
        let rotary = if name.contains(".attn_q.") {
            Some(n_head)
        } else if name.contains(".attn_k.") {
            Some(n_head_kv)
        } else {
            None
        };
        let (dtype, blob) = match (t.shape.len(), rotary) {
            // llama.cpp's `llama` graph pairs adjacent dimensions; transformers rotates halves.
            (_, Some(heads)) if arch == "llama" => {
                let row = if t.shape.len() == 2 {
                    t.shape[1] * dtype.block_bytes()
                } else {
                    dtype.block_bytes()
                };
                let permuted =
                    permute_rotary_rows(blob.as_bytes(), heads, row).ok_or_else(|| {
                        bad_weights(format!("{hf_name}: rows do not split into heads"))
                    })?;
                if t.shape.len() == 1 {
                    (DType::F32, f32_blob(&to_f32(dtype, &permuted)))
                } else {
                    (dtype, Blob::from_vec(permuted))
                }
            }
            (1, _) => {
                let mut v = to_f32(dtype, blob.as_bytes());
                if gemma && name.ends_with("norm.weight") {
                    // Gemma's RMSNorm scales by 1 + w; GGUF stores the sum.
                    v.iter_mut().for_each(|x| *x += 1.0);
                }
                (DType::F32, f32_blob(&v))
            }
            _ => (dtype, blob),
        };
        tensors.push((name, dtype, shape, blob));
    }
    for (layer, experts) in layer_experts {
        tensors.extend(
            experts
                .assemble(layer, n_expert)
                .map_err(|p| bad_weights(format!("layer {layer}'s experts: {p}")))?,
        );
    }
    if let RopeScaling::Llama3 {
        factor,
        low_freq_factor,
        high_freq_factor,
        original_context,
    } = scaling
    {
        if arch != "llama" {
            return Err(cfg.bad("llama3 rope scaling on a model that is not Llama"));
        }
        let factors = llama3_rope_factors(
            rope_base,
            n_rot,
            factor,
            low_freq_factor,
            high_freq_factor,
            original_context,
        );
        tensors.push((
            "rope_freqs.weight".into(),
            DType::F32,
            Shape::new(vec![factors.len()]),
            f32_blob(&factors),
        ));
    }
    // llama.cpp's file type: what most matrix elements are stored as (0 F32, 1 F16, 32 BF16).
    let mut elements = [0u64; 3];
    for (_, dtype, shape, _) in tensors.iter().filter(|t| t.2.dims().len() >= 2) {
        let n: u64 = shape.dims().iter().map(|&d| d as u64).product();
        match dtype {
            DType::F16 => elements[1] += n,
            DType::BF16 => elements[2] += n,
            _ => elements[0] += n,
        }
    }
    let most = (0..3).max_by_key(|&i| elements[i]).unwrap_or(0);
    meta.push(("general.file_type".into(), Value::U32([0, 1, 32][most])));
    let n_vocab = tensors
        .iter()
        .find(|t| t.0 == "token_embd.weight")
        .and_then(|t| t.2.dims().first().copied())
        .unwrap_or(0);
    tokenizer_keys(dir, n_vocab, &mut meta)?;
    Ok(GgufFile::assembled(
        dir.to_path_buf(),
        "safetensors (Hugging Face)",
        meta,
        tensors,
    )?)
}

/// The mixture-of-experts keys of Mixtral and Qwen3-MoE (none for dense models); returns the
/// number of experts (0 for dense).
fn moe_keys(
    cfg: &Config,
    model_type: &str,
    arch: &str,
    meta: &mut Vec<(String, Value)>,
) -> Result<usize> {
    // transformers 5 writes num_local_experts for both; Qwen's own configs say num_experts.
    let experts = || -> Result<usize> {
        match cfg.usize("num_local_experts")? {
            Some(n) => Ok(n),
            None => cfg.required("num_experts"),
        }
    };
    let (n_expert, width, normalize) = match model_type {
        // Mixtral's experts are intermediate_size wide, and its router renormalises.
        "mixtral" => (experts()?, None, true),
        "qwen3_moe" | "qwen2_moe" => {
            if cfg.usize("decoder_sparse_step")?.unwrap_or(1) != 1
                || cfg
                    .get("mlp_only_layers")
                    .and_then(Json::as_array)
                    .is_some_and(|l| !l.is_empty())
            {
                return Err(cfg.bad(
                    "dense layers between the expert layers (decoder_sparse_step, \
                     mlp_only_layers) are not supported yet",
                ));
            }
            let normalize = cfg
                .get("norm_topk_prob")
                .and_then(Json::as_bool)
                .unwrap_or(false);
            (
                experts()?,
                Some(cfg.required("moe_intermediate_size")?),
                normalize,
            )
        }
        _ => return Ok(0),
    };
    let used = cfg.required("num_experts_per_tok")?;
    if n_expert == 0 || used == 0 || used > n_expert {
        return Err(cfg.bad(format!("{used} experts per token out of {n_expert}")));
    }
    let u32_of = |v: usize| u32::try_from(v).map_err(|_| cfg.bad("expert counts too large"));
    meta.push((
        format!("{arch}.expert_count"),
        Value::U32(u32_of(n_expert)?),
    ));
    meta.push((
        format!("{arch}.expert_used_count"),
        Value::U32(u32_of(used)?),
    ));
    if let Some(w) = width {
        meta.push((
            format!("{arch}.expert_feed_forward_length"),
            Value::U32(u32_of(w)?),
        ));
    }
    if model_type == "qwen2_moe" {
        let shared = cfg.required("shared_expert_intermediate_size")?;
        meta.push((
            format!("{arch}.expert_shared_feed_forward_length"),
            Value::U32(u32_of(shared)?),
        ));
    }
    meta.push((
        format!("{arch}.expert_weights_norm"),
        Value::Bool(normalize),
    ));
    Ok(n_expert)
}

/// Gemma 3's own keys: sliding window, which layers slide, the local RoPE base.
fn gemma3_keys(
    cfg: &Config,
    n_layer: usize,
    head_dim: usize,
    meta: &mut Vec<(String, Value)>,
) -> Result<()> {
    if let Some(s) = cfg.f64("query_pre_attn_scalar")? {
        if s != head_dim as f64 {
            return Err(cfg.bad(format!(
                "query_pre_attn_scalar {s} differs from head_dim {head_dim} (not supported yet)"
            )));
        }
    }
    if cfg.f64("attn_logit_softcapping")?.is_some() {
        return Err(cfg.bad("attention logit soft-capping is not supported"));
    }
    if let Some(c) = cfg.f64("final_logit_softcapping")? {
        meta.push((
            "gemma3.final_logit_softcapping".into(),
            Value::F32(c as f32),
        ));
    }
    if let Some(w) = cfg.usize("sliding_window")? {
        let w = u32::try_from(w).map_err(|_| cfg.bad("sliding_window is too large"))?;
        meta.push(("gemma3.attention.sliding_window".into(), Value::U32(w)));
    }
    // Which layers slide: `layer_types` (newer exports), else a period in which the last
    // layer is global.
    let sliding: Vec<bool> = if let Some(types) = cfg.get("layer_types").and_then(Json::as_array) {
        if types.len() != n_layer {
            return Err(cfg.bad(format!(
                "layer_types has {} entries for {n_layer} layers",
                types.len()
            )));
        }
        types
            .iter()
            .map(|t| t.as_str() == Some("sliding_attention"))
            .collect()
    } else {
        let period = cfg
            .usize("sliding_window_pattern")?
            .or(cfg.usize("_sliding_window_pattern")?)
            .unwrap_or(6)
            .max(1);
        (0..n_layer).map(|il| il % period < period - 1).collect()
    };
    meta.push((
        "gemma3.attention.sliding_window_pattern".into(),
        Value::Array(
            synaptix_bundle::ValueType::Bool,
            sliding.into_iter().map(Value::Bool).collect(),
        ),
    ));
    let local_base = match cfg.rope("sliding_attention")? {
        (Some(theta), Some(_)) if cfg.get("rope_parameters").is_some() => Some(theta),
        _ => cfg.f64("rope_local_base_freq")?,
    };
    if let Some(b) = local_base {
        meta.push(("gemma3.rope.freq_base_swa".into(), Value::F32(b as f32)));
    }
    Ok(())
}

/// `tokenizer.json` whole, with BOS/EOS ids and the chat template, and for byte-level BPE
/// tokenizers llama.cpp's vocabulary keys too (for `n_vocab` ids), so that a GGUF written from
/// the model works in llama.cpp.
pub(crate) fn tokenizer_keys(
    dir: &Path,
    n_vocab: usize,
    meta: &mut Vec<(String, Value)>,
) -> Result<()> {
    let bad = |problem: String| ModelError::BadHyperParameters {
        path: dir.display().to_string(),
        problem,
    };
    let tok_path = dir.join("tokenizer.json");
    let raw = std::fs::read_to_string(&tok_path).map_err(|e| {
        bad(format!(
            "tokenizer.json: {e} (the tokenizer travels beside the weights)"
        ))
    })?;
    let tok: Json = serde_json::from_str(&raw).map_err(|e| bad(format!("tokenizer.json: {e}")))?;
    let config = read_json(&dir.join("tokenizer_config.json")).ok();
    // A token's id: added tokens first, then the model's vocabulary.
    let id_of = |text: &str| -> Option<u64> {
        tok.get("added_tokens")
            .and_then(Json::as_array)
            .into_iter()
            .flatten()
            .find(|t| t.get("content").and_then(Json::as_str) == Some(text))
            .and_then(|t| t.get("id").and_then(Json::as_u64))
            .or_else(|| {
                tok.pointer("/model/vocab")
                    .and_then(|v| v.get(text))
                    .and_then(Json::as_u64)
            })
    };
    let token = |key: &str| -> Option<u64> {
        let v = config.as_ref()?.get(key)?;
        let text = v
            .as_str()
            .or_else(|| v.get("content").and_then(Json::as_str))?;
        id_of(text)
    };
    for (key, gguf) in [
        ("bos_token", "tokenizer.ggml.bos_token_id"),
        ("eos_token", "tokenizer.ggml.eos_token_id"),
    ] {
        if let Some(id) = token(key).and_then(|id| u32::try_from(id).ok()) {
            meta.push((gguf.into(), Value::U32(id)));
        }
    }
    let template = config
        .as_ref()
        .and_then(|c| c.get("chat_template"))
        .and_then(|t| match t {
            Json::String(s) => Some(s.clone()),
            Json::Array(list) => list
                .iter()
                .find(|t| t.get("name").and_then(Json::as_str) == Some("default"))
                .and_then(|t| t.get("template").and_then(Json::as_str))
                .map(str::to_string),
            _ => None,
        })
        .or_else(|| std::fs::read_to_string(dir.join("chat_template.jinja")).ok());
    if let Some(t) = template {
        meta.push(("tokenizer.chat_template".into(), Value::String(t)));
    }
    if let Some(keys) = synaptix_tokenizer::gguf_vocab_keys(&raw, n_vocab) {
        meta.extend(keys);
    }
    meta.push((synaptix_tokenizer::KEY_HF_JSON.into(), Value::String(raw)));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotary_rows_move_from_halves_to_pairs() {
        // One head of 4 rows (one byte each): halves (0, 1 | 2, 3) pair as 0,2,1,3.
        let out = permute_rotary_rows(&[0, 1, 2, 3, 10, 11, 12, 13], 2, 1).unwrap();
        assert_eq!(out, vec![0, 2, 1, 3, 10, 12, 11, 13]);
        assert!(permute_rotary_rows(&[0, 1, 2], 1, 1).is_none());
    }

    #[test]
    fn names_map_to_gguf() {
        assert_eq!(
            gguf_name("model.layers.3.self_attn.o_proj.weight", false).as_deref(),
            Some("blk.3.attn_output.weight")
        );
        assert_eq!(
            gguf_name("model.layers.0.post_attention_layernorm.weight", false).as_deref(),
            Some("blk.0.ffn_norm.weight")
        );
        assert_eq!(
            gguf_name("model.layers.0.post_attention_layernorm.weight", true).as_deref(),
            Some("blk.0.post_attention_norm.weight")
        );
        assert_eq!(
            gguf_name(
                "language_model.model.layers.1.pre_feedforward_layernorm.weight",
                true
            )
            .as_deref(),
            Some("blk.1.ffn_norm.weight")
        );
        assert_eq!(
            gguf_name("model.layers.0.mlp.experts.0.weight", false),
            None
        );
    }

    #[test]
    fn llama3_factors_follow_the_wavelength_bands() {
        // Llama 3.1 8B's settings: the fastest frequencies keep factor 1, the slowest get 8.
        let f = llama3_rope_factors(500000.0, 128, 8.0, 1.0, 4.0, 8192.0);
        assert_eq!(f.len(), 64);
        assert_eq!(f[0], 1.0);
        assert_eq!(f[63], 8.0);
        assert!(f.windows(2).all(|w| w[0] <= w[1]));
    }
}
