//! `synaptix imatrix`: an importance matrix for `quantize --imatrix`, as llama-imatrix computes
//! one: the text is tokenized whole and cut into chunks of `--ctx-size` tokens (the first of
//! each replaced by BOS where the model adds one), each chunk is evaluated from an empty KV
//! cache, and for every weight matrix of the layers each column's squared input is summed
//! over the rows that met it (per expert for mixture-of-experts layers), with a count of rows.
//! The file is llama.cpp's GGUF layout (see `synaptix_bundle::imatrix`), which llama-quantize
//! reads too.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use synaptix_bundle::imatrix::{Imatrix, ImatrixEntry};
use synaptix_bundle::GgufFile;
use synaptix_models::{Logits, Tap};
use synaptix_tokenizer::Tokenizer;

#[derive(Args)]
#[command(after_help = "Examples:\n  \
    synaptix imatrix model-f16.gguf -f calibration.txt -o imatrix.gguf\n  \
    synaptix quantize model-f16.gguf model-q4_k_m.gguf --type q4_k_m --imatrix imatrix.gguf\n  \
    synaptix imatrix qwen2.5-coder-0.5b -f text.txt -c 256 --chunks 8 --json")]
pub struct ImatrixArgs {
    /// The model to evaluate (GGUF, .syn, a Hugging Face or .symb directory, or a fetched
    /// model's name); ideally the unquantized one
    pub model: PathBuf,
    /// The calibration text
    #[arg(short = 'f', long = "file", value_name = "TEXT")]
    pub text: PathBuf,
    /// Where to write the matrix
    #[arg(short = 'o', long, default_value = "imatrix.gguf")]
    pub output: PathBuf,
    /// Tokens per chunk
    #[arg(short = 'c', long = "ctx-size", default_value_t = 512)]
    pub ctx_size: usize,
    /// Evaluate at most this many chunks (default: all the text holds)
    #[arg(long)]
    pub chunks: Option<usize>,
    /// Also collect statistics for the output matrix (`output.weight`)
    #[arg(long)]
    pub process_output: bool,
    /// CPU threads (0: all cores)
    #[arg(short = 't', long, default_value_t = 0)]
    pub threads: usize,
    /// Print a JSON summary instead of text
    #[arg(long)]
    pub json: bool,
}

/// Which weight matrices a tapped intermediate is the input of.
struct Collector<'f> {
    file: &'f GgufFile,
    process_output: bool,
    n_expert: usize,
    stats: BTreeMap<String, ImatrixEntry>,
}

impl Collector<'_> {
    /// The weights `name` (a tap's name) multiplies, with the expert it belongs to.
    fn targets(&self, name: &str) -> Vec<(String, Option<usize>)> {
        if name == "result_norm" {
            return if self.process_output && self.file.tensor_info("output.weight").is_some() {
                vec![("output.weight".into(), None)]
            } else {
                vec![]
            };
        }
        let Some((layer, what)) = name.strip_prefix("blk.").and_then(|r| r.split_once('.')) else {
            return vec![];
        };
        let weights: &[&str] = match what {
            "attn_norm" => &["attn_q", "attn_k", "attn_v", "attn_qkv"],
            "kqv_out" => &["attn_output"],
            "ffn_norm" => &[
                "ffn_gate",
                "ffn_up",
                "ffn_gate_inp",
                "ffn_gate_inp_shexp",
                "ffn_gate_shexp",
                "ffn_up_shexp",
            ],
            "ffn_act" => &["ffn_down"],
            "ffn_shexp_act" => &["ffn_down_shexp"],
            _ => {
                let expert = |prefix: &str| -> Option<usize> {
                    what.strip_prefix(prefix).and_then(|e| e.parse().ok())
                };
                if let Some(e) = expert("ffn_moe_in.") {
                    return ["ffn_gate_exps", "ffn_up_exps"]
                        .iter()
                        .map(|w| (format!("blk.{layer}.{w}.weight"), Some(e)))
                        .filter(|(n, _)| self.file.tensor_info(n).is_some())
                        .collect();
                }
                if let Some(e) = expert("ffn_moe_act.") {
                    let n = format!("blk.{layer}.ffn_down_exps.weight");
                    return if self.file.tensor_info(&n).is_some() {
                        vec![(n, Some(e))]
                    } else {
                        vec![]
                    };
                }
                return vec![];
            }
        };
        weights
            .iter()
            .map(|w| format!("blk.{layer}.{w}.weight"))
            .filter(|n| self.file.tensor_info(n).is_some())
            .map(|n| (n, None))
            .collect()
    }
}

