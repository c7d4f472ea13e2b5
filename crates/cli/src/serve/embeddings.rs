//! `POST /v1/embeddings` for a sentence-transformers model (what `synaptix embed` loads).
//!
//! Texts are embedded exactly as `synaptix embed` embeds them: tokenized with the directory's
//! tokenizer (`[CLS]` … `[SEP]`), cut to the model's max_seq_length, run in batches of 32, pooled
//! and normalised as the directory says, so the vectors are the same. Token-id inputs are
//! embedded as given (the client includes `[CLS]` and `[SEP]`); more ids than max_seq_length is a
//! 400 rather than a silent cut. `dimensions` keeps the first n values and L2-normalises them
//! again, as OpenAI's text-embedding-3 models do.

use std::net::TcpStream;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde_json::{json, Map, Value};
use synaptix_models::bert::{l2_normalize, BertEmbedder};
use synaptix_tokenizer::Tokenizer;

use super::{bind, parse_json, serve_forever, served_name, ApiError, Info, ServeArgs, Task};
use crate::http::{self, Request};

/// Inputs one request may give (OpenAI's limit).
const MAX_INPUTS: usize = 2048;
/// Sequences per forward pass (as `synaptix embed`, so the numbers are the same).
const BATCH: usize = 32;

/// Whether `path` is a sentence-transformers model (a directory, or its `.safetensors` file)
/// rather than a GGUF file.
pub(super) fn is_embedding_model(path: &Path) -> bool {
    path.is_dir() || path.extension().is_some_and(|e| e == "safetensors")
}

pub(super) fn run(a: ServeArgs) -> Result<()> {
    crate::device::require_cpu(&a.device, "embedding models run")?;
    if a.chat_template.is_some() {
        bail!(
            "--chat-template: {} is an embedding model",
            a.model.display()
        );
    }
    crate::threads::init(a.threads)?;
    let model = BertEmbedder::load(&a.model)?;
    let tokenizer = Tokenizer::from_tokenizer_json(&model.paths().tokenizer)
        .with_context(|| format!("{}", model.paths().tokenizer.display()))?;
    let name = served_name(&a);
    let listener = bind(&a)?;
    eprintln!(
        "synaptix serve: {name} (embeddings, dim {}, up to {} tokens per input) on cpu, \
         listening on http://{}",
        model.dim(),
        model.max_seq_length(),
        listener.local_addr()?
    );
    let info = Info {
        name: name.clone(),
        task: Task::Embedding,
        n_ctx: model.max_seq_length(),
        api_key: a.api_key.clone(),
    };
    let server = Embedder {
        model,
        tokenizer,
        name,
    };
    serve_forever(listener, info, |request, conn| server.answer(request, conn));
    Ok(())
}

struct Embedder {
    model: BertEmbedder,
    tokenizer: Tokenizer,
    name: String,
}

/// How the vectors are written.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Encoding {
    Float,
    /// Base64 of the little-endian f32 values.
    Base64,
}

/// A request, checked.
#[derive(Debug)]
struct EmbeddingRequest {
    inputs: Vec<Input>,
    encoding: Encoding,
    dimensions: Option<usize>,
}

#[derive(Debug, PartialEq)]
enum Input {
    Text(String),
    Ids(Vec<u32>),
}

impl Embedder {
    fn answer(&self, r: &Request, conn: &mut TcpStream) -> std::result::Result<(), ApiError> {
        let body: Value = parse_json(&r.body)?;
        let req = parse_request(&body, self.model.config().vocab_size, self.model.dim())?;
        let max = self.model.max_seq_length();
        let mut ids = Vec::with_capacity(req.inputs.len());
        for (i, input) in req.inputs.into_iter().enumerate() {
            ids.push(match input {
                Input::Text(text) => {
                    let full = self
                        .tokenizer
                        .encode(&text, true, false)
                        .map_err(|e| ApiError::bad(format!("input {i}: {e}")))?;
                    self.model.truncate(full)
                }
                Input::Ids(v) if v.len() > max => {
                    return Err(ApiError::bad(format!(
                        "input {i} has {} token ids; this model takes at most {max}",
                        v.len()
                    )))
                }
                Input::Ids(v) => v,
            });
        }
        let mut vectors = Vec::with_capacity(ids.len());
        for batch in ids.chunks(BATCH) {
            vectors.extend(self.model.embed(batch).map_err(|e| ApiError {
                status: 500,
                message: e.to_string(),
            })?);
        }
        let n_tokens: usize = ids.iter().map(Vec::len).sum();
        let data: Vec<Value> = vectors
            .into_iter()
            .enumerate()
            .map(|(index, mut v)| {
                if let Some(n) = req.dimensions {
                    v.truncate(n);
                    l2_normalize(&mut v);
                }
                let embedding = match req.encoding {
                    Encoding::Float => json!(v),
                    Encoding::Base64 => json!(base64_f32(&v)),
                };
                json!({"object": "embedding", "index": index, "embedding": embedding})
            })
            .collect();
        let body = json!({
            "object": "list",
            "data": data,
            "model": self.name,
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
        });
        let _ = http::respond(conn, 200, "application/json", body.to_string().as_bytes());
        Ok(())
    }
}

