//! synaptix-models: one file per architecture, each built only from `synaptix-nn` layers. The
//! GGUF LLMs are registered in [`load`], and one model file serves every weight format; Whisper
//! BERT and Piper voices load their own files.
//!
//! | architecture | file | families |
//! |---|---|---|
//! | `llama` | [`llama`] | Llama 2/3, Mistral, TinyLlama, Mixtral (experts: CPU) |
//! | `qwen2` | [`qwen2`] | Qwen2, Qwen2.5 (QKV bias) |
//! | `qwen2moe` | [`qwen2moe`] | Qwen1.5-MoE, Qwen2-MoE (shared expert; CPU) |
//! | `qwen3` | [`qwen3`] | Qwen3 dense (QK-norm) |
//! | `qwen3moe` | [`qwen3moe`] | Qwen3 mixture-of-experts (CPU) |
//! | `gemma3` | [`gemma3`] | Gemma 3 text (sliding-window and global layers) |
//!
//! The same four also load from Hugging Face directories (safetensors), through [`hf`], and
//! Llama- and Qwen2-style models from SYNAXIM's `.symb` directories, through [`symb`].
//! | Whisper (CTranslate2) | [`whisper`] | Whisper speech recognition (encoder-decoder) |
//! | BERT (safetensors) | [`bert`] | BERT sentence encoders (sentence-transformers, e.g. all-MiniLM-L6-v2) |
//! | VITS (Piper ONNX) | [`vits`] | Piper text-to-speech voices |

pub mod bert;
mod decoder;
pub mod gemma3;
pub mod hf;
mod hparams;
pub mod llama;
pub mod qwen2;
pub mod qwen2moe;
pub mod qwen3;
pub mod qwen3moe;
pub mod silero_vad;
pub mod symb;
pub mod vits;
pub mod whisper;

use std::any::Any;
use std::sync::Arc;
use synaptix_sample::DevicePick;

pub use decoder::{Decoder, Layers, Trunk};
pub use hf::{is_hf_llm_dir, open_hf_dir, open_model_file};
pub use hparams::HParams;
pub use symb::{is_symb_dir, open_symb_dir, write_symb_dir, SymbMethod, SymbSummary};
use synaptix_bundle::{GgufError, GgufFile};
use synaptix_core::Device;
use synaptix_nn::{Backend, CpuBackend, CudaBackend, KvCache, NnError, TensorSource, VarBuilder};
pub use synaptix_nn::{NoTap, Tap};

