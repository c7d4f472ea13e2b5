//! Hugging Face `tokenizer.json` through the `tokenizers` crate.
//!
//! Encoding is the crate's. What a token stands for as bytes (needed for streaming, where a
//! character may be split over several tokens) is worked out here from the decoder that the
//! file declares, because the crate only decodes to `String`, which cannot hold half a
//! character. BOS/EOS and the chat template are not part of `tokenizer.json`; they are read from
//! a `tokenizer_config.json` beside it when there is one.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde_json::Value as Json;

use crate::byte_level;
use crate::error::{Result, TokenizerError};

pub(crate) struct HfTokenizer {
    path: PathBuf,
    /// `encode` needs to switch special-token parsing, a setting of the tokenizer object.
    inner: Mutex<tokenizers::Tokenizer>,
    pub pieces: Vec<Box<[u8]>>,
    /// Ids of added tokens marked special (rendered only on request).
    pub special_ids: Vec<u32>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
    pub eog: Vec<u32>,
    pub chat_template: Option<String>,
}

impl std::fmt::Debug for HfTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HfTokenizer")
            .field("path", &self.path)
            .field("vocab_size", &self.pieces.len())
            .finish()
    }
}

/// How the declared decoder turns a token's text into bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PieceStyle {
    /// GPT-2 byte-level alphabet.
    ByteLevel,
    /// SentencePiece: U+2581 is a space, `<0xXX>` is a byte.
    Metaspace,
    /// Anything else: ask the crate to decode the token alone.
    Other,
}

fn piece_style(decoder: Option<&Json>) -> PieceStyle {
    let Some(d) = decoder else {
        return PieceStyle::Other;
    };
    let kind = d.get("type").and_then(Json::as_str).unwrap_or("");
    match kind {
        "ByteLevel" => PieceStyle::ByteLevel,
        "Metaspace" | "ByteFallback" => PieceStyle::Metaspace,
        "Sequence" => {
            let parts = d.get("decoders").and_then(Json::as_array);
            let styles: Vec<PieceStyle> = parts
                .into_iter()
                .flatten()
                .map(|p| piece_style(Some(p)))
                .collect();
            let replaces_metaspace = parts.into_iter().flatten().any(|p| {
                p.get("type").and_then(Json::as_str) == Some("Replace")
                    && p.pointer("/pattern/String").and_then(Json::as_str) == Some("\u{2581}")
            });
            if styles.contains(&PieceStyle::ByteLevel) {
                PieceStyle::ByteLevel
            } else if styles.contains(&PieceStyle::Metaspace) || replaces_metaspace {
                PieceStyle::Metaspace
            } else {
                PieceStyle::Other
            }
        }
        _ => PieceStyle::Other,
    }
}

fn parse_hex_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// `tokenizer_config.json`'s chat template: a string, or a list of named templates of which
/// the default one is taken.
fn config_chat_template(config: &Json) -> Option<String> {
    match config.get("chat_template") {
        Some(Json::String(s)) => Some(s.clone()),
        Some(Json::Array(list)) => list
            .iter()
            .find(|t| t.get("name").and_then(Json::as_str) == Some("default"))
            .and_then(|t| t.get("template").and_then(Json::as_str))
            .map(str::to_string),
        _ => None,
    }
}

/// A token given in `tokenizer_config.json` as a string or as `{"content": ...}`.
fn config_token(config: &Json, key: &str) -> Option<String> {
    let v = config.get(key)?;
    v.as_str()
        .or_else(|| v.get("content").and_then(Json::as_str))
        .map(str::to_string)
}

/// What `tokenizer.json` leaves to other files: BOS, EOS and the chat template.
pub(crate) struct HfExtras {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub chat_template: Option<String>,
}

