//! `synaptix quantize`: a GGUF file's weight matrices to another type, the rest as is, with
//! llama-quantize's presets.
//!
//! Which tensors change, and to what, follows `llama-quantize`: tensors of two or more
//! dimensions whose name ends in `weight` (norms and a few small kinds excepted) take the
//! preset's type, except where the preset gives some more bits (Q4_K_M: the output matrix, and
//! half the attention values and FFN down projections in Q6_K), and rows that are not whole
//! blocks fall back (Q4_K to Q5_0, ...). `--pure` gives every matrix the preset's type. The
//! quantized bytes are ggml's reference quantizers' (see `synaptix_kernels_cpu::quantize_weights`),
//! and the file is laid out as llama-quantize lays it out, so the two write the same bytes. The
//! output is written as it is computed, one tensor at a time, so a model never sits in memory
//! whole.

use std::io::{BufWriter, IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use rayon::prelude::*;
use synaptix_bundle::gguf::{GgufWriter, TensorInfo, Value};
use synaptix_bundle::syn::{write_syn, SynTensor};
use synaptix_core::DType;
use synaptix_kernels_cpu::{
    dequantize, finite_amax, nvfp4_tensor_scale, quantize_nvfp4_with_scale, quantize_weights,
    quantize_weights_weighted, QUANTIZE_TARGETS,
};

#[derive(Args)]
#[command(
    after_help = "Presets (llama-quantize's): f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k,\n\
    q2_k_s (needs --imatrix), q3_k_s, q3_k_m (or q3_k), q3_k_l, q4_k_s, q4_k_m (or q4_k),\n\
    q5_k_s, q5_k_m (or q5_k), q6_k, iq4_nl, iq4_xs.\n\
    synaptix's own (written only to .syn bundles): mxfp8 (OCP MXFP8: E4M3 values, an E8M0 scale\n\
    per 32), nvfp4 (E2M1 values, an E4M3 scale per 16, an FP32 scale per tensor), sq1 .. sq8\n\
    (b-bit codes as bit-planes, byte scales and offsets per 32 in super-blocks of 256), symb4\n\
    (.symb's INT4: a 4-bit code per value, an f32 scale per 128).\n\
    .symb directories (SYNAXIM's format; Llama- and Qwen2-style models with a tokenizer.json):\n\
    symb-int4, symb-int8, symb-fp16, symb-fp32 write OUTPUT as a directory.\n\n\
    Examples:\n  \
    synaptix quantize model-f16.gguf model-q4_k_m.gguf --type q4_k_m\n  \
    synaptix quantize model-f16.gguf model-q4_k_m.gguf --type q4_k_m --imatrix imatrix.gguf\n  \
    synaptix quantize model-f16.gguf model-q8_0.gguf --type q8_0 --pure\n  \
    synaptix quantize model-q8_0.gguf model-q4_0.gguf --type q4_0 --allow-requantize --json\n  \
    synaptix quantize model-f16.gguf model-q4_k_m.syn --type q4_k_m   # a .syn bundle\n  \
    synaptix quantize model-f16.gguf model-mxfp8.syn --type mxfp8\n  \
    synaptix quantize ./Qwen2.5-0.5B-Instruct qwen-symb --type symb-int4   # a .symb directory"
)]
pub struct QuantizeArgs {
    /// The model file to read (GGUF or .syn), or the name of a fetched model
    pub input: PathBuf,
    /// The file to write (replaced if it exists): a .syn bundle when its name ends in .syn,
    /// a .symb directory for the symb-* types, else GGUF
    pub output: PathBuf,
    /// The preset: the type of the weight matrices (some get more bits, as in llama-quantize)
    #[arg(long = "type", value_name = "TYPE")]
    pub dtype: String,
    /// Every matrix in the preset's type (no extra bits for the output and some layers)
    #[arg(long)]
    pub pure: bool,
    /// Type of the output matrix (`output.weight`, or the token embeddings where they serve as
    /// it), whatever the preset says
    #[arg(long, value_name = "TYPE")]
    pub output_tensor_type: Option<String>,
    /// Type of the token embeddings, whatever the preset says
    #[arg(long, value_name = "TYPE")]
    pub token_embedding_type: Option<String>,
    /// Matrices whose name matches PATTERN (a regular expression, lower-cased, found anywhere
    /// in the name; the first one given that matches wins) get TYPE instead of what the preset
    /// would give them, as llama-quantize's option of the same name (quantized presets only;
    /// repeat it for more patterns), e.g. `--tensor-type attn_v=q8_0`
    #[arg(long = "tensor-type", value_name = "PATTERN=TYPE")]
    pub tensor_types: Vec<String>,
    /// A file of `--tensor-type` entries, separated by whitespace, after those given on the
    /// command line
    #[arg(long, value_name = "FILE")]
    pub tensor_type_file: Option<PathBuf>,
    /// Copy `output.weight` as it is, neither quantized nor requantized
    #[arg(long)]
    pub leave_output_tensor: bool,
    /// An importance matrix (llama-imatrix's GGUF, or `synaptix imatrix`'s): the quantizers
    /// weigh each column's error by it, as llama-quantize's `--imatrix` does
    #[arg(long, value_name = "FILE")]
    pub imatrix: Option<PathBuf>,
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

/// How a preset gives some matrices more bits.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mix {
    /// Only the output matrix (Q6_K, or Q8_0 where its rows do not fit).
    Output,
    /// Q4_K_S: also the first four attention values and the first eighth of the FFN down
    /// projections in Q5_K.
    Q4KS,
    /// Q4_K_M / Q5_K_M: also half the attention values and FFN down projections in Q6_K.
    KM,
    /// Q2_K: attention values in Q3_K (Q4_K with four or more query heads per KV head), FFN
    /// down and attention output projections in Q3_K.
    Q2K,
    /// Q2_K_S (needs an importance matrix): attention values in Q4_K with four or more query
    /// heads per KV head, the first eighth of the FFN down projections in Q4_K.
    Q2KS,
    /// Q3_K_M: the first two attention values in Q5_K and the others in Q4_K, the first
    /// sixteenth of the FFN down projections in Q5_K and the others in Q4_K, attention outputs
    /// in Q4_K.
    Q3KM,
    /// Q3_K_L: attention values, FFN down and attention output projections in Q5_K.
    Q3KL,
    /// IQ4_NL / IQ4_XS: attention values in Q5_K with four or more query heads per KV head, and
    /// without an importance matrix the first eighth of the FFN down projections.
    IQ4,
}

