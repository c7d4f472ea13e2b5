//! `synaptix perplexity`: a model's perplexity over a text, as llama-perplexity measures it. The
//! text is tokenized whole (BOS first where the model adds one) and cut into chunks of
//! `--ctx-size` tokens; each chunk runs from an empty KV cache with its first token replaced by
//! BOS (where the model adds one), and only the second half of each chunk is scored, so that
//! every scored token has at least half a context before it. A token's score is its log
//! probability under the logits of the position before it (log-softmax with an f64 sum of the
//! exponentials); the perplexity is e to the mean negative log probability over every scored
//! token so far, printed after each chunk, and the final estimate carries the standard error
//! of that mean, scaled to the perplexity.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use synaptix_infer::Engine;
use synaptix_models::{Logits, NoTap};

#[derive(Args)]
#[command(after_help = "Examples:\n  \
    synaptix perplexity model.gguf -f wiki.test.raw\n  \
    synaptix perplexity qwen2.5-coder-0.5b -f text.txt -c 256 --chunks 8 --json\n\n\
    The figures are llama-perplexity's for the same file, text and --ctx-size: each chunk's\n\
    first half is context, its second half is scored.")]
pub struct PerplexityArgs {
    /// The model (GGUF, .syn, a Hugging Face or .symb directory, or a fetched model's name)
    pub model: PathBuf,
    /// The text to score
    #[arg(short = 'f', long = "file", value_name = "TEXT")]
    pub text: PathBuf,
    /// Tokens per chunk (the text must hold at least two chunks)
    #[arg(short = 'c', long = "ctx-size", default_value_t = 512)]
    pub ctx_size: usize,
    /// Score at most this many chunks (default: all the text holds)
    #[arg(long)]
    pub chunks: Option<usize>,
    /// CPU threads (0: all cores)
    #[arg(short = 't', long, default_value_t = 0)]
    pub threads: usize,
    /// Where to run: auto (a GPU if one is usable, else the CPU), cpu, cuda, cuda:N
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Print one JSON object instead of text
    #[arg(long)]
    pub json: bool,
}

/// Running sums of the scored tokens' log probabilities.
#[derive(Default)]
struct Scores {
    count: usize,
    /// Σ -log p
    nll: f64,
    /// Σ (log p)²
    nll2: f64,
}

impl Scores {
    /// Scores `targets[i]` under logits row i of `logits` (rows of `n_vocab`).
    fn add(&mut self, logits: &[f32], n_vocab: usize, targets: &[u32]) {
        for (row, &target) in logits.chunks_exact(n_vocab).zip(targets) {
            let max = row.iter().copied().fold(row[0], f32::max);
            let sum: f64 = row.iter().map(|&l| (l - max).exp() as f64).sum();
            let log_p = (row[target as usize] - max) as f64 - sum.ln();
            self.nll -= log_p;
            self.nll2 += log_p * log_p;
            self.count += 1;
        }
    }

    fn perplexity(&self) -> f64 {
        (self.nll / self.count as f64).exp()
    }

    /// The standard error of the mean negative log probability, times the perplexity.
    fn error(&self) -> f64 {
        let n = self.count as f64;
        let mean = self.nll / n;
        let variance = self.nll2 / n - mean * mean;
        if variance > 0.0 && self.count > 1 {
            (variance / (n - 1.0)).sqrt() * self.perplexity()
        } else {
            0.0
        }
    }
}

