//! `synaptix quantize`: a GGUF file's weight matrices to another type, the rest as is.
//!
//! Which tensors change follows `llama-quantize --pure`: every tensor of two or more dimensions
//! whose name ends in `weight`, except norms (`*_norm.weight`), takes the target type; the
//! quantized bytes are the ones ggml's reference quantizers give (see
//! `synaptix_kernels_cpu::quantize_weights`). The output is written as it is computed, one
//! tensor at a time, so a model never sits in memory whole.

use std::io::{BufWriter, IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use rayon::prelude::*;
use synaptix_bundle::gguf::{GgufFile, GgufWriter, TensorInfo, Value};
use synaptix_core::DType;
use synaptix_kernels_cpu::{dequantize, quantize_weights, QUANTIZE_TARGETS};

#[derive(Args)]
#[command(
    after_help = "Types: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k.\n\n\
    Examples:\n  \
    synaptix quantize model-f16.gguf model-q8_0.gguf --type q8_0\n  \
    synaptix quantize model-q8_0.gguf model-q4_0.gguf --type q4_0 --allow-requantize --json"
)]
pub struct QuantizeArgs {
    /// The GGUF file to read
    pub input: PathBuf,
    /// The GGUF file to write (replaced if it exists)
    pub output: PathBuf,
    /// Type of the weight matrices in the output
    #[arg(long = "type", value_name = "TYPE")]
    pub dtype: String,
    /// Also convert matrices that are already quantized (their dequantized values are
    /// quantized again, which loses more precision than quantizing the originals)
    #[arg(long)]
    pub allow_requantize: bool,
    /// CPU threads (0: all cores)
    #[arg(short = 't', long, default_value_t = 0)]
    pub threads: usize,
    /// Print a JSON summary instead of text
    #[arg(long)]
    pub json: bool,
}

/// llama.cpp's `llama_ftype` for a file whose matrices are `dtype` (`general.file_type`).
fn file_type(dtype: DType) -> u32 {
    match dtype {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::Q4_0 => 2,
        DType::Q4_1 => 3,
        DType::Q8_0 => 7,
        DType::Q5_0 => 8,
        DType::Q5_1 => 9,
        DType::Q4K => 15, // LLAMA_FTYPE_MOSTLY_Q4_K_M
        DType::Q5K => 17, // LLAMA_FTYPE_MOSTLY_Q5_K_M
        DType::Q6K => 18,
        _ => 32, // BF16
    }
}

/// Whether `llama-quantize --pure` converts this tensor.
fn converts(t: &TensorInfo) -> bool {
    t.shape.rank() >= 2 && t.name.ends_with("weight") && !t.name.ends_with("_norm.weight")
}

/// `target`, or what llama-quantize falls back to for rows of `cols` that are not whole
/// blocks of it: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, and F16 when even that does not fit.
fn type_for_rows(target: DType, cols: usize) -> DType {
    if cols.is_multiple_of(target.block_len()) {
        return target;
    }
    let fallback = match target {
        DType::Q4K => DType::Q5_0,
        DType::Q5K => DType::Q5_1,
        DType::Q6K => DType::Q8_0,
        other => other,
    };
    if cols.is_multiple_of(fallback.block_len()) {
        fallback
    } else {
        DType::F16
    }
}