/// A llama-quantize preset.
struct Preset {
    name: &'static str,
    dtype: DType,
    /// llama.cpp's `llama_ftype` (`general.file_type`).
    file_type: u32,
    mix: Mix,
}

const fn preset_of(name: &'static str, dtype: DType, file_type: u32, mix: Mix) -> Preset {
    Preset {
        name,
        dtype,
        file_type,
        mix,
    }
}

const PRESETS: [Preset; 31] = [
    preset_of("f32", DType::F32, 0, Mix::Output),
    preset_of("f16", DType::F16, 1, Mix::Output),
    preset_of("bf16", DType::BF16, 32, Mix::Output),
    preset_of("q8_0", DType::Q8_0, 7, Mix::Output),
    preset_of("q4_0", DType::Q4_0, 2, Mix::Output),
    preset_of("q4_1", DType::Q4_1, 3, Mix::Output),
    preset_of("q5_0", DType::Q5_0, 8, Mix::Output),
    preset_of("q5_1", DType::Q5_1, 9, Mix::Output),
    preset_of("q2_k", DType::Q2K, 10, Mix::Q2K),
    preset_of("q2_k_s", DType::Q2K, 21, Mix::Q2KS),
    preset_of("q3_k_s", DType::Q3K, 11, Mix::Output),
    preset_of("q3_k_m", DType::Q3K, 12, Mix::Q3KM),
    preset_of("q3_k_l", DType::Q3K, 13, Mix::Q3KL),
    preset_of("q4_k_s", DType::Q4K, 14, Mix::Q4KS),
    preset_of("q4_k_m", DType::Q4K, 15, Mix::KM),
    preset_of("q5_k_s", DType::Q5K, 16, Mix::Output),
    preset_of("q5_k_m", DType::Q5K, 17, Mix::KM),
    preset_of("q6_k", DType::Q6K, 18, Mix::Output),
    preset_of("iq4_nl", DType::IQ4NL, 25, Mix::IQ4),
    preset_of("iq4_xs", DType::IQ4XS, 30, Mix::IQ4),
    // synaptix's own types: .syn bundles only (their file types are beyond llama.cpp's).
    preset_of("mxfp8", DType::MXFP8, 1001, Mix::Output),
    preset_of("nvfp4", DType::NVFP4, 1002, Mix::Output),
    preset_of("sq1", DType::SQ1, 1011, Mix::Output),
    preset_of("sq2", DType::SQ2, 1012, Mix::Output),
    preset_of("sq3", DType::SQ3, 1013, Mix::Output),
    preset_of("sq4", DType::SQ4, 1014, Mix::Output),
    preset_of("sq5", DType::SQ5, 1015, Mix::Output),
    preset_of("sq6", DType::SQ6, 1016, Mix::Output),
    preset_of("sq7", DType::SQ7, 1017, Mix::Output),
    preset_of("sq8", DType::SQ8, 1018, Mix::Output),
    preset_of("symb4", DType::SYMB4, 1020, Mix::Output),
];

