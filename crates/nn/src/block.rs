use crate::{record, GatedMlp, LayerKv, Result, RmsNorm, SelfAttention, Tap};

/// The pre-norm transformer block of Llama, Qwen and most decoders:
/// `h = x + attn(norm(x)); out = h + mlp(norm(h))`.
#[derive(Debug, Clone)]
pub struct PreNormBlock {
    pub attn_norm: RmsNorm,
    pub attn: SelfAttention,
    pub ffn_norm: RmsNorm,
    pub mlp: GatedMlp,
}

impl PreNormBlock {
    /// `x: [rows, dim]`, updated in place.
    pub fn forward(
        &self,
        x: &mut [f32],
        positions: &[usize],
        kv: &mut LayerKv,
        name: &str,
        tap: &mut dyn Tap,
    ) -> Result<()> {
        let rows = positions.len();
        let h = self.attn_norm.forward(x);
        record(tap, name, "attn_norm", rows, &h);
        let attn = self.attn.forward(&h, positions, kv, name, tap)?;
        add_inplace(x, &attn);
        record(tap, name, "ffn_inp", rows, x);
        let h = self.ffn_norm.forward(x);
        record(tap, name, "ffn_norm", rows, &h);
        let ffn = self.mlp.forward(&h, rows, name, tap)?;
        record(tap, name, "ffn_out", rows, &ffn);
        add_inplace(x, &ffn);
        record(tap, name, "l_out", rows, x);
        Ok(())
    }
}

/// `x += y`, elementwise.
pub fn add_inplace(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}
