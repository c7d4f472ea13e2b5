//! Where fetched models live: `$SYNAPTIX_MODELS`, else `$XDG_CACHE_HOME/synaptix/models`, else
//! `~/.cache/synaptix/models` (the directory `scripts/fetch-models.sh` fills).

use std::path::PathBuf;

pub fn models_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("SYNAPTIX_MODELS") {
        return PathBuf::from(dir);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"));
    cache.join("synaptix").join("models")
}

/// The cached file (or directory) of a model `scripts/fetch-models.sh` knows, by its short name.
pub fn known_model_file(name: &str) -> Option<&'static str> {
    match name {
        "gemma3-270m" => Some("gemma-3-270m-q4_k_m.gguf"),
        "qwen2.5-coder-0.5b" => Some("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
        // A directory: model.bin, config.json, tokenizer.json, vocabulary.txt.
        "whisper-base" => Some("whisper-base"),
        // A directory (Hugging Face's layout): model.safetensors, config.json, tokenizer.json,
        // modules.json, sentence_bert_config.json, 1_Pooling/config.json.
        "all-minilm-l6-v2" => Some("all-minilm-l6-v2"),
        // A directory: en_US-joe-medium.onnx (a Piper VITS voice) and en_US-joe-medium.onnx.json.
        "piper-en-us-joe-medium" => Some("piper-en-us-joe-medium"),
        // Silero VAD v6 (faster-whisper's copy).
        "silero-vad" => Some("silero_vad_v6.onnx"),
        _ => None,
    }
}

/// Resolves a model argument: an existing path as is, else a known short name in the cache.
pub fn resolve_model(arg: &str) -> PathBuf {
    let path = PathBuf::from(arg);
    if path.exists() {
        return path;
    }
    match known_model_file(arg) {
        Some(file) => models_dir().join(file),
        None => path,
    }
}