/// `--type symb-*`: the model as a `.symb` directory.
fn run_symb(a: &QuantizeArgs, method: &str) -> Result<()> {
    let method = synaptix_models::SymbMethod::from_name(method).with_context(|| {
        format!(
            "--type {}: the .symb encodings are symb-int4, symb-int8, symb-fp16 and symb-fp32",
            a.dtype
        )
    })?;
    if a.pure
        || a.output_tensor_type.is_some()
        || a.token_embedding_type.is_some()
        || a.allow_requantize
        || a.imatrix.is_some()
    {
        bail!(
            "--pure, --output-tensor-type, --token-embedding-type, --allow-requantize and \
             --imatrix do not apply to .symb output (every matrix takes the one encoding)"
        );
    }
    let start = Instant::now();
    let input = synaptix_models::open_model_file(&a.input)?;
    if a.input.canonicalize().ok() == a.output.canonicalize().ok() {
        bail!("the output would overwrite the input {}", a.input.display());
    }
    let progress = !a.json && std::io::stderr().is_terminal();
    let source = a.input.display().to_string();
    let summary = synaptix_models::write_symb_dir(
        &input,
        &source,
        &a.output,
        method,
        &mut |done, total, file| {
            if progress {
                eprint!("\r[{:>4}/{total}] {:<48.48}", (done + 1).min(total), file);
            }
        },
    );
    if progress {
        eprint!("\r{:70}\r", "");
    }
    let summary = summary?;
    // Read back what was written, as every command will.
    let written = synaptix_models::open_model_file(&a.output)
        .with_context(|| format!("{} was written but does not read back", a.output.display()))?;
    let seconds = start.elapsed().as_secs_f64();
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "input": source,
                "output": a.output.display().to_string(),
                "format": "symb",
                "method": method.name(),
                "architecture": summary.architecture,
                "files": summary.files,
                "tensors": written.tensors().len(),
                "input_bytes": input.file_len(),
                "output_bytes": summary.bytes,
                "seconds": seconds,
            })
        );
    } else {
        println!(
            "{}: .symb {} ({}), {} files, {:.2} MiB -> {:.2} MiB in {seconds:.1} s",
            a.output.display(),
            method.name(),
            summary.architecture,
            summary.files,
            input.file_len() as f64 / (1 << 20) as f64,
            summary.bytes as f64 / (1 << 20) as f64,
        );
    }
    Ok(())
}

fn preset(name: &str) -> Option<&'static Preset> {
    let name = name.to_ascii_lowercase();
    let name = match name.as_str() {
        "q3_k" => "q3_k_m",
        "q4_k" => "q4_k_m",
        "q5_k" => "q5_k_m",
        other => other,
    };
    PRESETS.iter().find(|p| p.name == name)
}

/// Whether llama-quantize converts this tensor at all: two or more dimensions, a name ending in
/// `weight`, and not a norm or one of the small kinds it keeps.
fn converts(t: &TensorInfo) -> bool {
    const KEPT: [&str; 11] = [
        "_norm.weight",
        "ffn_gate_inp.weight",
        "ffn_gate_tid2eid.weight",
        "altup",
        "laurel",
        "per_layer_model_proj",
        "ssm_conv1d",
        "shortconv.conv.weight",
        "attn_rel_b.weight",
        ".position_embd",
        ".patch_embd",
    ];
    t.shape.rank() >= 2
        && t.name.ends_with("weight")
        && !KEPT.iter().any(|k| t.name.contains(k))
        && t.name != "position_embd.weight"
        && t.name != "token_types.weight"
}

