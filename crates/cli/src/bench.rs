//! `synaptix bench`: prompt-processing (ppN) and generation (tgN) throughput, printed like
//! llama.cpp's `llama-bench` so the two tables compare line by line.
//!
//! As llama-bench does: tokens are random (BOS first when the vocabulary adds one), each test
//! keeps one cache and empties it before every run, one untimed warm-up run precedes the timed
//! repetitions, and t/s is the mean over repetitions of `tokens / seconds`, with its sample
//! standard deviation. Generation starts from one such token and goes on greedily, each pick fed
//! back as the next token. The generation warm-up takes two steps: on a GPU the first step of a cache
//! runs eagerly and the second records the step that later ones replay, one-time work that, like
//! llama.cpp's graph capture, belongs to no repetition.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use synaptix_infer::Engine;
use synaptix_models::{Logits, NoTap};
use synaptix_sample::{DevicePick, SplitMix64};

use crate::inspect::{human_bytes, human_count};

#[derive(Clone, Copy, ValueEnum)]
pub enum OutputFormat {
    Md,
    Json,
}

#[derive(Args)]
#[command(after_help = "Examples:\n  synaptix bench model.gguf\n  \
    synaptix bench model.gguf -p 512 -n 128 -r 3 -t 2 -o json")]
pub struct BenchArgs {
    /// GGUF model file or .syn bundle, or the name of a fetched model (gemma3-270m, qwen2.5-coder-0.5b)
    pub model: PathBuf,
    /// Prompt length for the prompt-processing test (0: skip)
    #[arg(short = 'p', long = "n-prompt", default_value_t = 512)]
    pub n_prompt: usize,
    /// Tokens for the generation test (0: skip)
    #[arg(short = 'n', long = "n-gen", default_value_t = 128)]
    pub n_gen: usize,
    /// Timed repetitions of each test
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    pub repetitions: usize,
    /// CPU threads (0: all cores)
    #[arg(short = 't', long, default_value_t = 0)]
    pub threads: usize,
    /// Where to run: auto (a GPU if one is usable, else the CPU), cpu, cuda, cuda:N
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Output format
    #[arg(short = 'o', long, value_enum, default_value_t = OutputFormat::Md)]
    pub output: OutputFormat,
}

struct TestResult {
    name: String,
    n_prompt: usize,
    n_gen: usize,
    samples: Vec<f64>,
}

impl TestResult {
    fn mean(&self) -> f64 {
        self.samples.iter().sum::<f64>() / self.samples.len() as f64
    }
    fn stddev(&self) -> f64 {
        let n = self.samples.len();
        if n < 2 {
            return 0.0;
        }
        let m = self.mean();
        (self.samples.iter().map(|s| (s - m) * (s - m)).sum::<f64>() / (n - 1) as f64).sqrt()
    }
}