/// Architectures [`load`] knows, as GGUF's `general.architecture` names them.
pub const SUPPORTED_ARCHITECTURES: &[&str] =
    &["llama", "qwen2", "qwen2moe", "qwen3", "qwen3moe", "gemma3"];

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Nn(#[from] NnError),
    #[error(transparent)]
    Ct2(#[from] synaptix_bundle::ct2::Ct2Error),
    #[error(transparent)]
    Safetensors(#[from] synaptix_bundle::safetensors::SafetensorsError),
    #[error(transparent)]
    Onnx(#[from] synaptix_bundle::onnx::OnnxError),
    #[error(transparent)]
    Kernel(#[from] synaptix_core::Error),
    /// Input a model cannot take (an id outside its vocabulary), by message.
    #[error("{0}")]
    BadInput(String),
    #[error("{path}: unsupported architecture '{arch}' (supported: {})", SUPPORTED_ARCHITECTURES.join(", "))]
    UnsupportedArchitecture { path: String, arch: String },
    #[error("{path}: {problem}")]
    BadHyperParameters { path: String, problem: String },
    #[error("this KV cache belongs to a model on another device")]
    ForeignCache,
    #[error("nothing to evaluate: no input tokens")]
    EmptyInput,
    #[error("{0} token(s) do not fit: the context holds {1} and {2} are used")]
    ContextOverflow(usize, usize, usize),
    #[error("a text of {tokens} tokens is longer than the model's {max} positions")]
    TooManyTokens { tokens: usize, max: usize },
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;

/// Which positions produce logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// Only the last position: `[n_vocab]` (generation).
    Last,
    /// Every position: `[tokens, n_vocab]` (perplexity, scoring).
    All,
}

/// What every loaded model reports about itself.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    pub architecture: String,
    pub name: String,
    pub hparams: HParams,
    /// Total parameters in the file's tensors.
    pub n_params: u64,
    /// Bytes of tensor data.
    pub weight_bytes: u64,
}

/// A model's KV cache on whatever device the model runs, with its fill level.
pub trait Cache: Send + Sync {
    /// Positions `0..len` are filled.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn capacity(&self) -> usize;
    /// Forgets positions `n..`.
    fn truncate(&mut self, n: usize);
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

impl<B: Backend> Cache for KvCache<B> {
    fn len(&self) -> usize {
        self.len
    }
    fn capacity(&self) -> usize {
        self.capacity
    }
    fn truncate(&mut self, n: usize) {
        KvCache::truncate(self, n)
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// A decoder-only language model.
pub trait CausalLm: Send + Sync {
    fn info(&self) -> &ModelInfo;

    /// Where it runs: `cpu`, `cuda:0`.
    fn device(&self) -> String;

    /// An empty KV cache for `n_ctx` positions.
    fn new_cache(&self, n_ctx: usize) -> Result<Box<dyn Cache>>;

    /// Runs `tokens` at positions `cache.len()..`, appends them to the cache and returns logits.
    /// `tap` receives named intermediates (`blk.0.attn_norm`, ..., `result_output`).
    fn forward(
        &self,
        tokens: &[u32],
        cache: &mut dyn Cache,
        logits: Logits,
        tap: &mut dyn Tap,
    ) -> Result<Vec<f32>>;

    /// Runs `tokens` and does `pick` on the last logits on the model's device, so that only
    /// the chosen id (greedy) or the top-k candidates cross to the host.
    fn forward_pick(
        &self,
        tokens: &[u32],
        cache: &mut dyn Cache,
        pick: &DevicePick,
    ) -> Result<Vec<(u32, f32)>>;

    /// [`CausalLm::forward_pick`] in a decode loop: with `more` set, the caller feeds a greedy
    /// pick (no penalties) back as the next token and means to ask for the next step, which the
    /// device may then start on its own pick before this call returns. A caller that then stops
    /// or feeds another token gets correct results; the step started ahead is wasted work.
    fn forward_pick_more(
        &self,
        tokens: &[u32],
        cache: &mut dyn Cache,
        pick: &DevicePick,
        more: bool,
    ) -> Result<Vec<(u32, f32)>> {
        let _ = more;
        self.forward_pick(tokens, cache, pick)
    }

    /// Runs `tokens` and returns the most likely next token (lowest id on ties), chosen on the
    /// model's device so that only the id crosses to the host.
    fn forward_greedy(&self, tokens: &[u32], cache: &mut dyn Cache) -> Result<u32> {
        let picked = self.forward_pick(tokens, cache, &DevicePick::GREEDY)?;
        picked.first().map(|c| c.0).ok_or(ModelError::EmptyInput)
    }
}

/// Why the model a file describes runs on the CPU only, if it does: mixture-of-experts layers
/// (their routing runs on the host) or weights in a type only the CPU kernels execute.
pub fn cpu_only_reason(file: &GgufFile) -> Option<String> {
    let arch = file.get_str("general.architecture").ok().flatten()?;
    let experts = file
        .get_u64(&format!("{arch}.expert_count"))
        .ok()
        .flatten()
        .unwrap_or(0);
    if experts > 0 {
        return Some("mixture-of-experts layers run on the CPU only so far".into());
    }
    file.tensors()
        .iter()
        .find(|t| synaptix_nn::cpu_only(t.dtype))
        .map(|t| {
            format!(
                "{} weights ({}) run on the CPU only so far",
                t.dtype, t.name
            )
        })
}

/// Loads the model a GGUF file describes onto the CPU.
pub fn load(file: Arc<GgufFile>) -> Result<Box<dyn CausalLm>> {
    load_on(file, Device::Cpu)
}

/// Loads the model a GGUF file describes onto `device`.
pub fn load_on(file: Arc<GgufFile>, device: Device) -> Result<Box<dyn CausalLm>> {
    let path = file.path().display().to_string();
    let arch = file
        .get_str("general.architecture")?
        .ok_or_else(|| ModelError::BadHyperParameters {
            path: path.clone(),
            problem: "missing general.architecture".into(),
        })?
        .to_string();
    if !SUPPORTED_ARCHITECTURES.contains(&arch.as_str()) {
        return Err(ModelError::UnsupportedArchitecture { path, arch });
    }
    let info = ModelInfo {
        name: file.get_str("general.name")?.unwrap_or(&arch).to_string(),
        hparams: HParams::from_gguf(&file, &arch)?,
        n_params: file.tensors().iter().map(|t| t.elements()).sum(),
        weight_bytes: file.tensors().iter().map(|t| t.n_bytes).sum(),
        architecture: arch.clone(),
    };
    let vb = VarBuilder::new(file.clone() as Arc<dyn TensorSource>);
    if let (Device::Cuda(_), Some(why)) = (device, cpu_only_reason(&file)) {
        return Err(ModelError::BadHyperParameters {
            path,
            problem: format!("{why} (use --device cpu)"),
        });
    }
    match device {
        Device::Cpu => build(CpuBackend, &vb, &file, info, path),
        Device::Cuda(n) => build(CudaBackend::new(n)?, &vb, &file, info, path),
    }
}

fn build<B: Backend>(
    be: B,
    vb: &VarBuilder,
    file: &GgufFile,
    info: ModelInfo,
    path: String,
) -> Result<Box<dyn CausalLm>> {
    let arch = info.architecture.clone();
    Ok(match arch.as_str() {
        "llama" => Box::new(llama::load(be, vb, info)?),
        "qwen2" => Box::new(qwen2::load(be, vb, info)?),
        "qwen2moe" => Box::new(qwen2moe::load(be, vb, info)?),
        "qwen3" => Box::new(qwen3::load(be, vb, info)?),
        "qwen3moe" => Box::new(qwen3moe::load(be, vb, info)?),
        "gemma3" => Box::new(gemma3::Gemma3::load(be, vb, file, info)?),
        _ => return Err(ModelError::UnsupportedArchitecture { path, arch }),
    })
}

/// The model's own cache type inside a `dyn Cache` (a cache of another model is an error).
pub(crate) fn own_cache<B: Backend>(cache: &mut dyn Cache) -> Result<&mut KvCache<B>> {
    cache
        .as_any_mut()
        .downcast_mut::<KvCache<B>>()
        .ok_or(ModelError::ForeignCache)
}

/// Checks that `n` more tokens fit in `cache` and returns their positions.
pub(crate) fn next_positions<B: Backend>(cache: &KvCache<B>, n: usize) -> Result<Vec<usize>> {
    if n == 0 {
        return Err(ModelError::EmptyInput);
    }
    if cache.len + n > cache.capacity {
        return Err(ModelError::ContextOverflow(n, cache.capacity, cache.len));
    }
    Ok((cache.len..cache.len + n).collect())
}