/// `target`, or what llama-quantize falls back to for rows of `cols` that are not whole
/// blocks of it: Q2_K and Q3_K -> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0 (and NVFP4's
/// 64 -> MXFP8), and F16 when even that does not fit.
fn type_for_rows(target: DType, cols: usize) -> DType {
    if cols.is_multiple_of(target.block_len()) {
        return target;
    }
    let fallback = match target {
        DType::Q2K | DType::Q3K => DType::Q4_0,
        DType::Q4K => DType::Q5_0,
        DType::Q5K => DType::Q5_1,
        DType::Q6K => DType::Q8_0,
        DType::IQ4XS => DType::IQ4NL,
        DType::NVFP4 => DType::MXFP8,
        DType::SQ1 | DType::SQ2 | DType::SQ3 | DType::SQ4 => DType::NVFP4,
        DType::SQ5 | DType::SQ6 | DType::SQ7 | DType::SQ8 => DType::MXFP8,
        other => other,
    };
    if cols.is_multiple_of(fallback.block_len()) {
        fallback
    } else if fallback != target {
        // synaptix's own chains: SQ1-SQ4 -> NVFP4 -> MXFP8 (llama-quantize's end at F16 here).
        type_for_rows(fallback, cols)
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

/// llama-quantize's choice of types for the matrices of one file, fed in its order (by layer).
struct Mixer<'p> {
    preset: &'p Preset,
    pure: bool,
    n_layer: usize,
    /// Query heads per KV head.
    n_gqa: usize,
    /// Attention-value matrices (`attn_v`, `attn_qkv`, `attn_kv_b`) in the file, and seen so far.
    n_attn_v: usize,
    i_attn_v: usize,
    /// FFN down projections seen so far.
    i_ffn_down: usize,
    /// An importance matrix was given (Q4_0/Q5_0 then give the first eighth of the FFN down
    /// projections Q4_1/Q5_1, as llama-quantize does).
    has_imatrix: bool,
    /// Experts per mixture-of-experts layer (0 for dense models): llama-quantize gives
    /// 8-expert models' attention more bits, and finds an FFN's layer in its name.
    n_expert: usize,
    /// No `output.weight`: the token embeddings serve as the output matrix too.
    tied: bool,
    /// `--output-tensor-type`, `--token-embedding-type`.
    output_tensor_type: Option<DType>,
    token_embedding_type: Option<DType>,
    /// `--tensor-type` patterns and their types, in the order given.
    overrides: Vec<(regex::Regex, DType)>,
}

fn is_attn_v(name: &str) -> bool {
    ["attn_v.weight", "attn_qkv.weight", "attn_kv_b.weight"]
        .iter()
        .any(|k| name.contains(k))
}

impl Mixer<'_> {
    /// llama.cpp's `use_more_bits`: the first and last eighth of the layers, and every third
    /// between.
    fn more_bits(i: usize, n: usize) -> bool {
        let (i, n) = (i as i64, n as i64);
        i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
    }

    /// The type of matrix `name` with rows of `cols`.
    fn choose(&mut self, name: &str, cols: usize) -> DType {
        // Explicit types first, as llama-quantize takes them (before `--pure` and the mixture).
        if let (Some(t), "token_embd.weight") = (self.token_embedding_type, name) {
            return type_for_rows(t, cols);
        }
        if let (Some(t), "output.weight") = (self.output_tensor_type, name) {
            return type_for_rows(t, cols);
        }
        let base = self.preset.dtype;
        let quantized = !matches!(base, DType::F32 | DType::F16 | DType::BF16);
        if !quantized {
            return base;
        }
        // A named type replaces the mixture's choice (and the matrix does not count in the
        // mixture's layer counters), as in llama-quantize.
        if let Some((_, t)) = self.overrides.iter().find(|(p, _)| p.is_match(name)) {
            return type_for_rows(*t, cols);
        }
        let mut ty = base;
        if !self.pure {
            let output = name == "output.weight" || (self.tied && name == "token_embd.weight");
            if let (true, Some(t)) = (output, self.output_tensor_type) {
                ty = t;
            } else if output {
                // synaptix's own presets keep the output in their own 8-bit types (rows that
                // do not fit fall back along their own chain below).
                if base == DType::NVFP4 {
                    ty = DType::MXFP8;
                } else if base.sq_bits().is_some() {
                    ty = DType::SQ8;
                } else if !cols.is_multiple_of(base.block_len()) {
                    ty = DType::Q8_0;
                } else if !matches!(base, DType::Q8_0 | DType::MXFP8) {
                    ty = DType::Q6K;
                }
            } else if name == "token_embd.weight" {
                // The presets here leave untied token embeddings at the base type.
            } else if is_attn_v(name) {
                let (i, gqa4) = (self.i_attn_v, self.n_gqa >= 4);
                match self.preset.mix {
                    Mix::Q2K => ty = if gqa4 { DType::Q4K } else { DType::Q3K },
                    Mix::Q2KS if gqa4 => ty = DType::Q4K,
                    Mix::Q3KM => ty = if i < 2 { DType::Q5K } else { DType::Q4K },
                    Mix::Q3KL => ty = DType::Q5K,
                    Mix::KM if Self::more_bits(i, self.n_attn_v) => ty = DType::Q6K,
                    Mix::Q4KS if i < 4 => ty = DType::Q5K,
                    Mix::IQ4 if gqa4 => ty = DType::Q5K,
                    _ => {}
                }
                if self.n_expert == 8 && base.in_gguf() {
                    ty = DType::Q8_0;
                }
                self.i_attn_v += 1;
            } else if name.contains("attn_k.weight") {
                if self.n_expert == 8 && base.in_gguf() {
                    ty = DType::Q8_0;
                }
            } else if name.contains("ffn_down") {
                // A mixture's FFN tensors (experts, shared expert) count by the layer they are in.
                let i = if self.n_expert > 1 {
                    layer_of(name).max(0) as usize
                } else {
                    self.i_ffn_down
                };
                let n = self.n_layer;
                if self.has_imatrix && i < n / 8 {
                    match self.preset.name {
                        "q4_0" => ty = DType::Q4_1,
                        "q5_0" => ty = DType::Q5_1,
                        _ => {}
                    }
                }
                match self.preset.mix {
                    Mix::Q2K => ty = DType::Q3K,
                    Mix::Q2KS if i < n / 8 => ty = DType::Q4K,
                    Mix::Q3KM => ty = if i < n / 16 { DType::Q5K } else { DType::Q4K },
                    Mix::Q3KL => ty = DType::Q5K,
                    Mix::KM if Self::more_bits(i, n) => ty = DType::Q6K,
                    Mix::Q4KS if i < n / 8 => ty = DType::Q5K,
                    Mix::IQ4 if i < n / 8 && !self.has_imatrix => ty = DType::Q5K,
                    _ => {}
                }
                self.i_ffn_down += 1;
            } else if name.contains("attn_output.weight") && self.n_expert == 8 {
                let listed = [
                    "q2_k", "q3_k_s", "q3_k_m", "q4_k_s", "q4_k_m", "iq4_nl", "iq4_xs",
                ];
                if listed.contains(&self.preset.name) {
                    ty = DType::Q5K;
                }
            } else if name.contains("attn_output.weight") {
                match self.preset.mix {
                    Mix::Q2K => ty = DType::Q3K,
                    Mix::Q3KM => ty = DType::Q4K,
                    Mix::Q3KL => ty = DType::Q5K,
                    _ => {}
                }
            }
        }
        type_for_rows(ty, cols)
    }
}