impl HfTokenizer {
    /// `tokenizer.json` at `path`, with BOS, EOS and the chat template from
    /// `tokenizer_config.json` beside it (and `chat_template.jinja`, where newer exports keep
    /// the template).
    pub fn load(path: &Path) -> Result<HfTokenizer> {
        let raw = std::fs::read(path).map_err(|source| TokenizerError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let dir = path.parent();
        let config: Option<Json> = dir
            .map(|dir| dir.join("tokenizer_config.json"))
            .and_then(|p| std::fs::read(p).ok())
            .and_then(|b| serde_json::from_slice(&b).ok());
        let template_file = dir
            .map(|dir| dir.join("chat_template.jinja"))
            .and_then(|p| std::fs::read_to_string(p).ok());
        Self::from_json(path, &raw, |inner| {
            let lookup = |key: &str| {
                config
                    .as_ref()
                    .and_then(|c| config_token(c, key))
                    .and_then(|t| inner.token_to_id(&t))
            };
            HfExtras {
                bos: lookup("bos_token"),
                eos: lookup("eos_token"),
                chat_template: config
                    .as_ref()
                    .and_then(config_chat_template)
                    .or(template_file),
            }
        })
    }

    /// A `tokenizer.json` held in memory (`path` names it in errors); `extras` gives what the
    /// file does not say, once the tokenizer is parsed.
    pub fn from_json(
        path: &Path,
        raw: &[u8],
        extras: impl FnOnce(&tokenizers::Tokenizer) -> HfExtras,
    ) -> Result<HfTokenizer> {
        let err = |message: String| TokenizerError::TokenizerJson {
            path: path.to_path_buf(),
            message,
        };
        let json: Json = serde_json::from_slice(raw).map_err(|e| err(e.to_string()))?;
        let mut inner = tokenizers::Tokenizer::from_bytes(raw).map_err(|e| err(e.to_string()))?;
        // The file's truncation and padding (BERT exports carry e.g. a fixed 128) are a batch
        // encoder's settings: `encode` gives a text's ids whole, and callers truncate or pad.
        inner
            .with_truncation(None)
            .map_err(|e| err(e.to_string()))?;
        inner.with_padding(None);

        let style = piece_style(json.get("decoder"));
        drop(json);
        let added = inner.get_added_tokens_decoder();
        let n = inner.get_vocab_size(true);
        // Ids may have holes (an added token far past the model's vocabulary): size the table
        // by the largest id.
        let max_id = added.keys().copied().max().map_or(0, |m| m as usize + 1);
        let n = n.max(max_id);
        let mut pieces = Vec::with_capacity(n);
        for id in 0..n as u32 {
            let piece: Vec<u8> = if let Some(t) = added.get(&id) {
                t.content.as_bytes().to_vec()
            } else if let Some(text) = inner.id_to_token(id) {
                match style {
                    PieceStyle::ByteLevel => {
                        let mut out = Vec::with_capacity(text.len());
                        for c in text.chars() {
                            match byte_level::char_to_byte(c) {
                                Some(b) => out.push(b),
                                None => {
                                    let mut buf = [0u8; 4];
                                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                                }
                            }
                        }
                        out
                    }
                    PieceStyle::Metaspace => match parse_hex_byte_token(&text) {
                        Some(b) => vec![b],
                        None => text.replace('\u{2581}', " ").into_bytes(),
                    },
                    PieceStyle::Other => inner
                        .decode(&[id], false)
                        .map_err(|e| err(e.to_string()))?
                        .into_bytes(),
                }
            } else {
                Vec::new()
            };
            pieces.push(piece.into_boxed_slice());
        }
        let mut special_ids: Vec<u32> = added
            .iter()
            .filter(|(_, t)| t.special)
            .map(|(&id, _)| id)
            .collect();
        special_ids.sort_unstable();

        let HfExtras {
            bos,
            eos,
            chat_template,
        } = extras(&inner);
        // Whether encoding with special tokens adds BOS/EOS is the post-processor's business;
        // observe it rather than trusting a flag.
        let framed = inner
            .encode_fast("", true)
            .map_err(|e| err(e.to_string()))?
            .get_ids()
            .to_vec();
        let add_bos = bos.is_some() && framed.first().copied() == bos;
        let add_eos = eos.is_some() && framed.last().copied() == eos;

        let mut eog: Vec<u32> = crate::vocab::EOG_NAMES
            .iter()
            .filter_map(|name| inner.token_to_id(name))
            .chain(eos)
            .collect();
        eog.sort_unstable();
        eog.dedup();

        Ok(HfTokenizer {
            path: path.to_path_buf(),
            inner: Mutex::new(inner),
            pieces,
            special_ids,
            bos,
            eos,
            add_bos,
            add_eos,
            eog,
            chat_template,
        })
    }

    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        // A panic while holding the lock cannot leave the tokenizer half-updated (the only
        // mutation is a flag), so a poisoned lock is safe to reuse.
        let mut inner = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        inner.set_encode_special_tokens(!parse_special);
        let enc =
            inner
                .encode_fast(text, add_special)
                .map_err(|e| TokenizerError::TokenizerJson {
                    path: self.path.clone(),
                    message: e.to_string(),
                })?;
        Ok(enc.get_ids().to_vec())
    }

    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .token_to_id(text)
    }

    /// The vocabulary's (or an added token's) text for `id`.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .id_to_token(id)
    }

    pub fn is_special(&self, id: u32) -> bool {
        self.special_ids.binary_search(&id).is_ok()
    }
}
