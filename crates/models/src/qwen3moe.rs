//! Qwen3-MoE: the Qwen3 block (per-head QK-norm, NeoX RoPE, no biases) with a mixture of
//! SwiGLU experts in place of the MLP (`qwen3moe.expert_count` experts of
//! `expert_feed_forward_length`, `expert_used_count` per token, softmax routing with the chosen
//! weights renormalised). Mirrors llama.cpp's `qwen3moe` graph (src/models/qwen3moe.cpp).

use synaptix_nn::{Backend, RopeStyle, VarBuilder};

use crate::llama::PreNormDecoder;
use crate::{ModelError, ModelInfo, Result};

pub fn load<B: Backend>(be: B, vb: &VarBuilder, info: ModelInfo) -> Result<PreNormDecoder<B>> {
    if info.hparams.n_expert == 0 {
        return Err(ModelError::BadHyperParameters {
            path: info.name.clone(),
            problem: "a qwen3moe file without qwen3moe.expert_count".into(),
        });
    }
    PreNormDecoder::load(be, vb, info, RopeStyle::Neox, true)
}