/// The layer of a `blk.N.*` tensor, -1 for the others.
fn layer_of(name: &str) -> i64 {
    name.strip_prefix("blk.")
        .and_then(|rest| rest.split('.').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(-1)
}

/// What happens to one tensor.
struct Plan {
    dtype: DType,
    /// Converted (dequantized, then quantized to `dtype`), else copied.
    convert: bool,
}

pub fn run(a: QuantizeArgs) -> Result<()> {
    crate::threads::init(a.threads)?;
    let target = QUANTIZE_TARGETS
        .iter()
        .copied()
        .find(|d| d.name().eq_ignore_ascii_case(&a.dtype))
        .with_context(|| {
            format!(
                "--type {}: not a type synaptix quantizes to (f32, f16, bf16, q8_0, q4_0, q4_1, \
                 q5_0, q5_1, q4_k, q5_k, q6_k)",
                a.dtype
            )
        })?;
    let start = Instant::now();
    let input = GgufFile::open(&a.input)?;
    if a.input.canonicalize().ok() == a.output.canonicalize().ok() {
        bail!("the output would overwrite the input {}", a.input.display());
    }

    // llama-quantize's order: the tensors outside the layers, then layer by layer, by name
    // within each (so the two tools write the same file).
    let mut order: Vec<&TensorInfo> = input.tensors().iter().collect();
    order.sort_by_key(|t| (layer_of(&t.name), t.name.clone()));

    let mut plans = Vec::with_capacity(order.len());
    // Tensors whose rows do not fit the target's blocks, and the type they get instead.
    let mut fallbacks = Vec::new();
    for &t in &order {
        let cols = t.shape.dims().last().copied().unwrap_or(0);
        let dtype = if converts(t) {
            let fitting = type_for_rows(target, cols);
            if fitting != target {
                fallbacks.push(format!("{} ({cols} columns): {fitting}", t.name));
            }
            fitting
        } else {
            t.dtype
        };
        let convert = dtype != t.dtype;
        if convert
            && !matches!(t.dtype, DType::F32 | DType::F16 | DType::BF16)
            && !a.allow_requantize
        {
            bail!(
                "{} is already {}: converting it to {dtype} quantizes twice; pass \
                 --allow-requantize to do it anyway",
                t.name,
                t.dtype
            );
        }
        plans.push(Plan { dtype, convert });
    }

    let mut w = GgufWriter::new();
    w.version = input.version;
    // The input's metadata, then (moved to the end, as llama-quantize does) ggml's
    // GGML_QNT_VERSION and the file type.
    for (key, value) in input.metadata() {
        if key != "general.file_type" && key != "general.quantization_version" {
            w.add_metadata(key.clone(), value.clone());
        }
    }
    w.add_metadata("general.quantization_version", Value::U32(2));
    w.add_metadata("general.file_type", Value::U32(file_type(target)));
    for (t, plan) in order.iter().zip(&plans) {
        let dims: Vec<u64> = t.shape.dims().iter().map(|&d| d as u64).collect();
        let elements = t.elements() as usize;
        let len = if plan.convert {
            (elements / plan.dtype.block_len() * plan.dtype.block_bytes()) as u64
        } else {
            t.n_bytes
        };
        w.add_tensor_later(t.name.clone(), &dims, plan.dtype, len);
    }

    let file = std::fs::File::create(&a.output)
        .with_context(|| format!("cannot create {}", a.output.display()))?;
    let mut out = BufWriter::with_capacity(8 << 20, file);
    let progress = !a.json && std::io::stderr().is_terminal();
    let n = plans.len();
    let mut failure: Option<anyhow::Error> = None;
    let written = w.write_streaming(&mut out, |i| {
        let (t, plan) = (order[i], &plans[i]);
        if progress {
            eprint!("\r[{:>4}/{n}] {:<40.40}", i + 1, t.name);
        }
        let src = input.tensor_bytes(t);
        if !plan.convert {
            return Ok(src.to_vec());
        }
        convert(t, src, plan.dtype).map_err(|e| {
            let msg = format!("{}: {e:#}", t.name);
            failure = Some(anyhow::anyhow!(msg.clone()));
            std::io::Error::other(msg)
        })
    });
    if progress {
        eprint!("\r{:60}\r", "");
    }
    if let Err(e) = written.and_then(|()| out.flush()) {
        drop(out);
        let _ = std::fs::remove_file(&a.output);
        return Err(failure.unwrap_or_else(|| {
            anyhow::Error::new(e).context(format!("cannot write {}", a.output.display()))
        }));
    }
    drop(out);

    let converted = plans.iter().filter(|p| p.convert).count();
    let out_bytes = std::fs::metadata(&a.output)?.len();
    let seconds = start.elapsed().as_secs_f64();
    if a.json {
        let summary = serde_json::json!({
            "input": a.input.display().to_string(),
            "output": a.output.display().to_string(),
            "type": target.name(),
            "tensors": n,
            "converted": converted,
            "fallbacks": fallbacks,
            "input_bytes": input.file_len(),
            "output_bytes": out_bytes,
            "seconds": seconds,
        });
        println!("{summary}");
    } else {
        for f in &fallbacks {
            eprintln!("note: {f} instead of {target}: its rows are not whole {target} blocks");
        }
        println!(
            "{}: {converted} of {n} tensors to {target}, {:.2} MiB -> {:.2} MiB in {seconds:.1} s",
            a.output.display(),
            input.file_len() as f64 / (1 << 20) as f64,
            out_bytes as f64 / (1 << 20) as f64,
        );
    }
    Ok(())
}

/// One tensor's bytes in `dtype`: dequantized to f32 and quantized again, rows in parallel
/// (blocks never straddle rows, so the result is the same as in one piece).
fn convert(t: &TensorInfo, src: &[u8], dtype: DType) -> Result<Vec<u8>> {
    let cols = t.shape.dims().last().copied().unwrap_or(0);
    let rows = (t.elements() as usize).checked_div(cols).unwrap_or(0);
    let src_row = src.len().checked_div(rows).unwrap_or(0);
    let out_row = cols / dtype.block_len() * dtype.block_bytes();
    // Chunks of rows big enough to amortise the scheduling.
    let chunk = (1 << 16) / cols.max(1) + 1;
    let parts: Vec<Result<Vec<u8>>> = src
        .par_chunks(src_row.max(1) * chunk)
        .map(|rows_in| {
            let n = rows_in.len() / src_row.max(1);
            let mut x = vec![0f32; n * cols];
            dequantize(t.dtype, rows_in, &mut x)?;
            let mut out = Vec::with_capacity(n * out_row);
            quantize_weights(dtype, &x, &mut out)?;
            Ok(out)
        })
        .collect();
    let mut out = Vec::with_capacity(rows * out_row);
    for p in parts {
        out.extend_from_slice(&p?);
    }
    Ok(out)
}
