//! `synaptix embed`: sentence embeddings with a BERT sentence-transformers model.

use std::io::Read;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use synaptix_models::bert::{cosine, BertEmbedder};
use synaptix_tokenizer::Tokenizer;

/// Texts per forward pass (sentence-transformers' default batch size).
const BATCH: usize = 32;
/// Values shown per embedding in the default output.
const PREVIEW: usize = 6;

#[derive(Args)]
#[command(
    after_help = "Tokenizes each text with the directory's tokenizer.json ([CLS] ... [SEP]), cuts it \
    to sentence_bert_config.json's max_seq_length as sentence-transformers does (256 tokens for \
    all-MiniLM-L6-v2; a note on stderr says so), runs the BERT encoder (texts in batches of 32, \
    each attending only to its own tokens), pools as 1_Pooling/config.json says (mean or CLS) and \
    L2-normalises when modules.json lists a Normalize module. Prints one line per text (token \
    count, norm, the first values) and, for two texts or more, their cosine similarities.\n\n\
    Examples:\n  \
    scripts/fetch-models.sh all-minilm-l6-v2\n  \
    synaptix embed all-minilm-l6-v2 \"A man is playing a guitar.\" \"Someone plays the guitar.\"\n  \
    synaptix embed all-minilm-l6-v2 --file sentences.txt --json > embeddings.json\n  \
    printf 'first\\nsecond\\n' | synaptix embed ~/models/all-MiniLM-L6-v2 --file -"
)]
pub struct EmbedArgs {
    /// Sentence-transformers model directory (model.safetensors, config.json, tokenizer.json,
    /// modules.json, 1_Pooling/config.json), or the name of a fetched model (all-minilm-l6-v2)
    pub model: PathBuf,
    /// Texts to embed (each one argument)
    pub texts: Vec<String>,
    /// Also read texts from a file, one per line (blank lines skipped); - reads stdin
    #[arg(short = 'f', long)]
    pub file: Option<PathBuf>,
    /// Print one JSON object (model, dim, embeddings, token ids, timings)
    #[arg(long)]
    pub json: bool,
    /// CPU threads (0: all cores)
    #[arg(short = 't', long, default_value_t = 0)]
    pub threads: usize,
    /// Where to run: auto or cpu (embeddings run on the CPU for now; cuda is an error)
    #[arg(long, default_value = "auto")]
    pub device: String,
}

pub fn run(a: EmbedArgs) -> Result<()> {
    crate::device::require_cpu(&a.device, "embed runs")?;
    let mut texts = a.texts.clone();
    if let Some(path) = &a.file {
        let content = if path.as_os_str() == "-" {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .context("reading texts from stdin")?;
            s
        } else {
            std::fs::read_to_string(path)
                .with_context(|| format!("{}: cannot read texts", path.display()))?
        };
        texts.extend(
            content
                .lines()
                .filter(|l| !l.trim().is_empty())
                .map(str::to_string),
        );
    }
    if texts.is_empty() {
        bail!("no texts to embed: give them as arguments or with --file");
    }
    let model_arg = synaptix_bundle::cache::resolve_model(&a.model.to_string_lossy());
    let threads = crate::threads::init(a.threads)?;

    let t0 = Instant::now();
    let model = BertEmbedder::load(&model_arg)?;
    let tokenizer = Tokenizer::from_tokenizer_json(&model.paths().tokenizer)
        .with_context(|| format!("{}", model.paths().tokenizer.display()))?;
    let load_s = t0.elapsed().as_secs_f64();

    let t1 = Instant::now();
    let mut ids = Vec::with_capacity(texts.len());
    for (i, text) in texts.iter().enumerate() {
        let full = tokenizer.encode(text, true, false)?;
        let n = full.len();
        let cut = model.truncate(full);
        if cut.len() < n {
            eprintln!(
                "note: text {} has {n} tokens; cut to {} (the model's max_seq_length)",
                i + 1,
                cut.len()
            );
        }
        ids.push(cut);
    }
    let tokenize_s = t1.elapsed().as_secs_f64();

    let t2 = Instant::now();
    let mut embeddings = Vec::with_capacity(texts.len());
    for batch in ids.chunks(BATCH) {
        embeddings.extend(model.embed(batch)?);
    }
    let embed_s = t2.elapsed().as_secs_f64();
    let n_tokens: usize = ids.iter().map(Vec::len).sum();

    if a.json {
        let out = serde_json::json!({
            "model": model_arg.display().to_string(),
            "dim": model.dim(),
            "pooling": model.pooling().name(),
            "normalized": model.normalize(),
            "embeddings": embeddings,
            "tokens": ids,
            "timings": {
                "load_s": load_s,
                "tokenize_s": tokenize_s,
                "embed_s": embed_s,
                "tokens": n_tokens,
                "threads": threads,
            },
        });
        println!("{}", serde_json::to_string(&out)?);
        return Ok(());
    }

    for (i, ((text, e), ids)) in texts.iter().zip(&embeddings).zip(&ids).enumerate() {
        let norm = e.iter().map(|&v| v as f64 * v as f64).sum::<f64>().sqrt();
        let head: Vec<String> = e.iter().take(PREVIEW).map(|v| format!("{v:+.4}")).collect();
        println!(
            "[{}] {:>3} tokens  norm {norm:.4}  [{}, ...]  {}",
            i + 1,
            ids.len(),
            head.join(", "),
            preview(text, 48)
        );
    }
    if embeddings.len() >= 2 {
        println!("\ncosine similarity:");
        let n = embeddings.len();
        let header: Vec<String> = (1..=n).map(|j| format!("{j:>7}")).collect();
        println!("     {}", header.join(""));
        for i in 0..n {
            let row: Vec<String> = (0..n)
                .map(|j| format!("{:>7.3}", cosine(&embeddings[i], &embeddings[j])))
                .collect();
            println!("{:>4} {}", i + 1, row.join(""));
        }
    }
    eprintln!(
        "\n{} text(s), {n_tokens} tokens, dim {} ({} pooling{}): load {:.0} ms, embed {:.1} ms ({} threads)",
        texts.len(),
        model.dim(),
        model.pooling().name(),
        if model.normalize() { ", normalized" } else { "" },
        load_s * 1e3,
        embed_s * 1e3,
        threads
    );
    Ok(())
}

/// The text on one line, cut to `max` characters.
fn preview(text: &str, max: usize) -> String {
    let one: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if one.chars().count() > max {
        let cut: String = one.chars().take(max - 1).collect();
        format!("{cut}…")
    } else {
        one
    }
}
