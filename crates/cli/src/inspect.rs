use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::Result;
use clap::Args;
use synaptix_bundle::onnx::{Dim, OnnxFile, TensorData, ValueInfo};
use synaptix_bundle::{Ct2File, SafetensorsFile, Value};

/// Arrays longer than this are shown as their first items and a count.
const ARRAY_PREVIEW: usize = 8;

#[derive(Args)]
#[command(
    after_help = "Examples:\n  synaptix inspect model.gguf\n  synaptix inspect model.gguf --json | jq .totals\n  \
                  synaptix inspect whisper-base            # a CTranslate2 model directory (model.bin)\n  \
                  synaptix inspect all-minilm-l6-v2        # a Hugging Face directory (model.safetensors)\n  \
                  synaptix inspect piper-en-us-joe-medium  # an ONNX model (a Piper voice)"
)]
pub struct InspectArgs {
    /// GGUF file, .syn bundle, CTranslate2 model.bin, .safetensors or .onnx file (or a directory holding
    /// model.bin, model.safetensors or one .onnx file), or the name of a fetched model
    pub file: PathBuf,
    /// Print one JSON object instead of tables
    #[arg(long)]
    pub json: bool,
    /// Do not list individual tensors
    #[arg(long)]
    pub no_tensors: bool,
    /// Check every tensor's bytes against a .syn bundle's checksums (reads the whole file)
    #[arg(long)]
    pub verify: bool,
}

