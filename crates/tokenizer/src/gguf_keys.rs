//! A Hugging Face byte-level BPE `tokenizer.json` as llama.cpp's `tokenizer.ggml.*` keys, the
//! vocabulary `convert_hf_to_gguf.py` writes: every id's token text (holes become `[PAD<id>]`),
//! its type, the merges as `"a b"`, and the pre-tokenizer's name, recognised from the file's
//! split pattern. Tokenizers of other kinds (SentencePiece-style BPE with byte fallback,
//! WordPiece, unknown split patterns) give `None`: their files keep only
//! `tokenizer.huggingface.json`.

use serde_json::Value as Json;
use synaptix_bundle::{Value, ValueType};

/// Llama 3's split pattern, as its `tokenizer.json` writes it.
const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's: Llama 3's with single digits.
const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// GPT-2's, which a `ByteLevel` pre-tokenizer with `use_regex` applies itself.
const GPT2_PATTERN: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// llama.cpp's token types.
const NORMAL: i32 = 1;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const UNUSED: i32 = 5;

/// The pre-tokenizer name llama.cpp knows for a `pre_tokenizer` entry.
fn pre_tokenizer_name(pre: &Json) -> Option<&'static str> {
    let kind = pre.get("type")?.as_str()?;
    let by_pattern = |p: &str| match p {
        QWEN2_PATTERN => Some("qwen2"),
        LLAMA3_PATTERN => Some("llama-bpe"),
        GPT2_PATTERN => Some("gpt-2"),
        _ => None,
    };
    match kind {
        "ByteLevel" => pre
            .get("use_regex")
            .and_then(Json::as_bool)
            .unwrap_or(true)
            .then_some("gpt-2"),
        "Sequence" => {
            let parts = pre.get("pretokenizers")?.as_array()?;
            match parts.as_slice() {
                [split, byte_level]
                    if split.get("type")?.as_str()? == "Split"
                        && byte_level.get("type")?.as_str()? == "ByteLevel"
                        && byte_level.get("use_regex").and_then(Json::as_bool) == Some(false) =>
                {
                    by_pattern(split.pointer("/pattern/Regex")?.as_str()?)
                }
                _ => None,
            }
        }
        _ => None,
    }
}

/// Whether an added token not marked special still reads as a control token (`<|...|>`), as
/// `convert_hf_to_gguf.py` treats it.
fn looks_special(text: &str) -> bool {
    text.starts_with("<|") && text.ends_with("|>")
}

/// Whether the post-processor puts a special token before a single text (a BOS).
fn adds_bos(post: Option<&Json>) -> bool {
    let Some(post) = post else {
        return false;
    };
    match post.get("type").and_then(Json::as_str) {
        Some("TemplateProcessing") => post
            .pointer("/single/0")
            .is_some_and(|first| first.get("SpecialToken").is_some()),
        Some("Sequence") => post
            .get("processors")
            .and_then(Json::as_array)
            .is_some_and(|list| list.iter().any(|p| adds_bos(Some(p)))),
        _ => false,
    }
}

/// The `tokenizer.ggml.*` keys for a byte-level BPE `tokenizer.json` of `vocab_size` ids (the
/// model's embedding rows, which may exceed the tokenizer's).
pub fn gguf_vocab_keys(tokenizer_json: &str, vocab_size: usize) -> Option<Vec<(String, Value)>> {
    let json: Json = serde_json::from_str(tokenizer_json).ok()?;
    let add_bos = adds_bos(json.get("post_processor"));
    let model = json.get("model")?;
    if model.get("type")?.as_str()? != "BPE"
        || model.get("byte_fallback").and_then(Json::as_bool) == Some(true)
        || json.pointer("/decoder/type").and_then(Json::as_str) != Some("ByteLevel")
    {
        return None;
    }
    let pre = pre_tokenizer_name(json.get("pre_tokenizer")?)?;
    let mut tokens: Vec<Option<(String, i32)>> = vec![None; vocab_size];
    for (text, id) in model.get("vocab")?.as_object()? {
        let id = id.as_u64()? as usize;
        *tokens.get_mut(id)? = Some((text.clone(), NORMAL));
    }
    for added in json.get("added_tokens")?.as_array()? {
        let id = added.get("id")?.as_u64()? as usize;
        let text = added.get("content")?.as_str()?;
        let special = added.get("special").and_then(Json::as_bool) == Some(true);
        let kind = if special || looks_special(text) {
            CONTROL
        } else {
            USER_DEFINED
        };
        *tokens.get_mut(id)? = Some((text.to_string(), kind));
    }
    let (texts, kinds): (Vec<Value>, Vec<Value>) = tokens
        .into_iter()
        .enumerate()
        .map(|(id, t)| {
            let (text, kind) = t.unwrap_or_else(|| (format!("[PAD{id}]"), UNUSED));
            (Value::String(text), Value::I32(kind))
        })
        .unzip();
    let merges = model
        .get("merges")?
        .as_array()?
        .iter()
        .map(|m| match m {
            Json::String(s) => Some(Value::String(s.clone())),
            Json::Array(pair) => match pair.as_slice() {
                [a, b] => Some(Value::String(format!("{} {}", a.as_str()?, b.as_str()?))),
                _ => None,
            },
            _ => None,
        })
        .collect::<Option<Vec<Value>>>()?;
    Some(vec![
        ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
        ("tokenizer.ggml.pre".into(), Value::String(pre.into())),
        (
            "tokenizer.ggml.tokens".into(),
            Value::Array(ValueType::String, texts),
        ),
        (
            "tokenizer.ggml.token_type".into(),
            Value::Array(ValueType::I32, kinds),
        ),
        (
            "tokenizer.ggml.merges".into(),
            Value::Array(ValueType::String, merges),
        ),
        ("tokenizer.ggml.add_bos_token".into(), Value::Bool(add_bos)),
    ])
}

