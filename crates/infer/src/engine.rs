use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use synaptix_bundle::{GgufError, GgufFile};
use synaptix_core::Device;
use synaptix_models::{Cache, CausalLm, Logits, ModelError, NoTap, Tap};
use synaptix_sample::{SampleError, Sampler, SamplerConfig};
use synaptix_tokenizer::{StreamDecoder, Tokenizer, TokenizerError};

#[derive(Debug, thiserror::Error)]
pub enum InferError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Sample(#[from] SampleError),
    #[error("the prompt has {prompt} tokens but the context holds {n_ctx}: shorten it or raise --ctx-size")]
    PromptTooLong { prompt: usize, n_ctx: usize },
    #[error("the KV cache holds {cached} positions but the history has {history} tokens")]
    CacheMismatch { cached: usize, history: usize },
    #[error("the prompt is empty after tokenization")]
    EmptyPrompt,
    #[error("invalid context size {0}: it must be at least 1 and at most {1}")]
    BadContextSize(usize, usize),
    #[error("chat template: {0}")]
    Template(String),
    #[error("the conversation needs {needed} tokens but the context holds {n_ctx} (--context-overflow {policy}): /reset, or raise --ctx-size")]
    ContextOverflow {
        needed: usize,
        n_ctx: usize,
        policy: &'static str,
    },
    #[error("{path}: {detail}")]
    Io { path: String, detail: String },
}

pub type Result<T, E = InferError> = std::result::Result<T, E>;

/// A loaded model with its tokenizer.
pub struct Engine {
    pub file: Arc<GgufFile>,
    pub model: Box<dyn CausalLm>,
    pub tokenizer: Tokenizer,
    /// Seconds spent mapping and building the model.
    pub load_seconds: f64,
}

#[derive(Debug, Clone)]
pub struct GenerateOptions {
    pub max_tokens: usize,
    pub n_ctx: usize,
    pub sampler: SamplerConfig,
    /// Stop at the vocabulary's end-of-generation tokens.
    pub stop_at_eog: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// An end-of-generation token was produced (it is included in `tokens`, not in `text`).
    EndOfGeneration,
    MaxTokens,
    /// The context is full.
    ContextFull,
    /// The callback asked to stop.
    Cancelled,
}

impl StopReason {
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::EndOfGeneration => "eog",
            StopReason::MaxTokens => "max_tokens",
            StopReason::ContextFull => "context_full",
            StopReason::Cancelled => "cancelled",
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct Timings {
    pub prompt_tokens: usize,
    pub prompt_seconds: f64,
    pub generated_tokens: usize,
    pub generation_seconds: f64,
}

impl Timings {
    pub fn prompt_tps(&self) -> f64 {
        rate(self.prompt_tokens, self.prompt_seconds)
    }
    pub fn generation_tps(&self) -> f64 {
        rate(self.generated_tokens, self.generation_seconds)
    }
}

fn rate(n: usize, s: f64) -> f64 {
    if s > 0.0 {
        n as f64 / s
    } else {
        0.0
    }
}

/// The outcome of [`Engine::generate`].
#[derive(Debug, Clone)]
pub struct Generation {
    pub prompt_tokens: Vec<u32>,
    pub tokens: Vec<u32>,
    pub text: String,
    pub stop: StopReason,
    pub timings: Timings,
    /// Logits after the prompt (before any sampling), when asked for.
    pub first_logits: Option<Vec<f32>>,
}

impl Engine {
    /// Loads a model onto `device` (`Device::Cpu` or `Device::Cuda(n)`).
    pub fn load(path: impl AsRef<Path>, device: Device) -> Result<Engine> {
        let start = Instant::now();
        let file = Arc::new(synaptix_models::open_model_file(path.as_ref())?);
        let model = synaptix_models::load_on(file.clone(), device)?;
        let tokenizer = Tokenizer::from_gguf(&file)?;
        Ok(Engine {
            file,
            model,
            tokenizer,
            load_seconds: start.elapsed().as_secs_f64(),
        })
    }

    /// Tokenizes a prompt as llama.cpp does for completion: BOS per the vocabulary, special
    /// tokens written in the text recognised.
    pub fn tokenize_prompt(&self, prompt: &str) -> Result<Vec<u32>> {
        Ok(self.tokenizer.encode(prompt, true, true)?)
    }

    /// A context size checked against the model: `0` picks the default (4096, or the
    /// training context when smaller).
    pub fn context_size(&self, requested: usize) -> Result<usize> {
        const DEFAULT_CTX: usize = 4096;
        let train = self.model.info().hparams.n_ctx_train.max(1);
        match requested {
            0 => Ok(DEFAULT_CTX.min(train)),
            n if n > train => Err(InferError::BadContextSize(n, train)),
            n => Ok(n),
        }
    }

