//! `synaptix convert`: a model file from one container to another (GGUF ↔ `.syn`), every
//! tensor's bytes unchanged.

use std::io::{BufWriter, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use synaptix_bundle::gguf::GgufWriter;
use synaptix_bundle::syn::{write_syn, SynTensor};
use synaptix_bundle::{GgufFile, Value};

/// GGUF's own layout key, which a bundle (aligned by its own rule) does not carry.
const GGUF_ALIGNMENT_KEY: &str = "general.alignment";

#[derive(Args)]
#[command(
    after_help = "The tensors keep their types and bytes (to change types, use \
    `synaptix quantize`). A .syn bundle (docs/syn.md) is one file with the model's weights, \
    hyper-parameters, tokenizer and chat template, every tensor 64-byte aligned and \
    checksummed; every command that reads GGUF reads it too.\n\n\
    Examples:\n  \
    synaptix convert gemma3-270m gemma3-270m.syn\n  \
    synaptix run gemma3-270m.syn \"The capital of France is\"\n  \
    synaptix convert model.syn model.gguf        # back to GGUF, for llama.cpp\n  \
    synaptix inspect gemma3-270m.syn --verify"
)]
pub struct ConvertArgs {
    /// The model to read: a GGUF file, a .syn bundle, or the name of a fetched model
    pub input: PathBuf,
    /// The file to write (replaced if it exists)
    pub output: PathBuf,
    /// The container to write (by default from the output's extension: .syn or .gguf)
    #[arg(long, value_enum)]
    pub to: Option<Container>,
    /// Print a JSON summary instead of text
    #[arg(long)]
    pub json: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Container {
    /// synaptix's single-file bundle
    Syn,
    /// llama.cpp's GGUF (version 3)
    Gguf,
}

impl Container {
    fn name(self) -> &'static str {
        match self {
            Container::Syn => "syn",
            Container::Gguf => "gguf",
        }
    }
}

fn container_of(output: &Path, to: Option<Container>) -> Result<Container> {
    if let Some(c) = to {
        return Ok(c);
    }
    match output
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        Some("syn") => Ok(Container::Syn),
        Some("gguf") => Ok(Container::Gguf),
        _ => bail!(
            "cannot tell the container from {}: name it .syn or .gguf, or pass --to syn|gguf",
            output.display()
        ),
    }
}

