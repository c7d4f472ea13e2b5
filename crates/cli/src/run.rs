use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use synaptix_infer::{ChatMessage, ChatTemplate, Engine, GenerateOptions};
use synaptix_models::{NoTap, Tap};
use synaptix_sample::SamplerConfig;

use crate::dump::NpyDump;

#[derive(Args)]
#[command(after_help = "Examples:\n  \
    synaptix run model.gguf \"Once upon a time\" -n 64\n  \
    synaptix run model.gguf \"Write a haiku about rust\" --chat --temp 0.7 --seed 1\n  \
    synaptix run model.gguf \"2+2=\" --temp 0 --json")]
pub struct RunArgs {
    /// GGUF model file or .syn bundle, or the name of a fetched model (gemma3-270m, qwen2.5-coder-0.5b)
    pub model: PathBuf,
    /// Prompt text (use --file to read it from a file)
    #[arg(required_unless_present = "file")]
    pub prompt: Option<String>,
    /// Read the prompt from this file
    #[arg(short = 'f', long, conflicts_with = "prompt")]
    pub file: Option<PathBuf>,
    /// Maximum number of tokens to generate
    #[arg(short = 'n', long = "max-tokens", default_value_t = 256)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 is greedy (always the most likely token)
    #[arg(long, default_value_t = 0.8)]
    pub temp: f32,
    /// Keep only the K most likely tokens (0: off)
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Keep the most likely tokens whose probabilities sum to P (1: off)
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Drop tokens less likely than P times the most likely one (0: off)
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    /// Penalize tokens repeated within the last --repeat-last-n tokens (1: off)
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Window for the repetition penalties
    #[arg(long, default_value_t = 64)]
    pub repeat_last_n: usize,
    /// Subtracted from the logit of every token already in the window
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    /// Subtracted per occurrence in the window
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Random seed (default: random, printed to stderr)
    #[arg(long)]
    pub seed: Option<u64>,
    /// Context size in tokens (0: 4096, or the model's training context if smaller)
    #[arg(short = 'c', long = "ctx-size", default_value_t = 0)]
    pub ctx_size: usize,
    /// CPU threads (0: all cores)
    #[arg(short = 't', long, default_value_t = 0)]
    pub threads: usize,
    /// Where to run: auto (a GPU if one is usable, else the CPU), cpu, cuda, cuda:N
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Wrap the prompt in the model's chat template as a user message
    #[arg(long)]
    pub chat: bool,
    /// System message for --chat
    #[arg(short = 's', long, requires = "chat")]
    pub system: Option<String>,
    /// Keep generating after end-of-generation tokens
    #[arg(long)]
    pub ignore_eos: bool,
    /// Print one JSON object (token ids, text, timings) instead of streaming text
    #[arg(long)]
    pub json: bool,
    /// Write the named intermediates of the prompt's forward pass as .npy files into DIR
    #[arg(long, value_name = "DIR")]
    pub dump_tensors: Option<PathBuf>,
    /// Only dump intermediates whose name contains this text (e.g. "blk.0.")
    #[arg(long, requires = "dump_tensors")]
    pub dump_filter: Option<String>,
}

pub fn run(mut a: RunArgs) -> Result<()> {
    a.model = synaptix_bundle::cache::resolve_model(&a.model.to_string_lossy());
    let threads = crate::threads::init(a.threads)?;
    let prompt = match (&a.prompt, &a.file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) => std::fs::read_to_string(f)
            .with_context(|| format!("cannot read prompt file {}", f.display()))?,
        (None, None) => bail!("no prompt given"),
    };
    let seed = a.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    });
    let sampler = SamplerConfig {
        temperature: a.temp,
        top_k: a.top_k,
        top_p: a.top_p,
        min_p: a.min_p,
        repeat_penalty: a.repeat_penalty,
        presence_penalty: a.presence_penalty,
        frequency_penalty: a.frequency_penalty,
        penalty_last_n: a.repeat_last_n,
        seed,
    };
    sampler.validate()?;

    let (device, notice) =
        crate::device::resolve_for_model(&a.device, std::path::Path::new(&a.model))?;
    let engine = Engine::load(&a.model, device)?;
    if let Some(n) = notice {
        eprintln!("{n}");
    }
    let n_ctx = engine.context_size(a.ctx_size)?;
    let text = if a.chat {
        chat_prompt(&engine, a.system.as_deref(), &prompt)?
    } else {
        prompt
    };
    let prompt_ids = engine.tokenize_prompt(&text)?;
    let opts = GenerateOptions {
        max_tokens: a.max_tokens,
        n_ctx,
        sampler,
        stop_at_eog: !a.ignore_eos,
    };
    let mut dump = match &a.dump_tensors {
        Some(dir) => Some(
            NpyDump::new(dir.clone(), a.dump_filter.clone())
                .with_context(|| format!("cannot create {}", dir.display()))?,
        ),
        None => None,
    };
    let mut no_tap = NoTap;
    let tap: &mut dyn Tap = match dump.as_mut() {
        Some(d) => d,
        None => &mut no_tap,
    };
    let stdout = std::io::stdout();
    let stream = !a.json;
    let gen = engine.generate(&prompt_ids, &opts, false, tap, |piece| {
        if stream {
            let mut out = stdout.lock();
            // A closed pipe (e.g. `| head`) ends generation quietly.
            out.write_all(piece.as_bytes()).is_ok() && out.flush().is_ok()
        } else {
            true
        }
    })?;
    if let Some(d) = &dump {
        if let Some(e) = &d.error {
            bail!("writing intermediates: {e}");
        }
        eprintln!("dumped {} intermediates", d.written);
    }
    let t = &gen.timings;
    if a.json {
        let out = serde_json::json!({
            "model": a.model.display().to_string(),
            "prompt_tokens": gen.prompt_tokens,
            "tokens": gen.tokens,
            "text": gen.text,
            "stop": gen.stop.as_str(),
            "seed": seed,
            "threads": threads,
            "device": engine.model.device(),
            "n_ctx": n_ctx,
            "timings": {
                "load_s": engine.load_seconds,
                "prompt_n": t.prompt_tokens,
                "prompt_s": t.prompt_seconds,
                "prompt_tps": t.prompt_tps(),
                "gen_n": t.generated_tokens,
                "gen_s": t.generation_seconds,
                "gen_tps": t.generation_tps(),
            }
        });
        println!("{out}");
    } else {
        println!();
        eprintln!(
            "{} | load {:.2} s | prompt {} tokens, {:.1} t/s | generation {} tokens, {:.1} t/s | stop: {} | seed {seed}, {threads} threads",
            engine.model.device(),
            engine.load_seconds,
            t.prompt_tokens,
            t.prompt_tps(),
            t.generated_tokens,
            t.generation_tps(),
            gen.stop.as_str()
        );
    }
    Ok(())
}

/// The model's chat template around one user message (and an optional system message).
pub fn chat_prompt(engine: &Engine, system: Option<&str>, user: &str) -> Result<String> {
    let template = ChatTemplate::for_engine(engine, None)?;
    let message = ChatMessage {
        role: "user".into(),
        content: user.into(),
    };
    Ok(template.render(system, &[message], true)?)
}