/// A type given by name (`q8_0`, `q6_k`, `f16`, ...), if given.
fn tensor_type(flag: &str, name: &Option<String>) -> Result<Option<DType>> {
    let Some(name) = name else {
        return Ok(None);
    };
    QUANTIZE_TARGETS
        .iter()
        .copied()
        .find(|d| d.name().eq_ignore_ascii_case(name))
        .map(Some)
        .with_context(|| {
            format!(
                "{flag} {name}: not a type synaptix quantizes to ({})",
                QUANTIZE_TARGETS
                    .iter()
                    .map(|d| d.name().to_ascii_lowercase())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
}

/// `--tensor-type` entries, then `--tensor-type-file`'s: `PATTERN=TYPE`, the pattern
/// lower-cased, as llama-quantize parses them.
fn tensor_type_overrides(a: &QuantizeArgs) -> Result<Vec<(regex::Regex, DType)>> {
    let mut entries = a.tensor_types.clone();
    if let Some(path) = &a.tensor_type_file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read --tensor-type-file {}", path.display()))?;
        entries.extend(text.split_whitespace().map(str::to_string));
    }
    entries
        .iter()
        .map(|entry| {
            let Some((pattern, ty)) = entry.split_once('=') else {
                bail!("--tensor-type {entry}: expected PATTERN=TYPE (e.g. attn_v=q8_0)");
            };
            if pattern.is_empty() || ty.is_empty() {
                bail!("--tensor-type {entry}: expected PATTERN=TYPE (e.g. attn_v=q8_0)");
            }
            let regex = regex::Regex::new(&pattern.to_lowercase()).map_err(|e| {
                // The parser's message spans lines; errors here are one line.
                let why = e
                    .to_string()
                    .split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" ");
                anyhow::anyhow!("--tensor-type {entry}: not a regular expression ({why})")
            })?;
            let dtype = tensor_type("--tensor-type", &Some(ty.to_string()))?
                .with_context(|| format!("--tensor-type {entry}: no type"))?;
            Ok((regex, dtype))
        })
        .collect()
}

/// What happens to one tensor.
struct Plan {
    dtype: DType,
    /// Converted (dequantized, then quantized to `dtype`), else copied.
    convert: bool,
}

pub fn run(mut a: QuantizeArgs) -> Result<()> {
    a.input = synaptix_bundle::cache::resolve_model(&a.input.to_string_lossy());
    crate::threads::init(a.threads)?;
    if let Some(method) = a.dtype.to_ascii_lowercase().strip_prefix("symb-") {
        return run_symb(&a, method);
    }
    let preset = preset(&a.dtype).with_context(|| {
        format!(
            "--type {}: not a preset synaptix quantizes to ({})",
            a.dtype,
            PRESETS
                .iter()
                .map(|p| p.name)
                .collect::<Vec<_>>()
                .join(", ")
        )
    })?;
    let start = Instant::now();
    let input = synaptix_models::open_model_file(&a.input)?;
    if a.input.canonicalize().ok() == a.output.canonicalize().ok() {
        bail!("the output would overwrite the input {}", a.input.display());
    }

    // llama-quantize's order: the tensors outside the layers, then layer by layer, by name
    // within each (so the two tools write the same file).
    let mut order: Vec<&TensorInfo> = input.tensors().iter().collect();
    order.sort_by_key(|t| (layer_of(&t.name), t.name.clone()));

    // The hyperparameters the mixtures look at (missing or per-layer arrays: the defaults).
    let arch = input
        .get_str("general.architecture")?
        .unwrap_or_default()
        .to_string();
    let hparam = |key: &str| input.get_u64(&format!("{arch}.{key}")).ok().flatten();
    let n_layer = hparam("block_count").unwrap_or(0) as usize;
    let heads = hparam("attention.head_count").unwrap_or(1).max(1);
    let kv_heads = hparam("attention.head_count_kv").unwrap_or(heads).max(1);
    let mut mixer = Mixer {
        preset,
        pure: a.pure,
        n_layer,
        n_gqa: (heads / kv_heads) as usize,
        n_attn_v: order.iter().filter(|t| is_attn_v(&t.name)).count(),
        i_attn_v: 0,
        i_ffn_down: 0,
        has_imatrix: false,
        n_expert: hparam("expert_count").unwrap_or(0) as usize,
        tied: !order.iter().any(|t| t.name == "output.weight"),
        output_tensor_type: tensor_type("--output-tensor-type", &a.output_tensor_type)?,
        token_embedding_type: tensor_type("--token-embedding-type", &a.token_embedding_type)?,
        overrides: tensor_type_overrides(&a)?,
    };
    let imatrix = match &a.imatrix {
        Some(path) => Some(
            synaptix_bundle::imatrix::Imatrix::read(path)
                .with_context(|| "reading the importance matrix".to_string())?,
        ),
        None => None,
    };
    mixer.has_imatrix = imatrix.is_some();
    let mut plans = Vec::with_capacity(order.len());
    // Matrices whose rows do not fit the type they would get, and the type they get instead.
    let mut fallbacks = Vec::new();
    let converted =
        |t: &TensorInfo| converts(t) && !(a.leave_output_tensor && t.name == "output.weight");
    for &t in &order {
        let cols = t.shape.dims().last().copied().unwrap_or(0);
        let dtype = if converted(t) {
            mixer.choose(&t.name, cols)
        } else {
            t.dtype
        };
        if converted(t) && !cols.is_multiple_of(preset.dtype.block_len()) {
            fallbacks.push(format!("{} ({cols} columns): {dtype}", t.name));
        }
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
    // Q2_K_S's Q2_K matrices (all but the token embeddings and the output) are quantized only
    // with importance statistics, as llama-quantize insists.
    if preset.mix == Mix::Q2KS {
        for (t, plan) in order.iter().zip(&plans) {
            let exempt = t.name == "token_embd.weight" || t.name == "output.weight";
            if !plan.convert || plan.dtype != DType::Q2K || exempt {
                continue;
            }
            match &imatrix {
                None => bail!(
                    "--type q2_k_s needs an importance matrix (--imatrix FILE; `synaptix \
                     imatrix` makes one): its Q2_K matrices are too coarse without one"
                ),
                Some(m) if !m.entries.contains_key(&t.name) => bail!(
                    "the importance matrix has no entry for {}, which q2_k_s quantizes to Q2_K",
                    t.name
                ),
                Some(_) => {}
            }
        }
    }

    // The input's metadata, then (moved to the end, as llama-quantize does) ggml's
    // GGML_QNT_VERSION and the file type.
    let to_syn = a
        .output
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("syn"));
    if let Some(p) = plans
        .iter()
        .find(|p| !p.dtype.in_gguf())
        .filter(|_| !to_syn)
    {
        bail!(
            "{} is synaptix's own type, which GGUF cannot hold: name the output *.syn to write              a bundle",
            p.dtype
        );
    }
    let mut metadata: Vec<(String, Value)> = input
        .metadata()
        .iter()
        .filter(|(key, _)| {
            key != "general.file_type"
                && key != "general.quantization_version"
                && !(to_syn && key == "general.alignment")
        })
        .cloned()
        .collect();
    metadata.push(("general.quantization_version".into(), Value::U32(2)));
    metadata.push(("general.file_type".into(), Value::U32(preset.file_type)));
    if let (Some(m), Some(path)) = (&imatrix, &a.imatrix) {
        // llama-quantize's record of it (strings cut at 127 bytes, as its fixed buffers do).
        let cut = |s: &str| -> String {
            let mut end = s.len().min(127);
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            s[..end].to_string()
        };
        metadata.push((
            "quantize.imatrix.file".into(),
            Value::String(cut(&path.to_string_lossy())),
        ));
        if let Some(first) = m.datasets.first() {
            metadata.push(("quantize.imatrix.dataset".into(), Value::String(cut(first))));
        }
        metadata.push((
            "quantize.imatrix.entries_count".into(),
            Value::U32(m.entries.len() as u32),
        ));
        if m.chunk_count > 0 {
            metadata.push((
                "quantize.imatrix.chunks_count".into(),
                Value::U32(m.chunk_count),
            ));
        }
    }
    let specs: Vec<SynTensor> = order
        .iter()
        .zip(&plans)
        .map(|(t, plan)| {
            let elements = t.elements() as usize;
            SynTensor {
                name: t.name.clone(),
                dims: t.shape.dims().iter().map(|&d| d as u64).collect(),
                dtype: plan.dtype,
                bytes: if plan.convert {
                    (elements / plan.dtype.block_len() * plan.dtype.block_bytes()) as u64
                } else {
                    t.n_bytes
                },
            }
        })
        .collect();

    let file = std::fs::File::create(&a.output)
        .with_context(|| format!("cannot create {}", a.output.display()))?;
    let mut out = BufWriter::with_capacity(8 << 20, file);
    let progress = !a.json && std::io::stderr().is_terminal();
    let n = plans.len();
    let mut failure: Option<anyhow::Error> = None;
    let fill = |i: usize| {
        let (t, plan) = (order[i], &plans[i]);
        if progress {
            eprint!("\r[{:>4}/{n}] {:<40.40}", i + 1, t.name);
        }
        let src = input.tensor_bytes(t);
        if !plan.convert {
            return Ok(src.to_vec());
        }
        let importance = imatrix
            .as_ref()
            .and_then(|m| m.entries.get(&t.name))
            .map(|entry| entry.importance());
        convert(t, src, plan.dtype, importance.as_deref()).map_err(|e| {
            let msg = format!("{}: {e:#}", t.name);
            failure = Some(anyhow::anyhow!(msg.clone()));
            std::io::Error::other(msg)
        })
    };
    let written = if to_syn {
        let source = serde_json::json!({"format": if input.is_syn() { "syn" } else { "gguf" },
                                        "version": input.version, "quantized": preset.name});
        write_syn(&mut out, &metadata, &specs, Some(source), fill)
    } else {
        let mut w = GgufWriter::new();
        // A .syn input carries its own format version, not a GGUF one.
        w.version = if input.is_syn() { 3 } else { input.version };
        for (key, value) in metadata {
            w.add_metadata(key, value);
        }
        for t in &specs {
            w.add_tensor_later(t.name.clone(), &t.dims, t.dtype, t.bytes);
        }
        w.write_streaming(&mut out, fill)
    };
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
            "type": preset.name,
            "pure": a.pure,
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
            eprintln!("note: {f}: its rows are not whole {} blocks", preset.dtype);
        }
        println!(
            "{}: {converted} of {n} tensors converted ({} preset{}, {} with rows that fall \
             back), {:.2} MiB -> {:.2} MiB in {seconds:.1} s",
            a.output.display(),
            preset.name,
            if a.pure { ", pure" } else { "" },
            fallbacks.len(),
            input.file_len() as f64 / (1 << 20) as f64,
            out_bytes as f64 / (1 << 20) as f64,
        );
    }
    Ok(())
}

