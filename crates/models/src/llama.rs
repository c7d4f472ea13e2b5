//! Llama 2/3, Mistral, TinyLlama: pre-norm blocks, SwiGLU, RoPE in the original (GPT-J)
//! pairing, optional per-frequency RoPE factors (`rope_freqs.weight`, Llama 3.1).
//! Mirrors llama.cpp's `llama` graph (src/models/llama.cpp) for dense models.
//!
//! [`PreNormDecoder`] is also the body of Qwen2 and Qwen3, which differ only in options.

use synaptix_nn::{
    Activation, AttentionSpec, GatedMlp, KvCache, PreNormBlock, RmsNorm, Rope, RopeStyle,
    SelfAttention, SelfAttentionConfig, Tap, VarBuilder,
};

use crate::decoder::Trunk;
use crate::{CausalLm, Logits, ModelInfo, Result};

/// Loads a Llama-family file.
pub fn load(vb: &VarBuilder, info: ModelInfo) -> Result<PreNormDecoder> {
    PreNormDecoder::load(vb, info, RopeStyle::Normal, false)
}

/// A decoder of standard pre-norm blocks `blk.{i}`: RMSNorm, GQA self-attention (q/k/v biases
/// when the file has them, optional per-head QK-norm), RMSNorm, SwiGLU MLP.
pub struct PreNormDecoder {
    info: ModelInfo,
    trunk: Trunk,
    blocks: Vec<PreNormBlock>,
}

impl PreNormDecoder {
    pub fn load(
        vb: &VarBuilder,
        info: ModelInfo,
        rope_style: RopeStyle,
        qk_norm: bool,
    ) -> Result<PreNormDecoder> {
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
                    attn_norm: RmsNorm::load(&vb, "attn_norm", hp.n_embd, hp.rms_eps)?,
                    attn: SelfAttention::load(&vb, &cfg)?,
                    ffn_norm: RmsNorm::load(&vb, "ffn_norm", hp.n_embd, hp.rms_eps)?,
                    mlp: GatedMlp::load(&vb, hp.n_embd, hp.n_ff, Activation::Silu)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(PreNormDecoder {
            trunk: Trunk::load(vb, hp, None)?,
            blocks,
            info,
        })
    }
}

impl CausalLm for PreNormDecoder {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn new_cache(&self, n_ctx: usize) -> Result<KvCache> {
        Ok(KvCache::new(&self.info.hparams.kv_layout(), n_ctx)?)
    }

    fn forward(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        logits: Logits,
        tap: &mut dyn Tap,
    ) -> Result<Vec<f32>> {
        let blocks = &self.blocks;
        self.trunk
            .run(tokens, cache, logits, tap, |il, x, pos, kv, tap| {
                Ok(blocks[il].forward(x, pos, kv, &format!("blk.{il}"), tap)?)
            })
    }
}
