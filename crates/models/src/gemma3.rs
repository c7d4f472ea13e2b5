//! Gemma 3 (text): sandwich-normed blocks (RMSNorm before and after both attention and MLP),
//! per-head QK-norm, GeGLU (tanh GELU), embeddings scaled by `sqrt(n_embd)`, and interleaved
//! sliding-window layers with their own RoPE base (10 000 unless the file says otherwise) and
//! global layers (every sixth by default). Mirrors llama.cpp's `gemma3` graph
//! (src/models/gemma3.cpp) and HF transformers' `Gemma3ForCausalLM`.
//!
//! GGUF stores Gemma's norm weights with the `+1` already added, so plain RMSNorm applies.

use synaptix_bundle::Value;
use synaptix_nn::{
    record, Activation, AttentionSpec, Backend, GatedMlp, RmsNorm, Rope, RopeStyle, SelfAttention,
    SelfAttentionConfig, Tap, VarBuilder,
};

use crate::decoder::{Decoder, Layers, Trunk};
use crate::{ModelError, ModelInfo, Result};

/// Layers per repeat of the window pattern: five windowed layers, then one global.
const DEFAULT_SWA_PATTERN: usize = 6;
const DEFAULT_SWA_ROPE_BASE: f32 = 10_000.0;

pub struct Block<B: Backend> {
    attn_norm: RmsNorm<B>,
    attn: SelfAttention<B>,
    post_attention_norm: RmsNorm<B>,
    ffn_norm: RmsNorm<B>,
    mlp: GatedMlp<B>,
    post_ffw_norm: RmsNorm<B>,
}

pub type Gemma3<B> = Decoder<B, Vec<Block<B>>>;

impl<B: Backend> Layers<B> for Vec<Block<B>> {
    fn forward(
        &self,
        be: &B,
        il: usize,
        x: &mut B::Tensor,
        pos: &B::Positions,
        kv: &mut B::Kv,
        tap: &mut dyn Tap,
    ) -> Result<()> {
        self[il].forward(be, x, pos, kv, &format!("blk.{il}"), tap)
    }
}

/// Reads which layers use the sliding window: an explicit per-layer bool array, or a period.
fn sliding_layers(vb_meta: &MetaView, n_layer: usize) -> Result<Vec<bool>> {
    match vb_meta.get("gemma3.attention.sliding_window_pattern") {
        Some(Value::Array(_, items)) => {
            if items.len() != n_layer {
                return Err(vb_meta.bad(format!(
                    "sliding_window_pattern has {} entries for {n_layer} layers",
                    items.len()
                )));
            }
            items
                .iter()
                .map(|v| {
                    v.as_bool()
                        .or_else(|| v.as_u64().map(|n| n != 0))
                        .ok_or_else(|| vb_meta.bad("sliding_window_pattern: expected bools".into()))
                })
                .collect()
        }
        Some(v) => {
            let period =
                v.as_u64().filter(|&p| p > 0).ok_or_else(|| {
                    vb_meta.bad("sliding_window_pattern: expected a period".into())
                })? as usize;
            Ok((0..n_layer).map(|il| il % period < period - 1).collect())
        }
        None => Ok((0..n_layer)
            .map(|il| il % DEFAULT_SWA_PATTERN < DEFAULT_SWA_PATTERN - 1)
            .collect()),
    }
}

/// Metadata access for the few Gemma-specific keys.
struct MetaView<'a> {
    file: &'a synaptix_bundle::GgufFile,
}

impl MetaView<'_> {
    fn get(&self, key: &str) -> Option<&Value> {
        self.file.get(key)
    }
    fn bad(&self, problem: String) -> ModelError {
        ModelError::BadHyperParameters {
            path: self.file.path().display().to_string(),
            problem,
        }
    }
}

/// Loads a Gemma 3 file.
pub fn load<B: Backend>(
    be: B,
    vb: &VarBuilder,
    file: &synaptix_bundle::GgufFile,
    info: ModelInfo,
) -> Result<Gemma3<B>> {
    Gemma3::load(be, vb, file, info)
}

