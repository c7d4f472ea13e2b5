use crate::{record, Backend, GatedMlp, MoeMlp, Result, RmsNorm, SelfAttention, Tap};

/// A block's feed-forward part.
pub enum Ffn<B: Backend> {
    Dense(GatedMlp<B>),
    Moe(MoeMlp<B>),
}

/// The pre-norm transformer block of Llama, Qwen and most decoders:
/// `h = x + attn(norm(x)); out = h + ffn(norm(h))`.
pub struct PreNormBlock<B: Backend> {
    pub attn_norm: RmsNorm<B>,
    pub attn: SelfAttention<B>,
    pub ffn_norm: RmsNorm<B>,
    pub ffn: Ffn<B>,
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
        let a = &self.attn;
        // The norms' outputs exist on their own only when a tap wants them; otherwise the
        // backend may normalise inside the projections.
        let attn = if tap.wants(&format!("{name}.attn_norm")) {
            let h = self.attn_norm.forward_for(be, x, &[&a.q, &a.k, &a.v])?;
            record(be, tap, name, "attn_norm", &h)?;
            self.attn.attend(be, &h, pos, kv, name, tap)?
        } else {
            let qkv = self
                .attn_norm
                .forward_linear_many(be, x, [&a.q, &a.k, &a.v])?;
            self.attn.attend_projected(be, qkv, pos, kv, name, tap)?
        };
        // The output projections add into the residual stream in one step, unless a tap wants
        // what they produce on its own.
        if tap.wants(&format!("{name}.attn_out")) {
            let out = self.attn.o.forward(be, &attn)?;
            record(be, tap, name, "attn_out", &out)?;
            be.add(x, &out)?;
        } else {
            self.attn.o.forward_add(be, &attn, x)?;
        }
        record(be, tap, name, "ffn_inp", x)?;
        let mlp = match &self.ffn {
            Ffn::Dense(mlp) => mlp,
            Ffn::Moe(moe) => {
                let h = self.ffn_norm.forward(be, x)?;
                record(be, tap, name, "ffn_norm", &h)?;
                let out = moe.forward(be, &h, name, tap)?;
                be.add(x, &out)?;
                return record(be, tap, name, "l_out", x);
            }
        };
        let act = if tap.wants(&format!("{name}.ffn_norm")) {
            let h = self.ffn_norm.forward_for(be, x, &[&mlp.gate, &mlp.up])?;
            record(be, tap, name, "ffn_norm", &h)?;
            mlp.activate(be, &h, name, tap)?
        } else {
            let [gate, up] = self
                .ffn_norm
                .forward_linear_many(be, x, [&mlp.gate, &mlp.up])?;
            // The activation exists on its own only when a tap wants it or what follows it.
            let apart = ["ffn_gate", "ffn_up", "ffn_act", "ffn_out"]
                .iter()
                .any(|what| tap.wants(&format!("{name}.{what}")));
            if !apart && mlp.down.bias.is_none() {
                be.glu_linear_add(&gate, &up, mlp.activation, &mlp.down.weight, x)?;
                return record(be, tap, name, "l_out", x);
            }
            mlp.activate_projected(be, gate, up, name, tap)?
        };
        if tap.wants(&format!("{name}.ffn_out")) {
            let ffn = mlp.down.forward(be, &act)?;
            record(be, tap, name, "ffn_out", &ffn)?;
            be.add(x, &ffn)?;
        } else {
            mlp.down.forward_add(be, &act, x)?;
        }
        record(be, tap, name, "l_out", x)
    }
}
