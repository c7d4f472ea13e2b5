use crate::{AttentionSpec, Backend, Linear, Result, RmsNorm, Rope, Tap, VarBuilder};

/// Multi-head self-attention with GQA: `attn_q/k/v` (optional biases), optional per-head
/// QK-norm (`attn_q_norm`, `attn_k_norm`), RoPE, the KV-cache write, attention and `attn_output`.
pub struct SelfAttention<B: Backend> {
    pub q: Linear<B>,
    pub k: Linear<B>,
    pub v: Linear<B>,
    pub o: Linear<B>,
    pub q_norm: Option<RmsNorm<B>>,
    pub k_norm: Option<RmsNorm<B>>,
    pub rope: Rope,
    pub spec: AttentionSpec,
    /// Applied to `q` after RoPE, before the f16 rounding of attention (Gemma's query scale).
    pub q_scale: Option<f32>,
}

/// How [`SelfAttention::load`] should read a layer.
#[derive(Debug, Clone)]
pub struct SelfAttentionConfig {
    pub dim: usize,
    pub spec: AttentionSpec,
    pub rope: Rope,
    /// Per-head RMSNorm on q and k, with this epsilon.
    pub qk_norm_eps: Option<f32>,
    pub q_scale: Option<f32>,
}

impl<B: Backend> SelfAttention<B> {
    pub fn load(be: &B, vb: &VarBuilder, cfg: &SelfAttentionConfig) -> Result<Self> {
        let s = &cfg.spec;
        let (q_dim, kv_dim) = (s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim);
        let (q_norm, k_norm) = match cfg.qk_norm_eps {
            Some(eps) => (
                Some(RmsNorm::load(be, vb, "attn_q_norm", s.head_dim, eps)?),
                Some(RmsNorm::load(be, vb, "attn_k_norm", s.head_dim, eps)?),
            ),
            None => (None, None),
        };
        Ok(SelfAttention {
            q: Linear::load(be, vb, "attn_q", q_dim, cfg.dim)?,
            k: Linear::load(be, vb, "attn_k", kv_dim, cfg.dim)?,
            v: Linear::load(be, vb, "attn_v", kv_dim, cfg.dim)?,
            o: Linear::load(be, vb, "attn_output", cfg.dim, q_dim)?,
            q_norm,
            k_norm,
            rope: cfg.rope.clone(),
            spec: cfg.spec,
            q_scale: cfg.q_scale,
        })
    }

    /// `x: [rows, dim]` at `pos` -> `[rows, dim]`; stores this step's keys and values in `kv`.
    /// `name` prefixes tapped intermediates (`blk.3`).
    pub fn forward(
        &self,
        be: &B,
        x: &B::Tensor,
        pos: &B::Positions,
        kv: &mut B::Kv,
        name: &str,
        tap: &mut dyn Tap,
    ) -> Result<B::Tensor> {
        let qkv = Linear::forward_many(be, x, [&self.q, &self.k, &self.v])?;
        self.forward_projected(be, qkv, pos, kv, name, tap)
    }

    /// [`SelfAttention::forward`] from the projected queries, keys and values.
    pub fn forward_projected(
        &self,
        be: &B,
        qkv: [B::Tensor; 3],
        pos: &B::Positions,
        kv: &mut B::Kv,
        name: &str,
        tap: &mut dyn Tap,
    ) -> Result<B::Tensor> {
        let attn = self.attend_projected(be, qkv, pos, kv, name, tap)?;
        let out = self.o.forward(be, &attn)?;
        record(be, tap, name, "attn_out", &out)?;
        Ok(out)
    }

    /// Everything before the output projection: `[rows, n_heads * head_dim]`.
    pub fn attend(
        &self,
        be: &B,
        x: &B::Tensor,
        pos: &B::Positions,
        kv: &mut B::Kv,
        name: &str,
        tap: &mut dyn Tap,
    ) -> Result<B::Tensor> {
        let qkv = Linear::forward_many(be, x, [&self.q, &self.k, &self.v])?;
        self.attend_projected(be, qkv, pos, kv, name, tap)
    }

    /// [`SelfAttention::attend`] from the projected queries, keys and values.
    pub fn attend_projected(
        &self,
        be: &B,
        [mut q, mut k, v]: [B::Tensor; 3],
        pos: &B::Positions,
        kv: &mut B::Kv,
        name: &str,
        tap: &mut dyn Tap,
    ) -> Result<B::Tensor> {
        let s = &self.spec;
        record(be, tap, name, "Qcur", &q)?;
        record(be, tap, name, "Kcur", &k)?;
        record(be, tap, name, "Vcur", &v)?;
        if let (Some(qn), Some(kn)) = (&self.q_norm, &self.k_norm) {
            q = qn.forward(be, &q)?;
            k = kn.forward(be, &k)?;
            record(be, tap, name, "Qcur_normed", &q)?;
            record(be, tap, name, "Kcur_normed", &k)?;
        }
        let heads = (s.n_heads, s.n_kv_heads, s.head_dim);
        let attn = be.rope_attention_for(
            (&mut q, &mut k, &v),
            &self.rope,
            heads,
            self.q_scale,
            kv,
            pos,
            s,
            &self.o.weight,
        )?;
        record(be, tap, name, "Qcur_rope", &q)?;
        record(be, tap, name, "Kcur_rope", &k)?;
        record(be, tap, name, "kqv_out", &attn)?;
        Ok(attn)
    }
}

/// Records `{layer}.{what}` when the tap wants it (copying it to the host).
pub fn record<B: Backend>(
    be: &B,
    tap: &mut dyn Tap,
    layer: &str,
    what: &str,
    x: &B::Tensor,
) -> Result<()> {
    let full = if layer.is_empty() {
        what.to_string()
    } else {
        format!("{layer}.{what}")
    };
    if tap.wants(&full) {
        let (rows, cols) = be.shape(x);
        let data = be.to_host(x)?;
        tap.record(&full, rows, cols, &data);
    }
    Ok(())
}
