use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use synaptix_bundle::{GgufFile, Value};

/// Arrays longer than this are shown as their first items and a count.
const ARRAY_PREVIEW: usize = 8;

#[derive(Args)]
#[command(
    after_help = "Examples:\n  synaptix inspect model.gguf\n  synaptix inspect model.gguf --json | jq .totals"
)]
pub struct InspectArgs {
    /// GGUF file, or the name of a fetched model
    pub file: PathBuf,
    /// Print one JSON object instead of tables
    #[arg(long)]
    pub json: bool,
    /// Do not list individual tensors
    #[arg(long)]
    pub no_tensors: bool,
}

pub fn run(mut a: InspectArgs) -> Result<()> {
    a.file = synaptix_bundle::cache::resolve_model(&a.file.to_string_lossy());
    let file = GgufFile::open(&a.file)?;
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
            "version": file.version,
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
        "{}: GGUF v{}, {} metadata keys, {} tensors, {} parameters, {}",
        a.file.display(),
        file.version,
        file.metadata().len(),
        file.tensors().len(),
        human_count(n_params),
        human_bytes(n_bytes)
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