/// Checks a request body: `input` (a string, strings, token ids or arrays of them),
/// `encoding_format`, `dimensions` (at most `dim`); `model` and `user` are not used.
fn parse_request(
    body: &Value,
    vocab: usize,
    dim: usize,
) -> std::result::Result<EmbeddingRequest, ApiError> {
    let bad = |m: String| ApiError::bad(m);
    let obj: &Map<String, Value> = body
        .as_object()
        .ok_or_else(|| bad("the request body must be a JSON object".into()))?;
    let ids = |v: &[Value], what: &str| -> std::result::Result<Vec<u32>, ApiError> {
        if v.is_empty() {
            return Err(bad(format!("{what} is empty")));
        }
        v.iter()
            .map(|x| {
                x.as_u64()
                    .filter(|&id| (id as usize) < vocab)
                    .map(|id| id as u32)
                    .ok_or_else(|| {
                        bad(format!(
                            "{what}: {x} is not a token id (an integer below {vocab})"
                        ))
                    })
            })
            .collect()
    };
    let text = |s: &str, what: &str| {
        if s.is_empty() {
            Err(bad(format!("{what} is an empty string")))
        } else {
            Ok(Input::Text(s.to_string()))
        }
    };
    let inputs = match obj.get("input") {
        None | Some(Value::Null) => return Err(bad("input is required".into())),
        Some(Value::String(s)) => vec![text(s, "input")?],
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(bad("input is an empty array".into()))
        }
        // One sequence of token ids.
        Some(Value::Array(items)) if items[0].is_number() => vec![Input::Ids(ids(items, "input")?)],
        Some(Value::Array(items)) => {
            if items.len() > MAX_INPUTS {
                return Err(bad(format!(
                    "input has {} items; at most {MAX_INPUTS} per request",
                    items.len()
                )));
            }
            items
                .iter()
                .enumerate()
                .map(|(i, item)| match item {
                    Value::String(s) => text(s, &format!("input[{i}]")),
                    Value::Array(v) => Ok(Input::Ids(ids(v, &format!("input[{i}]"))?)),
                    _ => Err(bad(format!(
                        "input[{i}] must be a string or an array of token ids"
                    ))),
                })
                .collect::<std::result::Result<_, _>>()?
        }
        Some(_) => {
            return Err(bad(
                "input must be a string, an array of strings, an array of token ids or an \
                 array of such arrays"
                    .into(),
            ))
        }
    };
    let encoding = match obj.get("encoding_format") {
        None | Some(Value::Null) => Encoding::Float,
        Some(Value::String(s)) if s == "float" => Encoding::Float,
        Some(Value::String(s)) if s == "base64" => Encoding::Base64,
        Some(other) => {
            return Err(bad(format!(
                "encoding_format must be \"float\" or \"base64\", not {other}"
            )))
        }
    };
    let dimensions = match obj.get("dimensions") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_u64()
                .map(|n| n as usize)
                .filter(|n| (1..=dim).contains(n))
                .ok_or_else(|| {
                    bad(format!(
                        "dimensions must be an integer from 1 to {dim} (this model's size), \
                         not {v}"
                    ))
                })?,
        ),
    };
    for field in ["model", "user"] {
        if let Some(v) = obj.get(field).filter(|v| !v.is_null() && !v.is_string()) {
            return Err(bad(format!("{field} must be a string, not {v}")));
        }
    }
    Ok(EmbeddingRequest {
        inputs,
        encoding,
        dimensions,
    })
}

/// Standard base64 (with padding) of the values as little-endian f32, as OpenAI encodes them.
fn base64_f32(v: &[f32]) -> String {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    base64(&bytes)
}

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (b[0] as u32) << 16 | (b[1] as u32) << 8 | b[2] as u32;
        for k in 0..4 {
            if k <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * k) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_standard_encoding() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64(&[0xff, 0xfe, 0xfd, 0x00]), "//79AA==");
        // 1.0f32 is 00 00 80 3f in little-endian order.
        assert_eq!(base64_f32(&[1.0]), "AACAPw==");
    }

    fn parse(body: Value) -> std::result::Result<EmbeddingRequest, String> {
        parse_request(&body, 100, 8).map_err(|e| format!("{} {}", e.status, e.message))
    }

    #[test]
    fn inputs_of_every_shape_are_read() {
        let r = parse(json!({"input": "hi", "model": "x"})).unwrap();
        assert_eq!(r.inputs, [Input::Text("hi".into())]);
        assert_eq!(r.encoding, Encoding::Float);
        let r = parse(json!({"input": ["a", "b"], "encoding_format": "base64"})).unwrap();
        assert_eq!(r.inputs.len(), 2);
        assert_eq!(r.encoding, Encoding::Base64);
        let r = parse(json!({"input": [1, 2, 3], "dimensions": 4})).unwrap();
        assert_eq!(r.inputs, [Input::Ids(vec![1, 2, 3])]);
        assert_eq!(r.dimensions, Some(4));
        let r = parse(json!({"input": [[1, 2], [3], "text"]})).unwrap();
        assert_eq!(r.inputs.len(), 3);
    }

    #[test]
    fn bad_inputs_are_400s() {
        for body in [
            json!([]),
            json!({}),
            json!({"input": ""}),
            json!({"input": []}),
            json!({"input": [""]}),
            json!({"input": [[]]}),
            json!({"input": 5}),
            json!({"input": [1, "a"]}),
            json!({"input": [100]}),
            json!({"input": [-1]}),
            json!({"input": [1.5]}),
            json!({"input": [{"text": "a"}]}),
            json!({"input": vec!["a"; MAX_INPUTS + 1]}),
            json!({"input": "a", "encoding_format": "int8"}),
            json!({"input": "a", "dimensions": 0}),
            json!({"input": "a", "dimensions": 9}),
            json!({"input": "a", "model": 3}),
        ] {
            let e = parse(body.clone()).expect_err(&body.to_string());
            assert!(e.starts_with("400 "), "{body}: {e}");
        }
    }
}
