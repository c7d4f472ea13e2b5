//! A sparse mixture-of-experts feed-forward layer (Mixtral, Qwen3-MoE): a router picks
//! `n_used` of `n_expert` gated MLPs per row and the output is their weighted sum.
//!
//! Routing as llama.cpp's `build_moe_ffn` with softmax gating and transformers' routers: the
//! router's logits `[rows, n_expert]`, a softmax over all experts in f32, the `n_used`
//! largest probabilities (the lower expert index first on ties), divided by their sum when
//! `normalize`. Each expert runs once on the rows routed to it; rows are gathered and the
//! weighted outputs summed on the host, expert by expert in index order.
//!
//! Qwen2-MoE adds a shared expert that every row uses, scaled by `sigmoid(x · g)`.

use crate::{record, Activation, Backend, GatedMlp, Linear, NnError, Result, Tap, VarBuilder};

pub struct MoeMlp<B: Backend> {
    /// `ffn_gate_inp`: `[n_expert, dim]`.
    pub router: Linear<B>,
    /// Expert `e`: matrix `e` of `ffn_{gate,up,down}_exps` (`[n_expert, hidden, dim]` and
    /// `[n_expert, dim, hidden]`).
    pub experts: Vec<GatedMlp<B>>,
    pub n_used: usize,
    pub normalize: bool,
    pub dim: usize,
    /// `ffn_{gate,up,down}_shexp` and the gate vector `ffn_gate_inp_shexp` (`[dim]`).
    pub shared: Option<(GatedMlp<B>, Vec<f32>)>,
}

