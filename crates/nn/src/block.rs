use crate::{record, Backend, GatedMlp, Result, RmsNorm, SelfAttention, Tap};

/// The pre-norm transformer block of Llama, Qwen and most decoders:
/// `h = x + attn(norm(x)); out = h + mlp(norm(h))`.
pub struct PreNormBlock<B: Backend> {
    pub attn_norm: RmsNorm<B>,
    pub attn: SelfAttention<B>,
    pub ffn_norm: RmsNorm<B>,
    pub mlp: GatedMlp<B>,
}

impl<B: Backend> PreNormBlock<B> {
    /// `x: [rows, dim]`, updated in place.
    pub fn forward(
        &self,
        be: &B,
        x: &mut B::Tensor,
        pos: &B::Positions,
        kv: &mut B::Kv,
        name: &str,
        tap: &mut dyn Tap,
    ) -> Result<()> {
        let h = self.attn_norm.forward(be, x)?;
        record(be, tap, name, "attn_norm", &h)?;
        let attn = self.attn.forward(be, &h, pos, kv, name, tap)?;
        be.add(x, &attn)?;
        record(be, tap, name, "ffn_inp", x)?;
        let h = self.ffn_norm.forward(be, x)?;
        record(be, tap, name, "ffn_norm", &h)?;
        let ffn = self.mlp.forward(be, &h, name, tap)?;
        record(be, tap, name, "ffn_out", &ffn)?;
        be.add(x, &ffn)?;
        record(be, tap, name, "l_out", x)
    }
}
