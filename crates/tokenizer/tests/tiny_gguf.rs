//! Tiny GGUF files built with `GgufWriter`: bad or missing metadata gives typed errors, never a
//! panic; small hand-made vocabularies tokenize as expected.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use synaptix_bundle::gguf::GgufWriter;
use synaptix_bundle::{GgufFile, Value, ValueType};
use synaptix_tokenizer::{Tokenizer, TokenizerError};

fn strings(items: &[&str]) -> Value {
    Value::Array(
        ValueType::String,
        items.iter().map(|s| Value::String(s.to_string())).collect(),
    )
}

fn f32s(items: &[f32]) -> Value {
    Value::Array(
        ValueType::F32,
        items.iter().map(|&v| Value::F32(v)).collect(),
    )
}

fn i32s(items: &[i32]) -> Value {
    Value::Array(
        ValueType::I32,
        items.iter().map(|&v| Value::I32(v)).collect(),
    )
}

/// Writes the metadata to a fresh GGUF file in the temp directory and opens it.
fn gguf(meta: Vec<(&str, Value)>) -> GgufFile {
    static N: AtomicUsize = AtomicUsize::new(0);
    let mut w = GgufWriter::new();
    for (k, v) in meta {
        w.add_metadata(k, v);
    }
    let path: PathBuf = std::env::temp_dir().join(format!(
        "synaptix-tokenizer-test-{}-{}.gguf",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&path, w.to_bytes()).unwrap();
    let file = GgufFile::open(&path).unwrap();
    // The file stays mapped; unlinking it is fine on Unix and keeps the temp dir clean.
    let _ = std::fs::remove_file(&path);
    file
}

fn load(meta: Vec<(&str, Value)>) -> Result<Tokenizer, TokenizerError> {
    Tokenizer::from_gguf(&gguf(meta))
}

fn s(v: &str) -> Value {
    Value::String(v.to_string())
}

#[test]
fn unknown_tokenizer_model() {
    let err = load(vec![
        ("tokenizer.ggml.model", s("bert")),
        ("tokenizer.ggml.tokens", strings(&["a"])),
    ])
    .unwrap_err();
    assert!(
        matches!(&err, TokenizerError::UnsupportedModel(m) if m == "bert"),
        "{err}"
    );
}

#[test]
fn missing_model_key() {
    let err = load(vec![("tokenizer.ggml.tokens", strings(&["a"]))]).unwrap_err();
    assert!(
        matches!(err, TokenizerError::MissingKey("tokenizer.ggml.model")),
        "{err}"
    );
}

#[test]
fn missing_tokens_array() {
    let err = load(vec![("tokenizer.ggml.model", s("llama"))]).unwrap_err();
    assert!(
        matches!(err, TokenizerError::MissingKey("tokenizer.ggml.tokens")),
        "{err}"
    );
}

#[test]
fn tokens_of_the_wrong_type() {
    let err = load(vec![
        ("tokenizer.ggml.model", s("llama")),
        ("tokenizer.ggml.tokens", i32s(&[1, 2])),
    ])
    .unwrap_err();
    assert!(matches!(err, TokenizerError::Gguf(_)), "{err}");
    let err = load(vec![
        ("tokenizer.ggml.model", Value::U32(3)),
        ("tokenizer.ggml.tokens", strings(&["a"])),
    ])
    .unwrap_err();
    assert!(matches!(err, TokenizerError::Gguf(_)), "{err}");
}

#[test]
fn empty_token_list() {
    let err = load(vec![
        ("tokenizer.ggml.model", s("llama")),
        ("tokenizer.ggml.tokens", strings(&[])),
    ])
    .unwrap_err();
    assert!(matches!(err, TokenizerError::InvalidKey { .. }), "{err}");
}

#[test]
fn bpe_without_merges() {
    let err = load(vec![
        ("tokenizer.ggml.model", s("gpt2")),
        ("tokenizer.ggml.pre", s("qwen2")),
        ("tokenizer.ggml.tokens", strings(&["a", "b"])),
    ])
    .unwrap_err();
    assert!(
        matches!(err, TokenizerError::MissingKey("tokenizer.ggml.merges")),
        "{err}"
    );
}

#[test]
fn unsupported_pre_tokenizer() {
    let err = load(vec![
        ("tokenizer.ggml.model", s("gpt2")),
        ("tokenizer.ggml.pre", s("no-such-pre")),
        ("tokenizer.ggml.tokens", strings(&["a"])),
        ("tokenizer.ggml.merges", strings(&[])),
    ])
    .unwrap_err();
    assert!(
        matches!(&err, TokenizerError::UnsupportedPreTokenizer(p) if p == "no-such-pre"),
        "{err}"
    );
}

#[test]
fn scores_shorter_than_tokens() {
    let err = load(vec![
        ("tokenizer.ggml.model", s("llama")),
        ("tokenizer.ggml.tokens", strings(&["a", "b"])),
        ("tokenizer.ggml.scores", f32s(&[0.0])),
    ])
    .unwrap_err();
    assert!(
        matches!(
            err,
            TokenizerError::InvalidKey {
                key: "tokenizer.ggml.scores",
                ..
            }
        ),
        "{err}"
    );
}

/// A SentencePiece vocabulary: control tokens, a few pieces, and byte tokens for two bytes.
fn tiny_spm(extra: Vec<(&'static str, Value)>) -> Result<Tokenizer, TokenizerError> {
    let tokens = [
        "<unk>", "<s>", "</s>", "▁", "a", "b", "c", "▁a", "ab", "▁ab", "<0xC3>", "<0xA9>", "<turn>",
    ];
    let scores = [
        0.0, 0.0, 0.0, -1.0, -2.0, -2.0, -2.0, -1.5, -1.0, -0.5, 0.0, 0.0, 0.0,
    ];
    let types = [2, 3, 3, 1, 1, 1, 1, 1, 1, 1, 6, 6, 3];
    let mut meta = vec![
        ("tokenizer.ggml.model", s("llama")),
        ("tokenizer.ggml.tokens", strings(&tokens)),
        ("tokenizer.ggml.scores", f32s(&scores)),
        ("tokenizer.ggml.token_type", i32s(&types)),
    ];
    meta.extend(extra);
    load(meta)
}

#[test]
fn tiny_sentencepiece_vocabulary() {
    let tok = tiny_spm(vec![]).unwrap();
    // Defaults of a `llama` vocabulary: BOS 1, EOS 2, add BOS, space prefix.
    assert_eq!(
        (tok.bos(), tok.eos(), tok.add_bos()),
        (Some(1), Some(2), true)
    );
    // " ab" merges to "▁ab" (the best score); "é" has no token: its two byte tokens.
    assert_eq!(tok.encode("ab é", true, false).unwrap(), [1, 9, 3, 10, 11]);
    // llama.cpp strips the prefixed space only when no BOS was removed before it.
    assert_eq!(tok.decode(&[9, 3, 10, 11]), "ab é");
    assert_eq!(tok.decode(&[1, 9, 3, 10, 11]), " ab é");
    // A control token in the text, with and without parse_special.
    assert_eq!(tok.encode("a<turn>a", false, true).unwrap(), [7, 12, 7]);
    assert_eq!(tok.token_to_piece(12), b"<turn>");
    assert!(tok.is_eog(2) && !tok.is_eog(1));
}

#[test]
fn sentencepiece_without_byte_token_is_an_error() {
    let tok = tiny_spm(vec![]).unwrap();
    // "z" has no token and no <0x7A> byte token.
    let err = tok.encode("z", false, false).unwrap_err();
    assert!(matches!(err, TokenizerError::NoByteToken(b'z')), "{err}");
}

#[test]
fn add_bos_without_bos_token_is_an_error() {
    // A BOS id outside the vocabulary is ignored; the default (1) stands. With a one-token
    // vocabulary the default is out of range too: no BOS at all.
    let tok = load(vec![
        ("tokenizer.ggml.model", s("llama")),
        ("tokenizer.ggml.tokens", strings(&["a"])),
        ("tokenizer.ggml.bos_token_id", Value::U32(99)),
        ("tokenizer.ggml.add_space_prefix", Value::Bool(false)),
    ])
    .unwrap();
    assert_eq!(tok.bos(), None);
    let err = tok.encode("a", true, false).unwrap_err();
    assert!(
        matches!(err, TokenizerError::MissingSpecialToken("BOS")),
        "{err}"
    );
    assert_eq!(tok.encode("a", false, false).unwrap(), [0]);
}

#[test]
fn tiny_byte_level_bpe_vocabulary() {
    // Byte-level alphabet: space is "Ġ".
    let tokens = ["a", "b", "Ġ", "ab", "Ġab", "<|end|>", "!"];
    let types = [1, 1, 1, 1, 1, 3, 1];
    let tok = load(vec![
        ("tokenizer.ggml.model", s("gpt2")),
        ("tokenizer.ggml.pre", s("gpt-2")),
        ("tokenizer.ggml.tokens", strings(&tokens)),
        ("tokenizer.ggml.token_type", i32s(&types)),
        ("tokenizer.ggml.merges", strings(&["a b", "Ġ ab"])),
        ("tokenizer.ggml.eos_token_id", Value::U32(5)),
    ])
    .unwrap();
    assert_eq!(tok.encode("ab ab!", false, false).unwrap(), [3, 4, 6]);
    assert_eq!(tok.encode("ab<|end|>", false, true).unwrap(), [3, 5]);
    assert_eq!(tok.decode(&[3, 4, 6, 5]), "ab ab!<|end|>");
    // `gpt2` defaults: no BOS added, BOS id 11 is out of range here.
    assert!(!tok.add_bos());
    assert_eq!(tok.bos(), None);
    assert!(tok.is_eog(5));
}

#[test]
fn tiny_llama3_vocabulary_ignores_merges_for_whole_words() {
    // Llama 3 (`llama-bpe`): a pre-tokenized word that is a token is taken whole, without
    // merging ("abc" exists but no merge path leads to it); BOS is added by default.
    let tokens = [
        "a",
        "b",
        "c",
        "ab",
        "abc",
        "Ġ",
        "<|begin_of_text|>",
        "<|eot_id|>",
    ];
    let types = [1, 1, 1, 1, 1, 1, 3, 3];
    let tok = load(vec![
        ("tokenizer.ggml.model", s("gpt2")),
        ("tokenizer.ggml.pre", s("llama-bpe")),
        ("tokenizer.ggml.tokens", strings(&tokens)),
        ("tokenizer.ggml.token_type", i32s(&types)),
        ("tokenizer.ggml.merges", strings(&["a b"])),
        ("tokenizer.ggml.bos_token_id", Value::U32(6)),
        ("tokenizer.ggml.eos_token_id", Value::U32(7)),
    ])
    .unwrap();
    assert!(tok.add_bos());
    assert_eq!(tok.encode("abc", true, false).unwrap(), [6, 4]);
    // "abca": not a token, so merged: "ab" + "c" + "a".
    assert_eq!(tok.encode("abca", false, false).unwrap(), [3, 2, 0]);
    assert_eq!(tok.eot(), Some(7));
    assert!(tok.is_eog(7));
    assert_eq!(tok.decode(&[6, 4, 7]), "abc<|eot_id|>");
}