/// One tensor's bytes in `dtype`: dequantized to f32 and quantized again, rows in parallel
/// (blocks never straddle rows, so the result is the same as in one piece).
fn convert(
    t: &TensorInfo,
    src: &[u8],
    dtype: DType,
    importance: Option<&[f32]>,
) -> Result<Vec<u8>> {
    let cols = t.shape.dims().last().copied().unwrap_or(0);
    let rows = (t.elements() as usize).checked_div(cols).unwrap_or(0);
    // Rows of one matrix: an expert's in a `[experts, rows, cols]` stack.
    let dims = t.shape.dims();
    let matrices = if dims.len() == 3 { dims[0].max(1) } else { 1 };
    let rows_per_matrix = rows / matrices;
    if let Some(imp) = importance {
        if imp.len() != matrices * cols {
            bail!(
                "the importance matrix has {} values for {matrices} matrices of {cols} columns",
                imp.len()
            );
        }
    }
    let src_row = src.len().checked_div(rows).unwrap_or(0);
    let out_row = cols / dtype.block_len() * dtype.block_bytes();
    // Chunks of rows big enough to amortise the scheduling.
    let chunk = (1 << 16) / cols.max(1) + 1;
    let values = |rows_in: &[u8]| -> Result<Vec<f32>> {
        let mut x = vec![0f32; rows_in.len() / src_row.max(1) * cols];
        dequantize(t.dtype, rows_in, &mut x)?;
        Ok(x)
    };
    // NVFP4's scale belongs to the whole tensor: its largest finite magnitude first.
    let tensor_scale = if dtype == DType::NVFP4 {
        let amaxes: Vec<Result<f32>> = src
            .par_chunks(src_row.max(1) * chunk)
            .map(|rows_in| Ok(finite_amax(&values(rows_in)?)))
            .collect();
        let mut amax = 0f32;
        for a in amaxes {
            amax = amax.max(a?);
        }
        Some(nvfp4_tensor_scale(amax))
    } else {
        None
    };
    let parts: Vec<Result<Vec<u8>>> = src
        .par_chunks(src_row.max(1) * chunk)
        .enumerate()
        .map(|(c, rows_in)| {
            let x = values(rows_in)?;
            let mut out = Vec::with_capacity(x.len() / cols.max(1) * out_row);
            match (tensor_scale, importance) {
                (Some(scale), _) => quantize_nvfp4_with_scale(&x, scale, &mut out)?,
                (None, Some(imp)) => {
                    for (k, row) in x.chunks_exact(cols).enumerate() {
                        let m = (c * chunk + k) / rows_per_matrix.max(1);
                        let w = &imp[m * cols..(m + 1) * cols];
                        quantize_weights_weighted(dtype, row, cols, w, &mut out)?;
                    }
                }
                (None, None) => quantize_weights(dtype, &x, &mut out)?,
            }
            Ok(out)
        })
        .collect();
    let mut out = Vec::with_capacity(rows * out_row);
    for p in parts {
        out.extend_from_slice(&p?);
    }
    Ok(out)
}
