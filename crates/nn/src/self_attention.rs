use crate::{attend, AttentionSpec, LayerKv, Linear, Result, RmsNorm, Rope, Tap, VarBuilder};

/// Multi-head self-attention with GQA: `attn_q/k/v` (optional biases), optional per-head
/// QK-norm (`attn_q_norm`, `attn_k_norm`), RoPE, the KV-cache write, attention and `attn_output`.
#[derive(Debug, Clone)]
pub struct SelfAttention {
    pub q: Linear,
    pub k: Linear,
    pub v: Linear,
    pub o: Linear,
    pub q_norm: Option<RmsNorm>,
    pub k_norm: Option<RmsNorm>,
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

impl SelfAttention {
    pub fn load(vb: &VarBuilder, cfg: &SelfAttentionConfig) -> Result<SelfAttention> {
        let s = &cfg.spec;
        let (q_dim, kv_dim) = (s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim);
        let (q_norm, k_norm) = match cfg.qk_norm_eps {
            Some(eps) => (
                Some(RmsNorm::load(vb, "attn_q_norm", s.head_dim, eps)?),
                Some(RmsNorm::load(vb, "attn_k_norm", s.head_dim, eps)?),
            ),
            None => (None, None),
        };
        Ok(SelfAttention {
            q: Linear::load(vb, "attn_q", q_dim, cfg.dim)?,
            k: Linear::load(vb, "attn_k", kv_dim, cfg.dim)?,
            v: Linear::load(vb, "attn_v", kv_dim, cfg.dim)?,
            o: Linear::load(vb, "attn_output", cfg.dim, q_dim)?,
            q_norm,
            k_norm,
            rope: cfg.rope.clone(),
            spec: cfg.spec,
            q_scale: cfg.q_scale,
        })
    }

    /// `x: [rows, dim]` at `positions` -> `[rows, dim]`; writes this step's keys and values
    /// into `kv` first. `name` prefixes tapped intermediates (`blk.3`).
    pub fn forward(
        &self,
        x: &[f32],
        positions: &[usize],
        kv: &mut LayerKv,
        name: &str,
        tap: &mut dyn Tap,
    ) -> Result<Vec<f32>> {
        let rows = positions.len();
        let s = &self.spec;
        let mut q = self.q.forward(x, rows)?;
        let mut k = self.k.forward(x, rows)?;
        let v = self.v.forward(x, rows)?;
        record(tap, name, "Qcur", rows, &q);
        record(tap, name, "Kcur", rows, &k);
        record(tap, name, "Vcur", rows, &v);
        if let (Some(qn), Some(kn)) = (&self.q_norm, &self.k_norm) {
            qn.forward_inplace(&mut q);
            kn.forward_inplace(&mut k);
            record(tap, name, "Qcur_normed", rows, &q);
            record(tap, name, "Kcur_normed", rows, &k);
        }
        self.rope.apply(&mut q, s.n_heads, s.head_dim, positions);
        self.rope.apply(&mut k, s.n_kv_heads, s.head_dim, positions);
        if let Some(scale) = self.q_scale {
            q.iter_mut().for_each(|v| *v *= scale);
        }
        record(tap, name, "Qcur_rope", rows, &q);
        record(tap, name, "Kcur_rope", rows, &k);
        kv.write(&k, &v, positions)?;
        let attn = attend(s, &q, kv, positions);
        record(tap, name, "kqv_out", rows, &attn);
        let out = self.o.forward(&attn, rows)?;
        record(tap, name, "attn_out", rows, &out);
        Ok(out)
    }
}

/// Records `{layer}.{what}` when the tap wants it.
pub fn record(tap: &mut dyn Tap, layer: &str, what: &str, rows: usize, data: &[f32]) {
    let full = if layer.is_empty() {
        what.to_string()
    } else {
        format!("{layer}.{what}")
    };
    if tap.wants(&full) && rows > 0 {
        tap.record(&full, rows, data.len() / rows, data);
    }
}
