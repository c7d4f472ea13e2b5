//! synaptix-nn: the layers models are built from, on any [`Backend`].
//!
//! Every layer takes its weights by name from a [`VarBuilder`] (any source: GGUF today,
//! safetensors and `.syn` later) and accepts every weight format the kernels execute:
//! quantized or dense is a property of [`Linear`], never of the model file. Layers are generic
//! over the backend that holds their weights and runs their ops: [`CpuBackend`] (bit-exact with
//! llama.cpp's portable build) or [`CudaBackend`].

mod attention;
mod attention_kernels;
mod backend;
mod block;
pub mod conv;
pub mod cpu;
pub mod cuda;
mod cuda_replay;
pub mod dense;
mod embedding;
mod error;
pub mod ggml_math;
mod kv;
mod linear;
mod mlp;
mod moe;
mod norm;
mod rope;
mod self_attention;
mod tap;
mod weights;

pub use attention::{attend, AttentionSpec, LayerKv};
pub use backend::{Backend, DecodeStep};
pub use block::Ffn;
pub use block::PreNormBlock;
pub use cpu::{CpuBackend, CpuTensor};
pub use cuda::CudaBackend;
pub use embedding::Embedding;
pub use error::{NnError, Result};
pub use kv::KvCache;
pub use linear::{cpu_only, Linear};
pub use mlp::{Activation, GatedMlp};
pub use moe::MoeMlp;
pub use norm::RmsNorm;
pub use rope::{Rope, RopeStyle};
pub use self_attention::{record, SelfAttention, SelfAttentionConfig};
pub use tap::{NoTap, Tap};
pub use weights::{TensorSource, VarBuilder, Weight};
