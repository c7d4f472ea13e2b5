//! Shared by the integration tests: where the real models and the goldens are.

#![allow(dead_code)]

use std::path::PathBuf;

use serde_json::Value;
use synaptix_tokenizer::Tokenizer;

pub const GEMMA: (&str, &str) = ("gemma3-270m", "gemma-3-270m-q4_k_m.gguf");
pub const QWEN: (&str, &str) = (
    "qwen2.5-coder-0.5b",
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
);

/// `$SYNAPTIX_MODELS`, else `${XDG_CACHE_HOME:-$HOME/.cache}/synaptix/models` (where
/// `scripts/fetch-models.sh` puts them).
pub fn models_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("SYNAPTIX_MODELS") {
        return PathBuf::from(dir);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .expect("neither XDG_CACHE_HOME nor HOME is set");
    cache.join("synaptix").join("models")
}

/// The model's path; a missing model fails the test (it is never skipped silently).
pub fn model_path(file: &str) -> PathBuf {
    let path = models_dir().join(file);
    assert!(
        path.exists(),
        "{} not found: run scripts/fetch-models.sh (or point SYNAPTIX_MODELS at the directory)",
        path.display()
    );
    path
}

pub fn load(model: (&str, &str)) -> Tokenizer {
    let path = model_path(model.1);
    Tokenizer::from_gguf_path(&path)
        .unwrap_or_else(|e| panic!("loading the tokenizer of {}: {e}", path.display()))
}

pub fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/tokenizer")
}

pub fn read_json(name: &str) -> Value {
    let path = fixtures_dir().join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn corpus() -> Vec<(String, String)> {
    read_json("corpus.json")["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_string(),
                e["text"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// A golden piece: a string, or `{"bytes": [...]}` for bytes that are not UTF-8 alone.
pub fn piece_bytes(v: &Value) -> Vec<u8> {
    match v {
        Value::String(s) => s.as_bytes().to_vec(),
        Value::Object(o) => o["bytes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap() as u8)
            .collect(),
        other => panic!("bad piece {other}"),
    }
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}