    pub fn new_cache(&self, n_ctx: usize) -> Result<Box<dyn Cache>> {
        Ok(self.model.new_cache(n_ctx)?)
    }

    /// Evaluates `prompt` and samples up to `opts.max_tokens` tokens. `on_piece` receives each
    /// chunk of decoded text (valid UTF-8) and returns `false` to stop.
    pub fn generate(
        &self,
        prompt: &[u32],
        opts: &GenerateOptions,
        keep_first_logits: bool,
        tap: &mut dyn Tap,
        on_piece: impl FnMut(&str) -> bool,
    ) -> Result<Generation> {
        if prompt.len() > opts.n_ctx {
            return Err(InferError::PromptTooLong {
                prompt: prompt.len(),
                n_ctx: opts.n_ctx,
            });
        }
        let mut cache = self.new_cache(opts.n_ctx)?;
        self.generate_in(
            cache.as_mut(),
            &[],
            prompt,
            opts,
            keep_first_logits,
            tap,
            on_piece,
        )
    }

    /// [`Engine::generate`] continuing `cache`, which holds `history` (positions
    /// `0..history.len()`; they also feed the sampler's penalty window): evaluates `prompt` after
    /// them and samples. The cache keeps everything evaluated, so a conversation's next turn
    /// only evaluates its new tokens.
    #[allow(clippy::too_many_arguments)]
    pub fn generate_in(
        &self,
        cache: &mut dyn Cache,
        history: &[u32],
        prompt: &[u32],
        opts: &GenerateOptions,
        keep_first_logits: bool,
        tap: &mut dyn Tap,
        mut on_piece: impl FnMut(&str) -> bool,
    ) -> Result<Generation> {
        if prompt.is_empty() {
            return Err(InferError::EmptyPrompt);
        }
        if cache.len() != history.len() {
            return Err(InferError::CacheMismatch {
                cached: cache.len(),
                history: history.len(),
            });
        }
        if history.len() + prompt.len() > cache.capacity() {
            return Err(InferError::PromptTooLong {
                prompt: history.len() + prompt.len(),
                n_ctx: cache.capacity(),
            });
        }
        let mut sampler = Sampler::new(opts.sampler.clone())?;
        for &t in history.iter().chain(prompt) {
            sampler.accept(t);
        }
        let mut timings = Timings {
            prompt_tokens: prompt.len(),
            ..Default::default()
        };
        let start = Instant::now();
        let mut logits = self.model.forward(prompt, cache, Logits::Last, tap)?;
        timings.prompt_seconds = start.elapsed().as_secs_f64();
        let first_logits = keep_first_logits.then(|| logits.clone());

        let mut stream = StreamDecoder::new(&self.tokenizer);
        let mut tokens = Vec::new();
        let mut text = String::new();
        let mut stop = StopReason::MaxTokens;
        let gen_start = Instant::now();
        // After the prompt, the model's device does what it can of each draw (penalties, then
        // the arg-max or the top-k candidates), so only a few numbers cross to the host.
        let mut chosen: Option<u32> = None;
        while tokens.len() < opts.max_tokens {
            let token = match chosen.take() {
                Some(t) => t,
                None => sampler.sample(&mut logits)?,
            };
            sampler.accept(token);
            tokens.push(token);
            if opts.stop_at_eog && self.tokenizer.is_eog(token) {
                stop = StopReason::EndOfGeneration;
                break;
            }
            let piece = stream.push(token);
            if !piece.is_empty() {
                text.push_str(&piece);
                if !on_piece(&piece) {
                    stop = StopReason::Cancelled;
                    break;
                }
            }
            if tokens.len() == opts.max_tokens {
                break;
            }
            if cache.len() >= cache.capacity() {
                stop = StopReason::ContextFull;
                break;
            }
            if let Some(pick) = sampler.device_pick() {
                // Another step follows this one unless the token limit is reached (or the pick
                // ends the generation): the device may start it on its own pick.
                let more = tokens.len() + 1 < opts.max_tokens;
                let candidates = self.model.forward_pick_more(&[token], cache, &pick, more)?;
                chosen = Some(if pick.top_k == 0 {
                    candidates
                        .first()
                        .map(|c| c.0)
                        .ok_or(synaptix_sample::SampleError::EmptyLogits)?
                } else {
                    sampler.pick(candidates)?
                });
            } else {
                logits = self
                    .model
                    .forward(&[token], cache, Logits::Last, &mut NoTap)?;
            }
        }
        let rest = stream.finish();
        if !rest.is_empty() {
            text.push_str(&rest);
            on_piece(&rest);
        }
        timings.generated_tokens = tokens.len();
        timings.generation_seconds = gen_start.elapsed().as_secs_f64();
        Ok(Generation {
            prompt_tokens: prompt.to_vec(),
            tokens,
            text,
            stop,
            timings,
            first_logits,
        })
    }
}