impl<B: Backend> Gemma3<B> {
    pub fn load(
        be: B,
        vb: &VarBuilder,
        file: &synaptix_bundle::GgufFile,
        info: ModelInfo,
    ) -> Result<Self> {
        let hp = &info.hparams;
        let meta = MetaView { file };
        let swa = sliding_layers(&meta, hp.n_layer)?;
        let swa_base = file
            .get_f64("gemma3.rope.freq_base_swa")?
            .map_or(DEFAULT_SWA_ROPE_BASE, |v| v as f32);
        let final_softcap = file
            .get_f64("gemma3.final_logit_softcapping")?
            .filter(|&c| c > 0.0)
            .map(|c| c as f32);
        let blocks = (0..hp.n_layer)
            .map(|il| {
                let vb = vb.pp("blk").pp(il);
                let windowed = swa[il] && hp.sliding_window.is_some();
                let cfg = SelfAttentionConfig {
                    dim: hp.n_embd,
                    spec: AttentionSpec {
                        n_heads: hp.n_head,
                        n_kv_heads: hp.n_head_kv,
                        head_dim: hp.head_dim,
                        // q is pre-scaled instead (below), as the reference does.
                        scale: 1.0,
                        window: if windowed { hp.sliding_window } else { None },
                    },
                    rope: Rope {
                        n_rot: hp.n_rot,
                        base: if windowed {
                            swa_base
                        } else {
                            hp.rope_freq_base
                        },
                        freq_scale: if windowed { 1.0 } else { hp.rope_freq_scale },
                        style: RopeStyle::Neox,
                        freq_factors: None,
                    },
                    qk_norm_eps: Some(hp.rms_eps),
                    q_scale: Some(1.0 / (hp.head_dim as f32).sqrt()),
                };
                Ok(Block {
                    attn_norm: RmsNorm::load(&be, &vb, "attn_norm", hp.n_embd, hp.rms_eps)?,
                    attn: SelfAttention::load(&be, &vb, &cfg)?,
                    post_attention_norm: RmsNorm::load(
                        &be,
                        &vb,
                        "post_attention_norm",
                        hp.n_embd,
                        hp.rms_eps,
                    )?,
                    ffn_norm: RmsNorm::load(&be, &vb, "ffn_norm", hp.n_embd, hp.rms_eps)?,
                    mlp: GatedMlp::load(&be, &vb, hp.n_embd, hp.n_ff, Activation::GeluTanh)?,
                    post_ffw_norm: RmsNorm::load(&be, &vb, "post_ffw_norm", hp.n_embd, hp.rms_eps)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let mut trunk = Trunk::load(&be, vb, hp, Some((hp.n_embd as f32).sqrt()))?;
        trunk.final_softcap = final_softcap;
        Ok(Decoder {
            trunk,
            layers: blocks,
            info,
            be,
        })
    }
}

impl<B: Backend> Block<B> {
    fn forward(
        &self,
        be: &B,
        x: &mut B::Tensor,
        pos: &B::Positions,
        kv: &mut B::Kv,
        name: &str,
        tap: &mut dyn Tap,
    ) -> Result<()> {
        let a = &self.attn;
        // The norms' outputs exist on their own only when a tap wants them; otherwise the
        // backend may normalise inside the projections.
        let attn = if tap.wants(&format!("{name}.attn_norm")) {
            let h = self.attn_norm.forward_for(be, x, &[&a.q, &a.k, &a.v])?;
            record(be, tap, name, "attn_norm", &h)?;
            a.forward(be, &h, pos, kv, name, tap)?
        } else {
            let qkv = self
                .attn_norm
                .forward_linear_many(be, x, [&a.q, &a.k, &a.v])?;
            a.forward_projected(be, qkv, pos, kv, name, tap)?
        };
        let attn = self.post_attention_norm.forward(be, &attn)?;
        record(be, tap, name, "attn_post_norm", &attn)?;
        be.add(x, &attn)?;
        record(be, tap, name, "sa_out", x)?;
        let mlp = &self.mlp;
        let ffn = if tap.wants(&format!("{name}.ffn_norm")) {
            let h = self.ffn_norm.forward_for(be, x, &[&mlp.gate, &mlp.up])?;
            record(be, tap, name, "ffn_norm", &h)?;
            mlp.forward(be, &h, name, tap)?
        } else {
            let [gate, up] = self
                .ffn_norm
                .forward_linear_many(be, x, [&mlp.gate, &mlp.up])?;
            mlp.forward_projected(be, gate, up, name, tap)?
        };
        record(be, tap, name, "ffn_out", &ffn)?;
        let ffn = self.post_ffw_norm.forward(be, &ffn)?;
        record(be, tap, name, "ffn_post_norm", &ffn)?;
        be.add(x, &ffn)?;
        record(be, tap, name, "l_out", x)?;
        Ok(())
    }
}
