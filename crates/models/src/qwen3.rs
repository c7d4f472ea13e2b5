//! Qwen3 (dense): the Llama block with per-head RMSNorm on q and k before RoPE (NeoX pairing)
//! and no biases. Mirrors llama.cpp's `qwen3` graph (src/models/qwen3.cpp).

use synaptix_nn::{Backend, RopeStyle, VarBuilder};

use crate::llama::PreNormDecoder;
use crate::{ModelInfo, Result};

pub fn load<B: Backend>(be: B, vb: &VarBuilder, info: ModelInfo) -> Result<PreNormDecoder<B>> {
    PreNormDecoder::load(be, vb, info, RopeStyle::Neox, true)
}