pub fn run(a: PerplexityArgs) -> Result<()> {
    crate::threads::init(a.threads)?;
    let start = Instant::now();
    let model_path = synaptix_bundle::cache::resolve_model(&a.model.to_string_lossy());
    if a.ctx_size < 16 {
        bail!("--ctx-size {}: chunks need at least 16 tokens", a.ctx_size);
    }
    let text = std::fs::read_to_string(&a.text)
        .with_context(|| format!("cannot read {}", a.text.display()))?;
    let (device, notice) = crate::device::resolve_for_model(&a.device, &model_path)?;
    let engine = Engine::load(&model_path, device)?;
    if let Some(n) = notice {
        eprintln!("{n}");
    }
    let train = engine.model.info().hparams.n_ctx_train;
    if train > 0 && a.ctx_size > train {
        bail!(
            "--ctx-size {} is longer than the model's training context ({train})",
            a.ctx_size
        );
    }
    let tokens = engine.tokenizer.encode(&text, true, false)?;
    if tokens.len() < 2 * a.ctx_size {
        bail!(
            "{} holds {} tokens: perplexity with chunks of {} needs at least {} (lower --ctx-size or give more text)",
            a.text.display(),
            tokens.len(),
            a.ctx_size,
            2 * a.ctx_size
        );
    }
    let available = tokens.len() / a.ctx_size;
    let n_chunks = a.chunks.map_or(available, |c| c.min(available));
    if n_chunks == 0 {
        bail!("--chunks 0: nothing to score");
    }
    let n_vocab = engine.model.info().hparams.n_vocab;
    if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
        bail!("the tokenizer gave id {bad}, outside the model's vocabulary of {n_vocab}");
    }
    let bos = engine
        .tokenizer
        .bos()
        .filter(|_| engine.tokenizer.add_bos());
    let first = a.ctx_size / 2;
    let progress = !a.json && std::io::stderr().is_terminal();
    let mut scores = Scores::default();
    let mut chunk_ppl = Vec::with_capacity(n_chunks);
    let mut stdout = std::io::stdout();
    for c in 0..n_chunks {
        let chunk_start = Instant::now();
        let mut chunk = tokens[c * a.ctx_size..(c + 1) * a.ctx_size].to_vec();
        if let Some(b) = bos {
            chunk[0] = b;
        }
        let mut cache = engine.model.new_cache(a.ctx_size)?;
        // The first half only as context (no logits kept), then the second half with every
        // position's logits: position first + i predicts the original token first + i + 1.
        engine
            .model
            .forward(&chunk[..first], cache.as_mut(), Logits::Last, &mut NoTap)?;
        let logits =
            engine
                .model
                .forward(&chunk[first..], cache.as_mut(), Logits::All, &mut NoTap)?;
        let targets = &tokens[c * a.ctx_size + first + 1..(c + 1) * a.ctx_size];
        if logits.len() < targets.len() * n_vocab {
            bail!(
                "the model returned {} logits for {} positions of {n_vocab}",
                logits.len(),
                a.ctx_size - first
            );
        }
        scores.add(&logits, n_vocab, targets);
        chunk_ppl.push(scores.perplexity());
        if !a.json {
            print!("[{}]{:.4},", c + 1, scores.perplexity());
            stdout.flush().ok();
        }
        if progress && c == 0 {
            let per_chunk = chunk_start.elapsed().as_secs_f64();
            eprintln!(
                "{:.2} s a chunk, about {:.1} min for {n_chunks}",
                per_chunk,
                per_chunk * n_chunks as f64 / 60.0
            );
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "model": model_path.display().to_string(),
                "device": engine.model.device(),
                "chunks": n_chunks,
                "ctx_size": a.ctx_size,
                "scored_tokens": scores.count,
                "perplexity": scores.perplexity(),
                "error": scores.error(),
                "chunk_perplexity": chunk_ppl,
                "seconds": seconds,
            })
        );
    } else {
        println!();
        println!(
            "Final estimate: PPL = {:.4} +/- {:.5} ({} tokens scored in {n_chunks} chunks of {}, {seconds:.1} s)",
            scores.perplexity(),
            scores.error(),
            scores.count,
            a.ctx_size
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Scores;

    /// Uniform logits give perplexity n_vocab, whatever the targets; a certain pick gives 1.
    #[test]
    fn scores_known_distributions() {
        let mut s = Scores::default();
        s.add(&[0.5; 8 * 3], 8, &[0, 3, 7]);
        assert!((s.perplexity() - 8.0).abs() < 1e-9, "{}", s.perplexity());
        assert!(s.error().abs() < 1e-9);
        let mut sure = Scores::default();
        let mut row = vec![-1e4f32; 5];
        row[2] = 0.0;
        sure.add(&row, 5, &[2]);
        assert!((sure.perplexity() - 1.0).abs() < 1e-9);
        // Two tokens with probabilities 1/2 and 1/4: ppl = e^((ln 2 + ln 4) / 2) = sqrt(8).
        let mut two = Scores::default();
        let half = [0.0f32, 0.0];
        let quarter = [0.0f32, 0.0, 0.0, 0.0];
        two.add(&half, 2, &[1]);
        two.add(&quarter, 4, &[0]);
        assert!((two.perplexity() - 8f64.sqrt()).abs() < 1e-9);
        assert!(two.error() > 0.0);
    }
}