pub fn run(mut a: InspectArgs) -> Result<()> {
    a.file = synaptix_bundle::cache::resolve_model(&a.file.to_string_lossy());
    if let Some(onnx) = onnx_model(&a.file)? {
        return inspect_onnx(&onnx, &a);
    }
    // A Hugging Face LLM directory shows as the model synaptix reads (GGUF's names and keys);
    // other safetensors (BERT, single files) show as stored.
    let hf_llm = synaptix_models::is_hf_llm_dir(&a.file);
    if let Some(st) = safetensors_model(&a.file).filter(|_| !hf_llm) {
        return inspect_safetensors(&st, &a);
    }
    if let Some(model_bin) = ct2_model(&a.file) {
        return inspect_ct2(&model_bin, &a);
    }
    let file = synaptix_models::open_model_file(&a.file)?;
    if a.verify && !file.is_syn() {
        anyhow::bail!(
            "--verify: {} is {}, which has no checksums (convert it to .syn to get them)",
            a.file.display(),
            file.format_label()
        );
    }
    let verified = a.verify
        && crate::convert::verify_checksums(
            &file,
            !a.json && std::io::IsTerminal::is_terminal(&std::io::stderr()),
        )?;
    let mut totals: BTreeMap<String, (u64, u64, u64)> = BTreeMap::new();
    for t in file.tensors() {
        let e = totals.entry(t.dtype.name().to_string()).or_default();
        e.0 += 1;
        e.1 += t.elements();
        e.2 += t.n_bytes;
    }
    let n_params: u64 = file.tensors().iter().map(|t| t.elements()).sum();
    let n_bytes: u64 = file.tensors().iter().map(|t| t.n_bytes).sum();
    if a.json {
        let metadata: serde_json::Map<String, serde_json::Value> = file
            .metadata()
            .iter()
            .map(|(k, v)| (k.clone(), value_json(v)))
            .collect();
        let tensors: Vec<_> = if a.no_tensors {
            Vec::new()
        } else {
            file.tensors()
                .iter()
                .map(|t| {
                    serde_json::json!({
                        "name": t.name, "type": t.dtype.name(), "shape": t.shape.dims(),
                        "offset": t.file_offset, "bytes": t.n_bytes,
                    })
                })
                .collect()
        };
        let totals: serde_json::Map<String, serde_json::Value> = totals
            .iter()
            .map(|(k, (n, e, b))| {
                (
                    k.clone(),
                    serde_json::json!({"tensors": n, "elements": e, "bytes": b}),
                )
            })
            .collect();
        let out = serde_json::json!({
            "file": a.file.display().to_string(),
            "format": if file.is_syn() {
                "syn"
            } else if synaptix_models::is_symb_dir(&a.file) {
                "symb"
            } else if file.is_assembled() {
                "safetensors"
            } else {
                "gguf"
            },
            "format_label": file.format_label(),
            "version": file.version,
            "checksums_verified": verified,
            "alignment": file.alignment,
            "file_bytes": file.file_len(),
            "n_params": n_params,
            "tensor_bytes": n_bytes,
            "metadata": metadata,
            "tensors": tensors,
            "totals": totals,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "{}: {}, {} metadata keys, {} tensors, {} parameters, {}{}",
        a.file.display(),
        file.format_label(),
        file.metadata().len(),
        file.tensors().len(),
        human_count(n_params),
        human_bytes(n_bytes),
        if verified {
            ", every tensor's checksum verified"
        } else {
            ""
        }
    );
    println!("\nmetadata:");
    let width = file
        .metadata()
        .iter()
        .map(|(k, _)| k.len())
        .max()
        .unwrap_or(0);
    for (k, v) in file.metadata() {
        println!("  {k:<width$} = {}", v.summary(ARRAY_PREVIEW));
    }
    if !a.no_tensors {
        println!("\ntensors:");
        let width = file
            .tensors()
            .iter()
            .map(|t| t.name.len())
            .max()
            .unwrap_or(0);
        for t in file.tensors() {
            println!(
                "  {:<width$} {:<7} {:<20} {:>12}",
                t.name,
                t.dtype.name(),
                t.shape.to_string(),
                human_bytes(t.n_bytes)
            );
        }
    }
    println!("\ntotals by type:");
    for (k, (n, e, b)) in &totals {
        println!(
            "  {k:<8} {n:>5} tensors {:>10} params {:>12}",
            human_count(*e),
            human_bytes(*b)
        );
    }
    Ok(())
}

/// The CTranslate2 `model.bin` that `path` names: a directory holding one, or a file that starts
/// with a binary version CTranslate2 writes (5 or 6) rather than GGUF's magic.
fn ct2_model(path: &Path) -> Option<PathBuf> {
    if path.is_dir() {
        let bin = path.join("model.bin");
        return bin.is_file().then_some(bin);
    }
    let mut head = [0u8; 4];
    std::fs::File::open(path).ok()?.read_exact(&mut head).ok()?;
    matches!(u32::from_le_bytes(head), 5 | 6).then(|| path.to_path_buf())
}

/// The safetensors file that `path` names: a directory holding `model.safetensors` (and no
/// `model.bin`), a `.safetensors` file, or a file whose first bytes are a u64 header length
/// followed by `{`.
fn safetensors_model(path: &Path) -> Option<PathBuf> {
    if path.is_dir() {
        let st = path.join("model.safetensors");
        return (st.is_file() && !path.join("model.bin").is_file()).then_some(st);
    }
    if path.extension().is_some_and(|e| e == "safetensors") {
        return Some(path.to_path_buf());
    }
    let mut head = [0u8; 9];
    std::fs::File::open(path).ok()?.read_exact(&mut head).ok()?;
    let len = u64::from_le_bytes(head[..8].try_into().ok()?);
    (head[8] == b'{' && (2..=synaptix_bundle::safetensors::MAX_HEADER_LEN).contains(&len))
        .then(|| path.to_path_buf())
}

/// One tensor (or CTranslate2 variable) of a file, as the tables and the JSON show it.
struct Entry {
    name: String,
    dtype: &'static str,
    shape: Vec<usize>,
    offset: u64,
    bytes: u64,
    elements: u64,
}

/// A file's tensors for the safetensors and CTranslate2 listings: `noun` names them
/// ("tensors", "variables") in the text and the JSON.
struct Listing {
    noun: &'static str,
    entries: Vec<Entry>,
}

impl Listing {
    fn n_params(&self) -> u64 {
        self.entries.iter().map(|e| e.elements).sum()
    }

    fn n_bytes(&self) -> u64 {
        self.entries.iter().map(|e| e.bytes).sum()
    }

    /// Per type: (count, elements, bytes).
    fn totals(&self) -> BTreeMap<&'static str, (u64, u64, u64)> {
        let mut totals: BTreeMap<&'static str, (u64, u64, u64)> = BTreeMap::new();
        for e in &self.entries {
            let t = totals.entry(e.dtype).or_default();
            t.0 += 1;
            t.1 += e.elements;
            t.2 += e.bytes;
        }
        totals
    }

    /// The JSON object's entries list (empty with --no-tensors) and totals.
    fn json(&self, a: &InspectArgs) -> (serde_json::Value, serde_json::Value) {
        let entries: Vec<_> = if a.no_tensors {
            Vec::new()
        } else {
            self.entries
                .iter()
                .map(|e| {
                    serde_json::json!({
                        "name": e.name, "type": e.dtype, "shape": e.shape,
                        "offset": e.offset, "bytes": e.bytes,
                    })
                })
                .collect()
        };
        let totals: serde_json::Map<String, serde_json::Value> = self
            .totals()
            .iter()
            .map(|(k, (n, e, b))| {
                (
                    k.to_string(),
                    serde_json::json!({self.noun: n, "elements": e, "bytes": b}),
                )
            })
            .collect();
        (entries.into(), totals.into())
    }

    /// The table of entries (unless --no-tensors), then `extra` lines, then the totals.
    fn print(&self, a: &InspectArgs, extra: &[String]) {
        if !a.no_tensors {
            println!("\n{}:", self.noun);
            let width = self.entries.iter().map(|e| e.name.len()).max().unwrap_or(0);
            for e in &self.entries {
                println!(
                    "  {:<width$} {:<8} {:<16} {:>12}",
                    e.name,
                    e.dtype,
                    format!("{:?}", e.shape),
                    human_bytes(e.bytes)
                );
            }
        }
        for line in extra {
            println!("  {line}");
        }
        println!("\ntotals by type:");
        for (k, (n, e, b)) in &self.totals() {
            println!(
                "  {k:<8} {n:>5} {} {:>10} params {:>12}",
                self.noun,
                human_count(*e),
                human_bytes(*b)
            );
        }
    }
}

fn inspect_safetensors(path: &Path, a: &InspectArgs) -> Result<()> {
    let file = SafetensorsFile::open(path)?;
    let listing = Listing {
        noun: "tensors",
        entries: file
            .tensors()
            .iter()
            .map(|t| Entry {
                name: t.name.clone(),
                dtype: t.dtype.name(),
                shape: t.shape.clone(),
                offset: t.file_offset() as u64,
                bytes: t.byte_len() as u64,
                elements: t.elements() as u64,
            })
            .collect(),
    };
    if a.json {
        let (tensors, totals) = listing.json(a);
        let metadata: serde_json::Map<String, serde_json::Value> = file
            .metadata()
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::json!(v)))
            .collect();
        let out = serde_json::json!({
            "file": path.display().to_string(),
            "format": "safetensors",
            "header_bytes": file.header_len(),
            "file_bytes": file.file_len(),
            "n_params": listing.n_params(),
            "tensor_bytes": listing.n_bytes(),
            "metadata": metadata,
            "tensors": tensors,
            "totals": totals,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "{}: safetensors, {} metadata keys, {} tensors, {} parameters, {}",
        path.display(),
        file.metadata().len(),
        file.tensors().len(),
        human_count(listing.n_params()),
        human_bytes(listing.n_bytes())
    );
    if !file.metadata().is_empty() {
        println!("\nmetadata:");
        let width = file
            .metadata()
            .iter()
            .map(|(k, _)| k.len())
            .max()
            .unwrap_or(0);
        for (k, v) in file.metadata() {
            println!("  {k:<width$} = {v}");
        }
    }
    listing.print(a, &[]);
    Ok(())
}

fn inspect_ct2(path: &Path, a: &InspectArgs) -> Result<()> {
    let file = Ct2File::open(path)?;
    let listing = Listing {
        noun: "variables",
        entries: file
            .variables()
            .iter()
            .map(|v| Entry {
                name: v.name.clone(),
                dtype: v.dtype.name(),
                shape: v.shape.clone(),
                offset: v.file_offset() as u64,
                bytes: v.byte_len() as u64,
                elements: v.elements() as u64,
            })
            .collect(),
    };
    if a.json {
        let (variables, totals) = listing.json(a);
        let out = serde_json::json!({
            "file": path.display().to_string(),
            "format": "ctranslate2",
            "binary_version": file.binary_version(),
            "spec": file.spec(),
            "revision": file.revision(),
            "n_params": listing.n_params(),
            "variable_bytes": listing.n_bytes(),
            "aliases": file.aliases().iter().map(|(a, t)| serde_json::json!({"alias": a, "target": t})).collect::<Vec<_>>(),
            "variables": variables,
            "totals": totals,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "{}: CTranslate2 model v{}, spec {} (revision {}), {} variables, {} parameters, {}",
        path.display(),
        file.binary_version(),
        file.spec(),
        file.revision(),
        file.variables().len(),
        human_count(listing.n_params()),
        human_bytes(listing.n_bytes())
    );
    let aliases: Vec<String> = file
        .aliases()
        .iter()
        .map(|(alias, target)| format!("alias {alias} -> {target}"))
        .collect();
    listing.print(a, &aliases);
    Ok(())
}

/// The ONNX file that `path` names: a `.onnx` file, or a directory holding exactly one.
fn onnx_model(path: &Path) -> Result<Option<PathBuf>> {
    let is_onnx = |p: &Path| p.extension().is_some_and(|e| e == "onnx");
    if !path.is_dir() {
        return Ok(is_onnx(path).then(|| path.to_path_buf()));
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir(path)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && is_onnx(p))
        .collect();
    found.sort();
    match found.len() {
        0 => Ok(None),
        1 => Ok(found.pop()),
        n => anyhow::bail!(
            "{}: {n} .onnx files; name one: {}",
            path.display(),
            found
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// `[batch_size, phonemes]`: dim values, symbolic names, `?` for unknown; `?` for no shape.
fn shape_text(shape: &Option<Vec<Dim>>) -> String {
    match shape {
        None => "?".to_string(),
        Some(dims) => format!(
            "[{}]",
            dims.iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

fn value_info_json(v: &ValueInfo) -> serde_json::Value {
    let shape = v.shape.as_ref().map(|dims| {
        dims.iter()
            .map(|d| match d {
                Dim::Value(n) => serde_json::json!(n),
                Dim::Param(p) => serde_json::json!(p),
                Dim::Unknown => serde_json::Value::Null,
            })
            .collect::<Vec<_>>()
    });
    serde_json::json!({
        "name": v.name,
        "type": v.elem_type.map(|t| t.name()),
        "shape": shape,
    })
}

fn inspect_onnx(path: &Path, a: &InspectArgs) -> Result<()> {
    let file = OnnxFile::open(path)?;
    let g = &file.graph;
    let listing = Listing {
        noun: "initializers",
        entries: g
            .initializers
            .iter()
            .map(|t| Entry {
                name: t.name.clone(),
                dtype: t.data_type.name(),
                shape: t.dims.iter().map(|&d| d as usize).collect(),
                offset: match &t.data {
                    TensorData::Raw(r) => r.start as u64,
                    _ => t.offset as u64,
                },
                bytes: t.byte_len(),
                elements: t.elements(),
            })
            .collect(),
    };
    let mut ops: BTreeMap<&str, u64> = BTreeMap::new();
    for n in &g.nodes {
        *ops.entry(n.op_type.as_str()).or_default() += 1;
    }
    let opsets: Vec<_> = file
        .opset_imports
        .iter()
        .map(|o| serde_json::json!({"domain": o.domain, "version": o.version}))
        .collect();
    if a.json {
        let (initializers, totals) = listing.json(a);
        let out = serde_json::json!({
            "file": path.display().to_string(),
            "format": "onnx",
            "file_bytes": file.file_len(),
            "ir_version": file.ir_version,
            "opsets": opsets,
            "producer_name": file.producer_name,
            "producer_version": file.producer_version,
            "graph_name": g.name,
            "inputs": g.inputs.iter().map(value_info_json).collect::<Vec<_>>(),
            "outputs": g.outputs.iter().map(value_info_json).collect::<Vec<_>>(),
            "n_nodes": g.nodes.len(),
            "op_types": ops,
            "n_initializers": g.initializers.len(),
            "n_params": listing.n_params(),
            "initializer_bytes": listing.n_bytes(),
            "initializers": initializers,
            "totals": totals,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    let opsets: Vec<String> = file
        .opset_imports
        .iter()
        .map(|o| {
            let domain = if o.domain.is_empty() {
                "ai.onnx"
            } else {
                &o.domain
            };
            format!("{domain} {}", o.version)
        })
        .collect();
    let producer = format!("{} {}", file.producer_name, file.producer_version);
    println!(
        "{}: ONNX IR v{}, opsets {}, producer {}, graph {:?}, {} nodes, {} initializers, {} parameters, {}",
        path.display(),
        file.ir_version,
        opsets.join(", "),
        producer.trim(),
        g.name,
        g.nodes.len(),
        g.initializers.len(),
        human_count(listing.n_params()),
        human_bytes(listing.n_bytes())
    );
    for (title, values) in [("inputs", &g.inputs), ("outputs", &g.outputs)] {
        println!("\n{title}:");
        let width = values.iter().map(|v| v.name.len()).max().unwrap_or(0);
        for v in values {
            println!(
                "  {:<width$} {:<8} {}",
                v.name,
                v.elem_type.map_or("?", |t| t.name()),
                shape_text(&v.shape)
            );
        }
    }
    println!("\nop types ({} nodes):", g.nodes.len());
    let mut by_count: Vec<(&str, u64)> = ops.into_iter().collect();
    by_count.sort_by(|x, y| y.1.cmp(&x.1).then(x.0.cmp(y.0)));
    let width = by_count.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (op, n) in &by_count {
        println!("  {op:<width$} {n:>6}");
    }
    listing.print(a, &[]);
    Ok(())
}

fn value_json(v: &Value) -> serde_json::Value {
    use serde_json::json;
    match v {
        Value::U8(x) => json!(x),
        Value::I8(x) => json!(x),
        Value::U16(x) => json!(x),
        Value::I16(x) => json!(x),
        Value::U32(x) => json!(x),
        Value::I32(x) => json!(x),
        Value::U64(x) => json!(x),
        Value::I64(x) => json!(x),
        Value::F32(x) => json!(x),
        Value::F64(x) => json!(x),
        Value::Bool(x) => json!(x),
        Value::String(s) => json!(s),
        Value::Array(ty, items) if items.len() > ARRAY_PREVIEW => json!({
            "type": ty.name(),
            "len": items.len(),
            "head": items.iter().take(ARRAY_PREVIEW).map(value_json).collect::<Vec<_>>(),
        }),
        Value::Array(_, items) => json!(items.iter().map(value_json).collect::<Vec<_>>()),
    }
}

pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.2} {}", UNITS[unit])
}

pub fn human_count(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.2} B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.2} M", n as f64 / 1e6),
        n if n >= 1_000 => format!("{:.2} K", n as f64 / 1e3),
        n => n.to_string(),
    }
}
