//! Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): the Qwen2 block (q/k/v biases, NeoX RoPE) with a
//! mixture of SwiGLU experts (top-k of the softmax, not renormalised) plus a shared expert
//! scaled by `sigmoid(x · ffn_gate_inp_shexp)`. Mirrors llama.cpp's `qwen2moe` graph
//! (src/models/qwen2moe.cpp).

use synaptix_nn::{Backend, RopeStyle, VarBuilder};

use crate::llama::PreNormDecoder;
use crate::{ModelError, ModelInfo, Result};

pub fn load<B: Backend>(be: B, vb: &VarBuilder, info: ModelInfo) -> Result<PreNormDecoder<B>> {
    if info.hparams.n_expert == 0 || info.hparams.n_ff_shexp == 0 {
        return Err(ModelError::BadHyperParameters {
            path: info.name.clone(),
            problem: "a qwen2moe file needs qwen2moe.expert_count and \
                      expert_shared_feed_forward_length"
                .into(),
        });
    }
    PreNormDecoder::load(be, vb, info, RopeStyle::Neox, false)
}
