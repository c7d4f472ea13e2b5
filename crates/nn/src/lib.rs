//! synaptix-nn: the layers models are built from.
//!
//! Every layer takes its weights by name from a [`VarBuilder`] (any source: GGUF today,
//! safetensors and `.syn` later) and accepts every weight format the kernels execute:
//! quantized or dense is a property of [`Linear`], never of the model file.
//!
//! Activations are row-major `f32` matrices passed as slices with an explicit row count:
//! `x: [rows, cols]`.

mod attention;
mod block;
mod embedding;
mod error;
pub mod ggml_math;
mod linear;
mod mlp;
mod norm;
mod rope;
mod self_attention;
mod tap;
mod weights;

pub use attention::{attend, AttentionSpec, KvCache, LayerKv};
pub use block::{add_inplace, PreNormBlock};
pub use embedding::Embedding;
pub use error::{NnError, Result};
pub use linear::Linear;
pub use mlp::{Activation, GatedMlp};
pub use norm::RmsNorm;
pub use rope::{Rope, RopeStyle};
pub use self_attention::{record, SelfAttention, SelfAttentionConfig};
pub use tap::{NoTap, Tap};
pub use weights::{TensorSource, VarBuilder, Weight};
