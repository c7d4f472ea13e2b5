//! `synaptix chat`: an interactive conversation, or a scripted one from piped stdin.

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use synaptix_infer::{
    ChatSession, ChatTemplate, ContextOverflow, Engine, GenerateOptions, StopReason,
};
use synaptix_sample::SamplerConfig;

#[derive(Clone, Copy, ValueEnum)]
pub enum Overflow {
    /// Refuse a turn that does not fit (the conversation is kept)
    Error,
    /// Drop the oldest turns until the new one fits (the system message stays)
    Shift,
}

#[derive(Args)]
#[command(after_help = "In the conversation:\n  \
    /reset        forget the conversation (the system message stays)\n  \
    /save FILE    write the conversation as JSON\n  \
    /load FILE    continue a saved conversation\n  \
    /stats        tokens and timings of each turn (time to first token, reuse of the cache)\n  \
    /help         this list\n  \
    /exit         leave (or Ctrl-D)\n\
    Ctrl-C stops the current answer and keeps the conversation.\n\
    With stdin not a terminal, every line is one user message (commands work too), so chat is scriptable:\n  \
    printf 'Hi!\\nAnd in French?\\n' | synaptix chat qwen2.5-coder-0.5b --temp 0\n\n\
    Examples:\n  \
    synaptix chat qwen2.5-coder-0.5b -s \"You are a terse assistant.\"\n  \
    synaptix chat model.gguf --chat-template template.jinja -c 8192 --context-overflow shift")]
pub struct ChatArgs {
    /// GGUF model file or .syn bundle, or the name of a fetched model (gemma3-270m, qwen2.5-coder-0.5b)
    pub model: PathBuf,
    /// System message
    #[arg(short = 's', long)]
    pub system: Option<String>,
    /// Jinja chat template to use instead of the model's own
    #[arg(long, value_name = "FILE")]
    pub chat_template: Option<PathBuf>,
    /// Context size in tokens (0: 4096, or the model's training context if smaller)
    #[arg(short = 'c', long = "ctx-size", default_value_t = 0)]
    pub ctx_size: usize,
    /// When the conversation outgrows the context
    #[arg(long, value_enum, default_value = "error")]
    pub context_overflow: Overflow,
    /// Longest answer in tokens
    #[arg(short = 'n', long = "max-tokens", default_value_t = 1024)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 is greedy
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
    /// Window for the repetition penalty
    #[arg(long, default_value_t = 64)]
    pub repeat_last_n: usize,
    /// Random seed (default: random)
    #[arg(long)]
    pub seed: Option<u64>,
    /// CPU threads (0: all cores)
    #[arg(short = 't', long, default_value_t = 0)]
    pub threads: usize,
    /// Where to run: auto (a GPU if one is usable, else the CPU), cpu, cuda, cuda:N
    #[arg(long, default_value = "auto")]
    pub device: String,
}