impl<B: Backend> MoeMlp<B> {
    /// Loads `ffn_gate_inp`, `ffn_gate_exps`, `ffn_up_exps`, `ffn_down_exps` under `vb`, and
    /// the shared expert when `shared_hidden` is set.
    #[allow(clippy::too_many_arguments)]
    pub fn load(
        be: &B,
        vb: &VarBuilder,
        dim: usize,
        hidden: usize,
        n_expert: usize,
        n_used: usize,
        normalize: bool,
        activation: Activation,
        shared_hidden: Option<usize>,
    ) -> Result<Self> {
        if n_used == 0 || n_used > n_expert {
            return Err(NnError::Invalid(format!(
                "{n_used} experts used per token out of {n_expert}"
            )));
        }
        let router = Linear::load(be, vb, "ffn_gate_inp", n_expert, dim)?;
        let gate = vb.get("ffn_gate_exps.weight")?;
        let up = vb.get("ffn_up_exps.weight")?;
        let down = vb.get("ffn_down_exps.weight")?;
        gate.expect_shape(&[n_expert, hidden, dim])?;
        up.expect_shape(&[n_expert, hidden, dim])?;
        down.expect_shape(&[n_expert, dim, hidden])?;
        let experts = (0..n_expert)
            .map(|e| {
                Ok(GatedMlp {
                    gate: Linear::from_weight(be, &gate.expert(e)?, None, hidden, dim)?,
                    up: Linear::from_weight(be, &up.expert(e)?, None, hidden, dim)?,
                    down: Linear::from_weight(be, &down.expert(e)?, None, dim, hidden)?,
                    activation,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let shared = match shared_hidden {
            Some(h) => {
                let gate = vb.get("ffn_gate_inp_shexp.weight")?;
                let values = gate.to_f32()?;
                if values.len() != dim {
                    return Err(NnError::BadShape {
                        name: gate.name.clone(),
                        shape: gate.shape.clone(),
                        expected: format!("[{dim}]"),
                    });
                }
                let mlp = GatedMlp {
                    gate: Linear::load(be, vb, "ffn_gate_shexp", h, dim)?,
                    up: Linear::load(be, vb, "ffn_up_shexp", h, dim)?,
                    down: Linear::load(be, vb, "ffn_down_shexp", dim, h)?,
                    activation,
                };
                Some((mlp, values))
            }
            None => None,
        };
        Ok(MoeMlp {
            router,
            experts,
            n_used,
            normalize,
            dim,
            shared,
        })
    }

    /// The experts each row uses and their weights: `rows × n_used` pairs.
    pub fn route(&self, logits: &[f32]) -> Vec<Vec<(usize, f32)>> {
        let n_expert = self.experts.len();
        logits
            .chunks_exact(n_expert)
            .map(|row| {
                let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
                let exps: Vec<f32> = row.iter().map(|&v| (v - max).exp()).collect();
                let sum: f32 = exps.iter().sum();
                let mut order: Vec<usize> = (0..n_expert).collect();
                // Largest first; the sort is stable, so ties keep the lower index first.
                order.sort_by(|&a, &b| exps[b].total_cmp(&exps[a]));
                let mut picked: Vec<(usize, f32)> = order[..self.n_used]
                    .iter()
                    .map(|&e| (e, exps[e] / sum))
                    .collect();
                if self.normalize {
                    let total: f32 = picked.iter().map(|p| p.1).sum();
                    picked.iter_mut().for_each(|p| p.1 /= total);
                }
                picked
            })
            .collect()
    }

    /// `x: [rows, dim]` -> `[rows, dim]`.
    pub fn forward(
        &self,
        be: &B,
        x: &B::Tensor,
        name: &str,
        tap: &mut dyn Tap,
    ) -> Result<B::Tensor> {
        let (rows, dim) = be.shape(x);
        let logits = self.router.forward(be, x)?;
        record(be, tap, name, "ffn_moe_logits", &logits)?;
        let routes = self.route(&be.to_host(&logits)?);
        let host_x = be.to_host(x)?;
        let mut out = vec![0f32; rows * dim];
        for (e, expert) in self.experts.iter().enumerate() {
            // The rows routed to expert e, with their weights.
            let mine: Vec<(usize, f32)> = routes
                .iter()
                .enumerate()
                .filter_map(|(r, picks)| picks.iter().find(|p| p.0 == e).map(|p| (r, p.1)))
                .collect();
            if mine.is_empty() {
                continue;
            }
            let mut gathered = Vec::with_capacity(mine.len() * dim);
            for &(r, _) in &mine {
                gathered.extend_from_slice(&host_x[r * dim..(r + 1) * dim]);
            }
            let input = be.upload(gathered, mine.len(), dim)?;
            // Each expert's input and activation on their own when a tap wants them (importance
            // statistics per expert matrix).
            record(be, tap, name, &format!("ffn_moe_in.{e}"), &input)?;
            let act = expert.activate(be, &input, name, &mut crate::NoTap)?;
            record(be, tap, name, &format!("ffn_moe_act.{e}"), &act)?;
            let y = be.to_host(&expert.down.forward(be, &act)?)?;
            for (i, &(r, w)) in mine.iter().enumerate() {
                for (o, v) in out[r * dim..(r + 1) * dim]
                    .iter_mut()
                    .zip(&y[i * dim..(i + 1) * dim])
                {
                    *o += w * v;
                }
            }
        }
        if let Some((mlp, gate)) = &self.shared {
            let act = mlp.activate(be, x, name, &mut crate::NoTap)?;
            record(be, tap, name, "ffn_shexp_act", &act)?;
            let y = be.to_host(&mlp.down.forward(be, &act)?)?;
            for r in 0..rows {
                let xr = &host_x[r * dim..(r + 1) * dim];
                let g: f32 = xr.iter().zip(gate).map(|(a, b)| a * b).sum();
                let w = 1.0 / (1.0 + (-g).exp());
                for (o, v) in out[r * dim..(r + 1) * dim]
                    .iter_mut()
                    .zip(&y[r * dim..(r + 1) * dim])
                {
                    *o += w * v;
                }
            }
        }
        let out = be.upload(out, rows, dim)?;
        record(be, tap, name, "ffn_moe_out", &out)?;
        Ok(out)
    }
}