impl Tap for Collector<'_> {
    fn wants(&self, name: &str) -> bool {
        !self.targets(name).is_empty()
    }

    fn record(&mut self, name: &str, rows: usize, cols: usize, data: &[f32]) {
        for (weight, expert) in self.targets(name) {
            let n_mat = if expert.is_some() { self.n_expert } else { 1 };
            let e = self.stats.entry(weight).or_insert_with(|| ImatrixEntry {
                sums: vec![0.0; n_mat * cols],
                counts: vec![0.0; n_mat],
            });
            if e.sums.len() != n_mat * cols {
                continue;
            }
            let m = expert.unwrap_or(0).min(n_mat - 1);
            let acc = &mut e.sums[m * cols..(m + 1) * cols];
            for row in data.chunks_exact(cols).take(rows) {
                for (a, &x) in acc.iter_mut().zip(row) {
                    *a += x * x;
                }
            }
            e.counts[m] += rows as f32;
        }
    }
}

pub fn run(a: ImatrixArgs) -> Result<()> {
    crate::threads::init(a.threads)?;
    let start = Instant::now();
    let model_path = synaptix_bundle::cache::resolve_model(&a.model.to_string_lossy());
    let file = Arc::new(synaptix_models::open_model_file(&model_path)?);
    let tokenizer = Tokenizer::from_gguf(&file)?;
    let model = synaptix_models::load(file.clone())?;
    let text = std::fs::read_to_string(&a.text)
        .with_context(|| format!("cannot read {}", a.text.display()))?;
    if a.ctx_size < 16 {
        bail!("--ctx-size {}: chunks need at least 16 tokens", a.ctx_size);
    }
    let mut tokens = tokenizer.encode(&text, true, false)?;
    let available = tokens.len() / a.ctx_size;
    let n_chunks = a.chunks.map_or(available, |c| c.min(available));
    if n_chunks == 0 {
        bail!(
            "{} holds {} tokens: not one chunk of {} (lower --ctx-size or give more text)",
            a.text.display(),
            tokens.len(),
            a.ctx_size
        );
    }
    let mut collector = Collector {
        file: &file,
        process_output: a.process_output,
        n_expert: model.info().hparams.n_expert.max(1),
        stats: BTreeMap::new(),
    };
    let bos = tokenizer.bos().filter(|_| tokenizer.add_bos());
    let progress = !a.json && std::io::stderr().is_terminal();
    for c in 0..n_chunks {
        let chunk = &mut tokens[c * a.ctx_size..(c + 1) * a.ctx_size];
        if let Some(b) = bos {
            chunk[0] = b;
        }
        let mut cache = model.new_cache(a.ctx_size)?;
        model.forward(chunk, cache.as_mut(), Logits::Last, &mut collector)?;
        if progress {
            eprint!(
                "\rchunk {}/{n_chunks} ({:.1} s)",
                c + 1,
                start.elapsed().as_secs_f64()
            );
        }
    }
    if progress {
        eprint!("\r{:40}\r", "");
    }
    let matrix = Imatrix {
        entries: collector.stats,
        datasets: vec![a.text.display().to_string()],
        chunk_count: n_chunks as u32,
        chunk_size: a.ctx_size as u32,
    };
    matrix.write(&a.output)?;
    let seconds = start.elapsed().as_secs_f64();
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "model": model_path.display().to_string(),
                "output": a.output.display().to_string(),
                "chunks": n_chunks,
                "chunk_size": a.ctx_size,
                "tokens": n_chunks * a.ctx_size,
                "entries": matrix.entries.len(),
                "seconds": seconds,
            })
        );
    } else {
        println!(
            "{}: {} matrices from {n_chunks} chunks of {} tokens in {seconds:.1} s",
            a.output.display(),
            matrix.entries.len(),
            a.ctx_size
        );
    }
    Ok(())
}