/// The reverse of [`gguf_vocab_keys`]: a byte-level BPE `tokenizer.json` from llama.cpp's
/// `tokenizer.ggml.*` keys (`get` looks one up), for the pre-tokenizers whose split pattern is
/// known (`qwen2`, `llama-bpe`, `gpt-2`, `default`). Normal tokens form the BPE vocabulary;
/// control and user-defined ones become added tokens (special for control); unused ones are
/// left out. `None` for other vocabularies.
pub fn tokenizer_json_from_vocab_keys<'a>(
    get: impl Fn(&str) -> Option<&'a Value>,
) -> Option<String> {
    let text = |k: &str| match get(k)? {
        Value::String(s) => Some(s.as_str()),
        _ => None,
    };
    let strings = |k: &str| -> Option<Vec<&'a str>> {
        match get(k)? {
            Value::Array(_, items) => items
                .iter()
                .map(|v| match v {
                    Value::String(s) => Some(s.as_str()),
                    _ => None,
                })
                .collect(),
            _ => None,
        }
    };
    if text("tokenizer.ggml.model")? != "gpt2" {
        return None;
    }
    let pattern = match text("tokenizer.ggml.pre").unwrap_or("default") {
        "qwen2" => Some(QWEN2_PATTERN),
        "llama-bpe" | "llama3" => Some(LLAMA3_PATTERN),
        "gpt-2" | "default" => None,
        _ => return None,
    };
    let tokens = strings("tokenizer.ggml.tokens")?;
    let kinds: Vec<i32> = match get("tokenizer.ggml.token_type") {
        Some(Value::Array(_, items)) => items
            .iter()
            .map(|v| v.as_i64().map(|k| k as i32))
            .collect::<Option<_>>()?,
        _ => vec![NORMAL; tokens.len()],
    };
    if kinds.len() != tokens.len() {
        return None;
    }
    let merges = strings("tokenizer.ggml.merges")?;
    let mut vocab = serde_json::Map::new();
    let mut added = Vec::new();
    for (id, (&token, &kind)) in tokens.iter().zip(&kinds).enumerate() {
        match kind {
            CONTROL | USER_DEFINED => added.push(serde_json::json!({
                "id": id,
                "content": token,
                "single_word": false,
                "lstrip": false,
                "rstrip": false,
                "normalized": false,
                "special": kind == CONTROL,
            })),
            UNUSED => {}
            _ => {
                vocab.insert(token.to_string(), Json::from(id));
            }
        }
    }
    let byte_level = |regex: bool| {
        serde_json::json!({
            "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": regex
        })
    };
    let pre_tokenizer = match pattern {
        Some(p) => serde_json::json!({
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": p}, "behavior": "Isolated", "invert": false},
                byte_level(false),
            ],
        }),
        None => byte_level(true),
    };
    let add_bos = matches!(get("tokenizer.ggml.add_bos_token"), Some(Value::Bool(true)));
    let bos = get("tokenizer.ggml.bos_token_id")
        .and_then(Value::as_u64)
        .and_then(|id| Some((id, *tokens.get(id as usize)?)));
    let post_processor = match (add_bos, bos) {
        (true, Some((id, bos))) => {
            let mut special = serde_json::Map::new();
            special.insert(
                bos.to_string(),
                serde_json::json!({"id": bos, "ids": [id], "tokens": [bos]}),
            );
            serde_json::json!({
            "type": "TemplateProcessing",
            "single": [
                {"SpecialToken": {"id": bos, "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
            ],
            "pair": [
                {"SpecialToken": {"id": bos, "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": bos, "type_id": 1}},
                {"Sequence": {"id": "B", "type_id": 1}},
            ],
            "special_tokens": special,
            })
        }
        _ => byte_level(false),
    };
    let json = serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": null,
            "continuing_subword_prefix": null,
            "end_of_word_suffix": null,
            "fuse_unk": false,
            "byte_fallback": false,
            "ignore_merges": false,
            "vocab": vocab,
            "merges": merges,
        },
    });
    serde_json::to_string(&json).ok()
}
