//! Qwen2 / Qwen2.5: the Llama block with biases on q, k and v (read from the file) and
//! NeoX-paired RoPE. Mirrors llama.cpp's `qwen2` graph (src/models/qwen2.cpp).

use synaptix_nn::{Backend, RopeStyle, VarBuilder};

use crate::llama::PreNormDecoder;
use crate::{ModelInfo, Result};

pub fn load<B: Backend>(be: B, vb: &VarBuilder, info: ModelInfo) -> Result<PreNormDecoder<B>> {
    for i in 0..info.hparams.n_layer {
        let blk = vb.pp("blk").pp(i);
        for name in ["attn_q.bias", "attn_k.bias", "attn_v.bias"] {
            blk.get(name)?;
        }
    }
    PreNormDecoder::load(be, vb, info, RopeStyle::Neox, false)
}