pub fn run(mut a: ChatArgs) -> Result<()> {
    a.model = synaptix_bundle::cache::resolve_model(&a.model.to_string_lossy());
    crate::threads::init(a.threads)?;
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
        penalty_last_n: a.repeat_last_n,
        seed,
        ..Default::default()
    };
    sampler.validate()?;
    let custom = match &a.chat_template {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("cannot read chat template {}", path.display()))?,
        ),
        None => None,
    };
    let (device, notice) =
        crate::device::resolve_for_model(&a.device, std::path::Path::new(&a.model))?;
    let engine = Engine::load(&a.model, device)?;
    if let Some(n) = notice {
        eprintln!("{n}");
    }
    let template = ChatTemplate::for_engine(&engine, custom)?;
    let opts = GenerateOptions {
        max_tokens: a.max_tokens,
        n_ctx: engine.context_size(a.ctx_size)?,
        sampler,
        stop_at_eog: true,
    };
    let overflow = match a.context_overflow {
        Overflow::Error => ContextOverflow::Error,
        Overflow::Shift => ContextOverflow::Shift,
    };
    let mut session = ChatSession::new(&engine, template, a.system.clone(), opts, overflow)?;

    // Ctrl-C stops the answer being written; the conversation goes on.
    let interrupted = Arc::new(AtomicBool::new(false));
    {
        let flag = interrupted.clone();
        ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst))
            .context("cannot install the Ctrl-C handler")?;
    }

    let interactive = std::io::stdin().is_terminal();
    if interactive {
        eprintln!(
            "synaptix chat: {} on {}, context {} tokens. /help for commands, Ctrl-D to leave.",
            engine.model.info().name,
            engine.model.device(),
            session.capacity()
        );
    }
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        if interactive {
            eprint!("> ");
            std::io::stderr().flush().ok();
        }
        let Some(line) = lines.next() else { break };
        let line = line.context("cannot read stdin")?;
        let line = line.trim_end_matches(['\r', '\n']);
        if line.trim().is_empty() {
            continue;
        }
        if let Some(command) = line.strip_prefix('/') {
            if !handle_command(&mut session, command)? {
                break;
            }
            continue;
        }
        interrupted.store(false, Ordering::SeqCst);
        let mut out = std::io::stdout();
        let reply = session.send(line, |piece| {
            let _ = out.write_all(piece.as_bytes());
            let _ = out.flush();
            !interrupted.load(Ordering::SeqCst)
        });
        match reply {
            Ok(r) => {
                println!();
                if r.stats.dropped_messages > 0 {
                    eprintln!(
                        "[context full: dropped the {} oldest messages to make room]",
                        r.stats.dropped_messages
                    );
                }
                match r.stop {
                    StopReason::Cancelled => eprintln!("[stopped]"),
                    StopReason::MaxTokens => eprintln!("[answer cut at --max-tokens {}]", a.max_tokens),
                    StopReason::ContextFull => eprintln!(
                        "[context full ({} tokens): the answer was cut; /reset, or restart with a larger --ctx-size or --context-overflow shift]",
                        session.capacity()
                    ),
                    StopReason::EndOfGeneration => {}
                }
            }
            Err(e) => {
                // A refused turn leaves the conversation as it was; a script stops there.
                if !interactive {
                    bail!("{e}");
                }
                eprintln!("error: {e}");
            }
        }
    }
    Ok(())
}

/// Runs a `/command`; false when the chat should end.
fn handle_command(session: &mut ChatSession, command: &str) -> Result<bool> {
    let (name, arg) = match command.split_once(char::is_whitespace) {
        Some((n, a)) => (n, a.trim()),
        None => (command.trim(), ""),
    };
    let need_path = |what: &str| -> Result<&Path> {
        if arg.is_empty() {
            bail!("/{what} needs a file name");
        }
        Ok(Path::new(arg))
    };
    match name {
        "exit" | "quit" => return Ok(false),
        "reset" => {
            session.reset();
            eprintln!("[conversation cleared]");
        }
        "save" => {
            let path = need_path("save")?;
            session.save(path)?;
            eprintln!(
                "[saved {} messages to {}]",
                session.messages().len(),
                path.display()
            );
        }
        "load" => {
            let path = need_path("load")?;
            session.load(path)?;
            eprintln!(
                "[loaded {} messages from {}]",
                session.messages().len(),
                path.display()
            );
        }
        "stats" => {
            eprintln!(
                "{} messages, {} of {} context tokens cached",
                session.messages().len(),
                session.cached_tokens(),
                session.capacity()
            );
            for (i, t) in session.turns.iter().enumerate() {
                eprintln!(
                    "turn {}: {} context tokens ({} reused from the cache, {} evaluated), first token after {:.3} s, {} tokens at {:.1} t/s",
                    i + 1,
                    t.context_tokens,
                    t.reused_tokens,
                    t.evaluated_tokens,
                    t.time_to_first_token,
                    t.generated_tokens,
                    t.generation_tps
                );
            }
        }
        "help" => eprintln!(
            "/reset  /save FILE  /load FILE  /stats  /help  /exit; Ctrl-C stops an answer"
        ),
        other => eprintln!("unknown command /{other}: /help lists them"),
    }
    Ok(true)
}
