//! The backend contract: the few operations decoder layers need, implemented once per device.
//!
//! Layers and models are generic over a [`Backend`]; the CPU backend ([`crate::CpuBackend`])
//! reproduces llama.cpp's portable arithmetic bit for bit, the CUDA backend
//! ([`crate::CudaBackend`]) runs the kernels of `kernels/`. A new op touches this trait and one
//! function per backend.

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

    /// Rows `ids` of an embedding table, times `scale`: `[ids, cols]`.
    fn embed(&self, table: &Self::Matrix, ids: &[u32], scale: Option<f32>) -> Result<Self::Tensor>;
    /// `x · Wᵀ (+ bias)`.
    fn linear(
        &self,
        x: &Self::Tensor,
        w: &Self::Matrix,
        bias: Option<&Self::Vector>,
    ) -> Result<Self::Tensor>;
    /// RMSNorm of every `w.len()`-long piece of each row (whole rows, or attention heads).
    fn rms_norm(&self, x: &Self::Tensor, w: &Self::Vector, eps: f32) -> Result<Self::Tensor>;
    /// Rotates `x: [rows, n_heads * head_dim]` in place.
    fn rope(
        &self,
        x: &mut Self::Tensor,
        rope: &Rope,
        n_heads: usize,
        head_dim: usize,
        pos: &Self::Positions,
    ) -> Result<()>;
    fn scale(&self, x: &mut Self::Tensor, s: f32) -> Result<()>;
    /// `x += y`.
    fn add(&self, x: &mut Self::Tensor, y: &Self::Tensor) -> Result<()>;
    /// `act(gate) * up`.
    fn glu(&self, gate: &Self::Tensor, up: &Self::Tensor, act: Activation) -> Result<Self::Tensor>;
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
    /// The last row of `x`.
    fn last_row(&self, x: Self::Tensor) -> Result<Self::Tensor>;
    /// `x = cap * tanh(x / cap)`.
    fn softcap(&self, x: &mut Self::Tensor, cap: f32) -> Result<()>;
    /// Index of the largest value of the last row (lowest index on ties).
    fn argmax(&self, x: &Self::Tensor) -> Result<u32>;
}
