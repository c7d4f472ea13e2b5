//! Llama 2/3, Mistral, TinyLlama, Mixtral: pre-norm blocks, SwiGLU (or a mixture of SwiGLU
//! experts when the file has `llama.expert_count`), RoPE in the original (GPT-J) pairing,
//! optional per-frequency RoPE factors (`rope_freqs.weight`, Llama 3.1).
//! Mirrors llama.cpp's `llama` graph (src/models/llama.cpp).
//!
//! [`PreNormDecoder`] is also the body of Qwen2, Qwen3 and Qwen3-MoE, which differ only in
//! options.

use synaptix_nn::{
    Activation, AttentionSpec, Backend, Ffn, GatedMlp, MoeMlp, PreNormBlock, RmsNorm, Rope,
    RopeStyle, SelfAttention, SelfAttentionConfig, Tap, VarBuilder,
};

use crate::decoder::{Decoder, Layers, Trunk};
use crate::{ModelInfo, Result};

/// Loads a Llama-family file.
pub fn load<B: Backend>(be: B, vb: &VarBuilder, info: ModelInfo) -> Result<PreNormDecoder<B>> {
    PreNormDecoder::load(be, vb, info, RopeStyle::Normal, false)
}

/// A decoder of standard pre-norm blocks `blk.{i}`: RMSNorm, GQA self-attention (q/k/v biases
/// when the file has them, optional per-head QK-norm), RMSNorm, SwiGLU MLP.
pub type PreNormDecoder<B> = Decoder<B, Vec<PreNormBlock<B>>>;

impl<B: Backend> Layers<B> for Vec<PreNormBlock<B>> {
    fn forward(
        &self,
        be: &B,
        il: usize,
        x: &mut B::Tensor,
        pos: &B::Positions,
        kv: &mut B::Kv,
        tap: &mut dyn Tap,
    ) -> Result<()> {
        Ok(self[il].forward(be, x, pos, kv, &format!("blk.{il}"), tap)?)
    }
}

impl<B: Backend> PreNormDecoder<B> {
    pub fn load(
        be: B,
        vb: &VarBuilder,
        info: ModelInfo,
        rope_style: RopeStyle,
        qk_norm: bool,
    ) -> Result<Self> {
        let hp = &info.hparams;
        let freq_factors = match vb.get_opt("rope_freqs.weight")? {
            Some(w) => {
                w.expect_shape(&[hp.n_rot / 2])?;
                Some(w.to_f32()?)
            }
            None => None,
        };
        let cfg = SelfAttentionConfig {
            dim: hp.n_embd,
            spec: AttentionSpec {
                n_heads: hp.n_head,
                n_kv_heads: hp.n_head_kv,
                head_dim: hp.head_dim,
                scale: 1.0 / (hp.head_dim as f32).sqrt(),
                window: None,
            },
            rope: Rope {
                n_rot: hp.n_rot,
                base: hp.rope_freq_base,
                freq_scale: hp.rope_freq_scale,
                style: rope_style,
                freq_factors,
            },
            qk_norm_eps: qk_norm.then_some(hp.rms_eps),
            q_scale: None,
        };
        let blocks = (0..hp.n_layer)
            .map(|i| {
                let vb = vb.pp("blk").pp(i);
                Ok(PreNormBlock {
                    attn_norm: RmsNorm::load(&be, &vb, "attn_norm", hp.n_embd, hp.rms_eps)?,
                    attn: SelfAttention::load(&be, &vb, &cfg)?,
                    ffn_norm: RmsNorm::load(&be, &vb, "ffn_norm", hp.n_embd, hp.rms_eps)?,
                    ffn: if hp.n_expert > 0 {
                        Ffn::Moe(MoeMlp::load(
                            &be,
                            &vb,
                            hp.n_embd,
                            hp.n_ff_exp,
                            hp.n_expert,
                            hp.n_expert_used,
                            hp.expert_weights_norm,
                            Activation::Silu,
                            (hp.n_ff_shexp > 0).then_some(hp.n_ff_shexp),
                        )?)
                    } else {
                        Ffn::Dense(GatedMlp::load(
                            &be,
                            &vb,
                            hp.n_embd,
                            hp.n_ff,
                            Activation::Silu,
                        )?)
                    },
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Decoder {
            trunk: Trunk::load(&be, vb, hp, None)?,
            layers: blocks,
            info,
            be,
        })
    }
}
