//! The backend contract: the few operations decoder layers need, implemented once per device.
//!
//! Layers and models are generic over a [`Backend`]; the CPU backend ([`crate::CpuBackend`])
//! reproduces llama.cpp's portable arithmetic bit for bit, the CUDA backend
//! ([`crate::CudaBackend`]) runs the kernels of `kernels/`. A new op touches this trait and one
//! function per backend.

use synaptix_sample::DevicePick;

use crate::{Activation, AttentionSpec, Result, Rope, Weight};

pub trait Backend: Send + Sync + 'static {
    /// Activations: a row-major `f32` matrix `[rows, cols]` on the device.
    type Tensor: Send + Sync;
    /// A weight matrix `[out, in]` in its stored format.
    type Matrix: Send + Sync;
    /// An `f32` parameter vector (norm weights, biases).
    type Vector: Send + Sync;
    /// One layer's KV cache.
    type Kv: Send + Sync;
    /// The positions of one forward step, prepared once and shared by every layer.
    type Positions: Send + Sync;

    /// `cpu`, `cuda:0`, ...
    fn name(&self) -> String;

    fn matrix(&self, w: &Weight) -> Result<Self::Matrix>;
    fn vector(&self, values: Vec<f32>) -> Result<Self::Vector>;
    fn kv(&self, n_kv_heads: usize, head_dim: usize, capacity: usize) -> Result<Self::Kv>;
    fn positions(&self, positions: &[usize]) -> Result<Self::Positions>;

    fn shape(&self, x: &Self::Tensor) -> (usize, usize);
    fn to_host(&self, x: &Self::Tensor) -> Result<Vec<f32>>;
    /// `values` as a `[rows, cols]` tensor on the device (for layers that route rows on the
    /// host, such as mixture-of-experts).
    fn upload(&self, values: Vec<f32>, rows: usize, cols: usize) -> Result<Self::Tensor>;

    /// Rows `ids` of an embedding table, times `scale`: `[ids, cols]`.
    fn embed(&self, table: &Self::Matrix, ids: &[u32], scale: Option<f32>) -> Result<Self::Tensor>;
    /// `x · Wᵀ (+ bias)`.
    fn linear(
        &self,
        x: &Self::Tensor,
        w: &Self::Matrix,
        bias: Option<&Self::Vector>,
    ) -> Result<Self::Tensor>;
    /// `x · Wᵢᵀ (+ biasᵢ)` for several weights of one input (QKV, gate and up): a backend may
    /// prepare `x` once for all of them.
    fn linear_many(
        &self,
        x: &Self::Tensor,
        ws: &[(&Self::Matrix, Option<&Self::Vector>)],
    ) -> Result<Vec<Self::Tensor>> {
        ws.iter().map(|(w, b)| self.linear(x, w, *b)).collect()
    }
    /// `residual += x · Wᵀ`, which a backend may fuse into the product's last step.
    fn linear_add(
        &self,
        x: &Self::Tensor,
        w: &Self::Matrix,
        residual: &mut Self::Tensor,
    ) -> Result<()> {
        let y = self.linear(x, w, None)?;
        self.add(residual, &y)
    }
    /// RMSNorm of every `w.len()`-long piece of each row (whole rows, or attention heads).
    fn rms_norm(&self, x: &Self::Tensor, w: &Self::Vector, eps: f32) -> Result<Self::Tensor>;
    /// `linear_many(rms_norm(x, w, eps), ws)` where nothing else reads the normalised rows: a
    /// backend may do the norm inside the products.
    fn rms_norm_linear_many(
        &self,
        x: &Self::Tensor,
        w: &Self::Vector,
        eps: f32,
        ws: &[(&Self::Matrix, Option<&Self::Vector>)],
    ) -> Result<Vec<Self::Tensor>> {
        let consumers: Vec<&Self::Matrix> = ws.iter().map(|(m, _)| *m).collect();
        let h = self.rms_norm_for(x, w, eps, &consumers)?;
        self.linear_many(&h, ws)
    }
    /// [`Backend::rms_norm`] whose output feeds the weights `consumers` (through `linear_many`):
    /// a backend may prepare their input (quantize it) in the same step.
    fn rms_norm_for(
        &self,
        x: &Self::Tensor,
        w: &Self::Vector,
        eps: f32,
        consumers: &[&Self::Matrix],
    ) -> Result<Self::Tensor> {
        let _ = consumers;
        self.rms_norm(x, w, eps)
    }
    /// Rotates `x: [rows, n_heads * head_dim]` in place.
    fn rope(
        &self,
        x: &mut Self::Tensor,
        rope: &Rope,
        n_heads: usize,
        head_dim: usize,
        pos: &Self::Positions,
    ) -> Result<()>;
    /// Rotates a layer's queries and keys, then scales the queries by `q_scale` if given.
    #[allow(clippy::too_many_arguments)]
    fn rope_qk(
        &self,
        q: &mut Self::Tensor,
        k: &mut Self::Tensor,
        rope: &Rope,
        (n_heads, n_kv_heads, head_dim): (usize, usize, usize),
        pos: &Self::Positions,
        q_scale: Option<f32>,
    ) -> Result<()> {
        self.rope(q, rope, n_heads, head_dim, pos)?;
        self.rope(k, rope, n_kv_heads, head_dim, pos)?;
        if let Some(s) = q_scale {
            self.scale(q, s)?;
        }
        Ok(())
    }
    fn scale(&self, x: &mut Self::Tensor, s: f32) -> Result<()>;
    /// `x += y`.
    fn add(&self, x: &mut Self::Tensor, y: &Self::Tensor) -> Result<()>;
    /// `act(gate) * up`.
    fn glu(&self, gate: &Self::Tensor, up: &Self::Tensor, act: Activation) -> Result<Self::Tensor>;
    /// [`Backend::glu`] whose output feeds the weight `consumer`: a backend may prepare its
    /// input (quantize it) in the same step.
    fn glu_for(
        &self,
        gate: &Self::Tensor,
        up: &Self::Tensor,
        act: Activation,
        consumer: &Self::Matrix,
    ) -> Result<Self::Tensor> {
        let _ = consumer;
        self.glu(gate, up, act)
    }
    /// `residual += (act(gate) * up) · Wᵀ`, where nothing else reads the activation: a backend
    /// may compute it inside the product.
    fn glu_linear_add(
        &self,
        gate: &Self::Tensor,
        up: &Self::Tensor,
        act: Activation,
        w: &Self::Matrix,
        residual: &mut Self::Tensor,
    ) -> Result<()> {
        let h = self.glu_for(gate, up, act, w)?;
        self.linear_add(&h, w, residual)
    }
    /// Stores `k, v` at the step's positions, then attends `q` over the cache.
    fn attention(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        kv: &mut Self::Kv,
        pos: &Self::Positions,
        spec: &AttentionSpec,
    ) -> Result<Self::Tensor>;
    /// [`Backend::rope_qk`], then [`Backend::attention`] of the rotated `q` and `k`, whose
    /// output feeds the weight `consumer`: a backend may write the cache as it rotates and
    /// prepare the output for `consumer` (quantize it) in the same step. `q` and `k` come back
    /// rotated, as from `rope_qk`.
    #[allow(clippy::too_many_arguments)]
    fn rope_attention_for(
        &self,
        (q, k, v): (&mut Self::Tensor, &mut Self::Tensor, &Self::Tensor),
        rope: &Rope,
        heads: (usize, usize, usize),
        q_scale: Option<f32>,
        kv: &mut Self::Kv,
        pos: &Self::Positions,
        spec: &AttentionSpec,
        consumer: &Self::Matrix,
    ) -> Result<Self::Tensor> {
        let _ = consumer;
        self.rope_qk(q, k, rope, heads, pos, q_scale)?;
        self.attention(q, k, v, kv, pos, spec)
    }
    /// The last row of `x`.
    fn last_row(&self, x: Self::Tensor) -> Result<Self::Tensor>;
    /// `x = cap * tanh(x / cap)`.
    fn softcap(&self, x: &mut Self::Tensor, cap: f32) -> Result<()>;
    /// Index of the largest value of the last row (lowest index on ties).
    fn argmax(&self, x: &Self::Tensor) -> Result<u32>;

    /// The device's part of choosing the next token from the last row of `logits` (which it
    /// may modify): penalties, then the arg-max or the top-k candidates (see [`DevicePick`]).
    fn pick(&self, logits: Self::Tensor, pick: &DevicePick) -> Result<Vec<(u32, f32)>> {
        let (rows, cols) = self.shape(&logits);
        let all = self.to_host(&logits)?;
        let mut last = all[rows.saturating_sub(1) * cols..].to_vec();
        Ok(pick.on_host(&mut last))
    }

    /// Runs `step`, one decode step of a single token ending in a [`Backend::pick`], and returns
    /// what it picked. A backend may record the work `step` launches and replay the recording
    /// for later steps of the same cache and pick settings instead of calling `step` again
    /// (CUDA graphs): `step` must then launch the same work whatever the token, position and
    /// penalty counts, which the backend feeds from `key` and `pick`. `step` may run more than
    /// once for one call; it must reset its host state first.
    fn decode_step(
        &self,
        key: DecodeStep,
        pick: &DevicePick,
        step: &mut dyn FnMut() -> Result<Vec<(u32, f32)>>,
    ) -> Result<Vec<(u32, f32)>> {
        let _ = (key, pick);
        step()
    }
}

/// What identifies one single-token decode step for [`Backend::decode_step`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeStep {
    /// [`crate::KvCache::id`] of the cache the step extends.
    pub cache_id: u64,
    pub token: u32,
    pub position: usize,
    /// The caller feeds this step's greedy pick back as the next token and means to ask for
    /// the next step: the backend may launch that step on its own pick before returning.
    pub continues: bool,
    /// The previous operation on this cache was the step before this one, with `continues`
    /// set: a step the backend launched ahead then may be this one (it checks the token).
    pub follows: bool,
}
