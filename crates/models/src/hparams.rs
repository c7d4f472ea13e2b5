use synaptix_bundle::GgufFile;

use crate::{ModelError, Result};

/// Hyper-parameters shared by the decoder-only architectures, read from `{arch}.*` keys.
#[derive(Debug, Clone, PartialEq)]
pub struct HParams {
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Dimensions rotated by RoPE (≤ `head_dim`).
    pub n_rot: usize,
    pub rope_freq_base: f32,
    /// `1 / rope.scaling.factor` (1 without scaling).
    pub rope_freq_scale: f32,
    pub rms_eps: f32,
    /// Sliding-window length, where the architecture has windowed layers.
    pub sliding_window: Option<usize>,
    /// Mixture-of-experts feed-forward layers: experts per layer (0: dense layers).
    pub n_expert: usize,
    /// Experts each token uses.
    pub n_expert_used: usize,
    /// One expert's hidden width (`expert_feed_forward_length`, else `n_ff`).
    pub n_ff_exp: usize,
    /// Whether the chosen experts' weights are divided by their sum.
    pub expert_weights_norm: bool,
    /// The shared expert's hidden width (`expert_shared_feed_forward_length`; 0: none).
    pub n_ff_shexp: usize,
}

/// Limits that keep hostile metadata from requesting absurd allocations.
const MAX_LAYERS: u64 = 1024;
const MAX_HEADS: u64 = 4096;
const MAX_HEAD_DIM: u64 = 4096;
const MAX_WIDTH: u64 = 1 << 20;
const MAX_EXPERTS: u64 = 1024;

impl HParams {
    pub fn from_gguf(file: &GgufFile, arch: &str) -> Result<HParams> {
        let path = file.path().display().to_string();
        let bad = |problem: String| ModelError::BadHyperParameters {
            path: path.clone(),
            problem,
        };
        let key = |k: &str| format!("{arch}.{k}");
        let required = |k: &str, max: u64| -> Result<usize> {
            let name = key(k);
            if let Some(v) = file.get(&name) {
                if v.as_array().is_some() {
                    return Err(bad(format!(
                        "{name}: per-layer arrays are not supported yet"
                    )));
                }
            }
            let v = file
                .get_u64(&name)?
                .ok_or_else(|| bad(format!("missing {name}")))?;
            if v == 0 || v > max {
                return Err(bad(format!("{name} = {v} is outside 1..={max}")));
            }
            Ok(v as usize)
        };
        let n_embd = required("embedding_length", MAX_WIDTH)?;
        let n_head = required("attention.head_count", MAX_HEADS)?;
        let n_head_kv = match file.get(&key("attention.head_count_kv")) {
            Some(_) => required("attention.head_count_kv", MAX_HEADS)?,
            None => n_head,
        };
        if n_head % n_head_kv != 0 {
            return Err(bad(format!(
                "head_count {n_head} is not a multiple of head_count_kv {n_head_kv}"
            )));
        }
        let head_dim = match file.get(&key("attention.key_length")) {
            Some(_) => required("attention.key_length", MAX_HEAD_DIM)?,
            None => n_embd / n_head,
        };
        if let Some(v) = file.get_u64(&key("attention.value_length"))? {
            if v as usize != head_dim {
                return Err(bad(format!(
                    "value_length {v} differs from key_length {head_dim} (not supported)"
                )));
            }
        }
        let n_rot = match file.get(&key("rope.dimension_count")) {
            Some(_) => required("rope.dimension_count", MAX_HEAD_DIM)?,
            None => head_dim,
        };
        if n_rot > head_dim || n_rot % 2 != 0 {
            return Err(bad(format!(
                "rope.dimension_count {n_rot} must be even and at most the head size {head_dim}"
            )));
        }
        let scaling_factor = match file.get_f64(&key("rope.scaling.factor"))? {
            Some(f) => Some(f),
            None => file.get_f64(&key("rope.scale_linear"))?,
        };
        if let Some(t) = file.get_str(&key("rope.scaling.type"))? {
            if t != "linear" && t != "none" {
                return Err(bad(format!("rope scaling type '{t}' is not supported yet")));
            }
        }
        let rope_freq_scale = match scaling_factor {
            Some(f) if f > 0.0 => (1.0 / f) as f32,
            _ => 1.0,
        };
        let rope_freq_base = file.get_f64(&key("rope.freq_base"))?.unwrap_or(10000.0) as f32;
        let rms_eps = file
            .get_f64(&key("attention.layer_norm_rms_epsilon"))?
            .ok_or_else(|| {
                bad(format!(
                    "missing {}",
                    key("attention.layer_norm_rms_epsilon")
                ))
            })? as f32;
        let valid = rope_freq_base > 0.0 && rope_freq_base.is_finite() && rms_eps >= 0.0;
        if !valid {
            return Err(bad(
                "rope.freq_base or the norm epsilon is not a positive number".into(),
            ));
        }
        let sliding_window = match file.get_u64(&key("attention.sliding_window"))? {
            Some(0) | None => None,
            Some(w) => Some(w as usize),
        };
        let embd = file
            .tensor_info("token_embd.weight")
            .ok_or_else(|| bad("missing tensor token_embd.weight".into()))?;
        let n_vocab = embd.shape.dims().first().copied().unwrap_or(0);
        if n_vocab == 0 {
            return Err(bad("token_embd.weight has an empty vocabulary".into()));
        }
        let n_ff = required("feed_forward_length", MAX_WIDTH)?;
        let (n_expert, n_expert_used, n_ff_exp) = match file.get(&key("expert_count")) {
            Some(_) => {
                let n_expert = required("expert_count", MAX_EXPERTS)?;
                let used = required("expert_used_count", MAX_EXPERTS)?;
                if used > n_expert {
                    return Err(bad(format!(
                        "expert_used_count {used} exceeds expert_count {n_expert}"
                    )));
                }
                let width = match file.get(&key("expert_feed_forward_length")) {
                    Some(_) => required("expert_feed_forward_length", MAX_WIDTH)?,
                    None => n_ff,
                };
                (n_expert, used, width)
            }
            None => (0, 0, n_ff),
        };
        Ok(HParams {
            n_vocab,
            n_ctx_train: file
                .get_u64(&key("context_length"))?
                .unwrap_or(4096)
                .min(1 << 24) as usize,
            n_embd,
            n_layer: required("block_count", MAX_LAYERS)?,
            n_ff,
            n_head,
            n_head_kv,
            head_dim,
            n_rot,
            rope_freq_base,
            rope_freq_scale,
            rms_eps,
            sliding_window,
            n_expert,
            n_expert_used,
            n_ff_exp,
            // llama.cpp renormalises the chosen experts' weights for Mixtral and Qwen3-MoE, not
            // for Qwen2-MoE.
            expert_weights_norm: file
                .get_bool(&key("expert_weights_norm"))?
                .unwrap_or(arch != "qwen2moe"),
            n_ff_shexp: match file.get(&key("expert_shared_feed_forward_length")) {
                Some(_) => required("expert_shared_feed_forward_length", MAX_WIDTH)?,
                None => 0,
            },
        })
    }

    /// `(n_kv_heads, head_dim)` for every layer, for [`synaptix_nn::KvCache::new`].
    pub fn kv_layout(&self) -> Vec<(usize, usize)> {
        vec![(self.n_head_kv, self.head_dim); self.n_layer]
    }
}