pub fn run(mut a: BenchArgs) -> Result<()> {
    a.model = synaptix_bundle::cache::resolve_model(&a.model.to_string_lossy());
    if a.repetitions == 0 {
        bail!("--repetitions must be at least 1");
    }
    let threads = crate::threads::init(a.threads)?;
    let (device, notice) =
        crate::device::resolve_for_model(&a.device, std::path::Path::new(&a.model))?;
    let engine = Engine::load(&a.model, device)?;
    if let Some(n) = notice {
        eprintln!("{n}");
    }
    let info = engine.model.info().clone();
    let n_ctx = a.n_prompt.max(a.n_gen).max(1);
    if n_ctx > info.hparams.n_ctx_train {
        bail!(
            "the tests need {n_ctx} positions but the model's context is {}",
            info.hparams.n_ctx_train
        );
    }
    let mut rng = SplitMix64::new(0x5eed);
    let n_vocab = info.hparams.n_vocab as u64;
    let mut random_tokens = |n: usize| -> Vec<u32> {
        let mut t: Vec<u32> = (0..n).map(|_| (rng.next_u64() % n_vocab) as u32).collect();
        if let (Some(first), true, Some(bos)) = (
            t.first_mut(),
            engine.tokenizer.add_bos(),
            engine.tokenizer.bos(),
        ) {
            *first = bos;
        }
        t
    };

    let mut results = Vec::new();
    if a.n_prompt > 0 {
        let mut samples = Vec::new();
        let mut cache = engine.new_cache(n_ctx)?;
        for rep in 0..=a.repetitions {
            let tokens = random_tokens(a.n_prompt);
            cache.truncate(0);
            let start = Instant::now();
            engine
                .model
                .forward(&tokens, cache.as_mut(), Logits::Last, &mut NoTap)?;
            let s = start.elapsed().as_secs_f64();
            if rep > 0 {
                samples.push(a.n_prompt as f64 / s);
            }
        }
        results.push(TestResult {
            name: format!("pp{}", a.n_prompt),
            n_prompt: a.n_prompt,
            n_gen: 0,
            samples,
        });
    }
    if a.n_gen > 0 {
        let mut samples = Vec::new();
        let mut cache = engine.new_cache(n_ctx)?;
        for rep in 0..=a.repetitions {
            let tokens = random_tokens(1);
            cache.truncate(0);
            let n = if rep == 0 { a.n_gen.min(2) } else { a.n_gen };
            let start = Instant::now();
            // Greedy generation from a random token: each step's pick, on the host at the end of
            // the step (on a GPU only the token id crosses; the logits stay on the device), is
            // the next step's token, and every step but the last says that another follows.
            let mut token = tokens[0];
            for i in 0..n {
                let picked = engine.model.forward_pick_more(
                    &[token],
                    cache.as_mut(),
                    &DevicePick::GREEDY,
                    i + 1 < n,
                )?;
                token = picked.first().map_or(0, |c| c.0);
            }
            let s = start.elapsed().as_secs_f64();
            if rep > 0 {
                samples.push(n as f64 / s);
            }
        }
        results.push(TestResult {
            name: format!("tg{}", a.n_gen),
            n_prompt: 0,
            n_gen: a.n_gen,
            samples,
        });
    }

    let desc = model_description(&engine);
    let backend = if engine.model.device().starts_with("cuda") {
        "CUDA"
    } else {
        "CPU"
    };
    match a.output {
        OutputFormat::Md => {
            println!(
                "| {:<30} | {:>10} | {:>10} | {:<10} | {:>7} | {:>15} | {:>20} |",
                "model", "size", "params", "backend", "threads", "test", "t/s"
            );
            println!(
                "| {:-<30} | {:->9}: | {:->9}: | {:-<10} | {:->6}: | {:->14}: | {:->19}: |",
                "", "", "", "", "", "", ""
            );
            for r in &results {
                println!(
                    "| {:<30} | {:>10} | {:>10} | {:<10} | {:>7} | {:>15} | {:>20} |",
                    desc,
                    human_bytes(info.weight_bytes),
                    human_count(info.n_params),
                    backend,
                    threads,
                    r.name,
                    format!("{:.2} ± {:.2}", r.mean(), r.stddev())
                );
            }
        }
        OutputFormat::Json => {
            let out: Vec<_> = results
                .iter()
                .map(|r| {
                    serde_json::json!({
                        "model_filename": a.model.display().to_string(),
                        "model_type": desc,
                        "model_size": info.weight_bytes,
                        "model_n_params": info.n_params,
                        "backends": backend,
                        "device": engine.model.device(),
                        "cpu_info": crate::devices::cpu_name(),
                        "kernel_path": synaptix_kernels_cpu::kernel_path(),
                        "n_threads": threads,
                        "n_prompt": r.n_prompt,
                        "n_gen": r.n_gen,
                        "test": r.name,
                        "avg_ts": r.mean(),
                        "stddev_ts": r.stddev(),
                        "samples_ts": r.samples,
                    })
                })
                .collect();
            println!("{}", serde_json::to_string_pretty(&out)?);
        }
    }
    Ok(())
}

/// `"{arch} {size} {file type}"`, as llama.cpp describes a model (`qwen2 0.5B Q4_K - Medium`).
fn model_description(engine: &Engine) -> String {
    let info = engine.model.info();
    let size = engine
        .file
        .get_str("general.size_label")
        .ok()
        .flatten()
        .map(str::to_string)
        .unwrap_or_else(|| human_count(info.n_params).replace(' ', ""));
    let ftype = engine
        .file
        .get_u64("general.file_type")
        .ok()
        .flatten()
        .and_then(file_type_name)
        .unwrap_or("?");
    format!("{} {size} {ftype}", info.architecture)
}

/// llama.cpp's names for `general.file_type` (and synaptix's own, from 1000 on: `quantize`).
fn file_type_name(id: u64) -> Option<&'static str> {
    Some(match id {
        0 => "all F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K - Medium",
        11 => "Q3_K - Small",
        12 => "Q3_K - Medium",
        13 => "Q3_K - Large",
        14 => "Q4_K - Small",
        15 => "Q4_K - Medium",
        16 => "Q5_K - Small",
        17 => "Q5_K - Medium",
        18 => "Q6_K",
        21 => "Q2_K - Small",
        25 => "IQ4_NL - 4.5 bpw",
        30 => "IQ4_XS - 4.25 bpw",
        32 => "BF16",
        1001 => "MXFP8",
        1002 => "NVFP4",
        1011 => "SQ1",
        1012 => "SQ2",
        1013 => "SQ3",
        1014 => "SQ4",
        1015 => "SQ5",
        1016 => "SQ6",
        1017 => "SQ7",
        1018 => "SQ8",
        1020 => "SYMB4",
        _ => return None,
    })
}