pub fn run(a: ConvertArgs) -> Result<()> {
    let start = Instant::now();
    let input_path = synaptix_bundle::cache::resolve_model(&a.input.to_string_lossy());
    let container = container_of(&a.output, a.to)?;
    if input_path.extension().is_some_and(|e| e == "safetensors") {
        bail!(
            "{}: convert reads a whole Hugging Face model directory (config.json, safetensors, \
             tokenizer.json), not one safetensors file",
            input_path.display()
        );
    }
    let input = synaptix_models::open_model_file(&input_path)?;
    if input_path.canonicalize().ok() == a.output.canonicalize().ok() {
        bail!(
            "the output would overwrite the input {}",
            input_path.display()
        );
    }
    let file = std::fs::File::create(&a.output)
        .with_context(|| format!("cannot create {}", a.output.display()))?;
    let mut out = BufWriter::with_capacity(8 << 20, file);
    let progress = !a.json && std::io::stderr().is_terminal();
    let tensors = input.tensors();
    let n = tensors.len();
    let mut fill = |i: usize| {
        if progress {
            eprint!("\r[{:>4}/{n}] {:<40.40}", i + 1, tensors[i].name);
        }
        Ok::<_, std::io::Error>(input.tensor_bytes(&tensors[i]).to_vec())
    };
    let written = match container {
        Container::Syn => {
            let specs: Vec<SynTensor> = tensors
                .iter()
                .map(|t| SynTensor {
                    name: t.name.clone(),
                    dims: t.shape.dims().iter().map(|&d| d as u64).collect(),
                    dtype: t.dtype,
                    bytes: t.n_bytes,
                })
                .collect();
            let format = if input.is_syn() {
                "syn"
            } else if input.is_assembled() {
                "safetensors"
            } else {
                "gguf"
            };
            let source = serde_json::json!({ "format": format, "version": input.version });
            // GGUF's alignment key describes GGUF's own layout; a bundle has its own.
            let metadata: Vec<(String, Value)> = input
                .metadata()
                .iter()
                .filter(|(k, _)| k != GGUF_ALIGNMENT_KEY)
                .cloned()
                .collect();
            write_syn(&mut out, &metadata, &specs, Some(source), &mut fill)
        }
        Container::Gguf => {
            if input.get("tokenizer.ggml.model").is_none()
                && input.get(synaptix_tokenizer::KEY_HF_JSON).is_some()
                && !a.json
            {
                eprintln!(
                    "note: the tokenizer travels whole as tokenizer.huggingface.json, which \
                     synaptix reads and llama.cpp does not"
                );
            }
            let mut w = GgufWriter::new();
            for (key, value) in input.metadata() {
                w.add_metadata(key.clone(), value.clone());
            }
            for t in tensors {
                let dims: Vec<u64> = t.shape.dims().iter().map(|&d| d as u64).collect();
                w.add_tensor_later(t.name.clone(), &dims, t.dtype, t.n_bytes);
            }
            w.write_streaming(&mut out, &mut fill)
        }
    };
    if progress {
        eprint!("\r{:60}\r", "");
    }
    if let Err(e) = written.and_then(|()| out.flush()) {
        drop(out);
        let _ = std::fs::remove_file(&a.output);
        return Err(anyhow::Error::new(e).context(format!("cannot write {}", a.output.display())));
    }
    drop(out);

    // Read back what was written: the directory (at open) and, for a bundle, every checksum.
    let written = GgufFile::open(&a.output)
        .with_context(|| format!("{} was written but does not read back", a.output.display()))?;
    let verified = verify_checksums(&written, progress)?;
    let dropped =
        usize::from(container == Container::Syn && input.get(GGUF_ALIGNMENT_KEY).is_some());
    let keys = input.metadata().len() - dropped;
    if written.tensors().len() != n || written.metadata().len() != keys {
        bail!(
            "{} reads back with {} tensors and {} metadata keys, not {n} and {keys}",
            a.output.display(),
            written.tensors().len(),
            written.metadata().len(),
        );
    }

    let seconds = start.elapsed().as_secs_f64();
    if a.json {
        let summary = serde_json::json!({
            "input": input_path.display().to_string(),
            "input_format": input.format_label(),
            "output": a.output.display().to_string(),
            "output_format": written.format_label(),
            "container": container.name(),
            "tensors": n,
            "metadata_keys": written.metadata().len(),
            "input_bytes": input.file_len(),
            "output_bytes": written.file_len(),
            "checksums_verified": verified,
            "seconds": seconds,
        });
        println!("{summary}");
    } else {
        println!(
            "{}: {} -> {}, {n} tensors, {} metadata keys, {:.2} MiB -> {:.2} MiB{} in {seconds:.1} s",
            a.output.display(),
            input.format_label(),
            written.format_label(),
            written.metadata().len(),
            input.file_len() as f64 / (1 << 20) as f64,
            written.file_len() as f64 / (1 << 20) as f64,
            if verified { ", checksums verified" } else { "" },
        );
    }
    Ok(())
}

/// Checks a `.syn` bundle's tensor checksums (`Ok(false)` for GGUF, which has none), with a
/// percentage on stderr when `progress`.
pub fn verify_checksums(file: &GgufFile, progress: bool) -> Result<bool> {
    let verified = file.verify_checksums(|done, total| {
        if progress {
            eprint!(
                "\rverifying {:>5.1}%",
                100.0 * done as f64 / total.max(1) as f64
            );
        }
    });
    if progress {
        eprint!("\r{:30}\r", "");
    }
    Ok(verified?)
}
