//! synaptix-tokenizer: text to token ids and back.
//!
//! - [`Tokenizer::from_gguf`]: the vocabulary of a GGUF model, tokenized exactly as llama.cpp
//!   does: `llama` (SentencePiece-style merges by score with byte fallback, as Gemma 3 uses) and
//!   `gpt2` (byte-level BPE by merge rank after a pre-tokenizer: `default`, `gpt-2`, `llama-bpe`
//!   (Llama 3), `qwen2`, `starcoder` and their aliases). The test suite compares every entry of
//!   a corpus against ids recorded from llama.cpp's `llama-tokenize`.
//! - [`Tokenizer::from_tokenizer_json`]: a Hugging Face `tokenizer.json`, through the
//!   `tokenizers` crate.
//! - [`PiperPhonemizer`]: text to Piper (VITS) phoneme ids as `piper-tts` computes them for
//!   espeak voices, with espeak-ng ([`espeak`]) opened at run time.
//!
//! Ids are `u32`. Decoding never fails: ids outside the vocabulary are skipped (and
//! [`Tokenizer::token_to_piece`] gives no bytes for them), so a sampler bug cannot crash a
//! server; use [`Tokenizer::is_valid`] to check ids where that matters.

mod bpe;
mod byte_level;
mod error;
pub mod espeak;
mod gguf_keys;
mod hf;
mod piper;
mod pretokenize;
mod spm;
mod stream;
mod unicode;
mod unicode_table;
mod vocab;

use std::path::Path;

use synaptix_bundle::GgufFile;

pub use error::{Result, TokenizerError};
pub use gguf_keys::{gguf_vocab_keys, tokenizer_json_from_vocab_keys};
pub use piper::{PhonemeIds, PiperPhonemizer};
pub use pretokenize::PreTokenizer;
pub use stream::StreamDecoder;
pub use vocab::TokenAttr;

use hf::HfTokenizer;

/// GGUF's key for a whole Hugging Face `tokenizer.json`.
pub const KEY_HF_JSON: &str = "tokenizer.huggingface.json";
use vocab::Vocab;

/// Which tokenization algorithm a [`Tokenizer`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenizerKind {
    /// GGUF `llama`: SentencePiece-style BPE by score with byte fallback.
    SentencePiece,
    /// GGUF `gpt2`: byte-level BPE with the given pre-tokenizer.
    ByteLevelBpe(PreTokenizer),
    /// A Hugging Face `tokenizer.json`.
    HuggingFace,
}

/// A tokenizer: encodes text to ids and decodes ids to text. Cheap to share (`Send + Sync`).
#[derive(Debug)]
pub struct Tokenizer {
    backend: Backend,
}

#[derive(Debug)]
enum Backend {
    Gguf(Box<Vocab>),
    Hf(Box<HfTokenizer>),
}

impl Tokenizer {
    /// The tokenizer described by a GGUF file's `tokenizer.*` metadata.
    ///
    /// Errors: a missing or ill-typed key, an unsupported `tokenizer.ggml.model` or
    /// `tokenizer.ggml.pre`, array lengths that disagree.
    ///
    /// A file that carries a whole Hugging Face tokenizer in `tokenizer.huggingface.json`
    /// (GGUF's key for it; synaptix writes it for models from Hugging Face directories) gets
    /// that tokenizer, the original, even beside `tokenizer.ggml.*` keys; BOS, EOS and the chat
    /// template come from the `tokenizer.ggml.*_token_id` and `tokenizer.chat_template` keys.
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer> {
        if let Some(json) = file.get_str(KEY_HF_JSON)? {
            let id = |key: &str| -> Result<Option<u32>> {
                Ok(file.get_u64(key)?.and_then(|v| u32::try_from(v).ok()))
            };
            let bos = id("tokenizer.ggml.bos_token_id")?;
            let eos = id("tokenizer.ggml.eos_token_id")?;
            let chat_template = file.get_str("tokenizer.chat_template")?.map(str::to_string);
            let hf = HfTokenizer::from_json(file.path(), json.as_bytes(), |_| hf::HfExtras {
                bos,
                eos,
                chat_template,
            })?;
            return Ok(Tokenizer {
                backend: Backend::Hf(Box::new(hf)),
            });
        }
        Ok(Tokenizer {
            backend: Backend::Gguf(Box::new(Vocab::from_gguf(file)?)),
        })
    }

    /// The `tokenizer.ggml.*` vocabulary alone, as llama.cpp reads it, even where the file
    /// also carries `tokenizer.huggingface.json`.
    pub fn from_gguf_vocab(file: &GgufFile) -> Result<Tokenizer> {
        Ok(Tokenizer {
            backend: Backend::Gguf(Box::new(Vocab::from_gguf(file)?)),
        })
    }

    /// Opens a GGUF file and loads its tokenizer.
    pub fn from_gguf_path(path: impl AsRef<Path>) -> Result<Tokenizer> {
        Tokenizer::from_gguf(&GgufFile::open(path)?)
    }

    /// A Hugging Face `tokenizer.json`. BOS, EOS and the chat template come from a
    /// `tokenizer_config.json` in the same directory when there is one.
    pub fn from_tokenizer_json(path: impl AsRef<Path>) -> Result<Tokenizer> {
        Ok(Tokenizer {
            backend: Backend::Hf(Box::new(HfTokenizer::load(path.as_ref())?)),
        })
    }

    pub fn kind(&self) -> TokenizerKind {
        match &self.backend {
            Backend::Gguf(v) => match &v.algorithm {
                vocab::Algorithm::Spm => TokenizerKind::SentencePiece,
                vocab::Algorithm::Bpe { pre, .. } => TokenizerKind::ByteLevelBpe(*pre),
            },
            Backend::Hf(_) => TokenizerKind::HuggingFace,
        }
    }

    /// Encodes `text`.
    ///
    /// - `add_special`: add the BOS/EOS tokens the vocabulary asks for (`add_bos_token`,
    ///   `add_eos_token`).
    /// - `parse_special`: recognise control tokens written in the text (`<|im_start|>`,
    ///   `<start_of_turn>`, ...) as single tokens. User-defined tokens are recognised either way,
    ///   as in llama.cpp and Hugging Face tokenizers. Without it, control-token text is
    ///   tokenized as ordinary text: the way to keep user input from injecting turns.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        match &self.backend {
            Backend::Gguf(v) => v.encode(text, add_special, parse_special),
            Backend::Hf(h) => h.encode(text, add_special, parse_special),
        }
    }

    /// Decodes ids to text: the pieces joined as bytes, then converted to UTF-8 once at the
    /// end (invalid sequences become U+FFFD only there, so a character split over byte tokens
    /// survives). Special tokens are rendered as their text, except a leading BOS (or trailing
    /// EOS) that the vocabulary adds itself: `decode(encode(text, true, true)) == text` for the
    /// vocabularies tested. Ids outside the vocabulary are skipped.
    ///
    /// For GGUF vocabularies this is llama.cpp's `llama_detokenize(remove_special = true,
    /// unparse_special = true)`, including its space clean-up for the BPE pre-tokenizers that
    /// ask for it (not Qwen2).
    pub fn decode(&self, ids: &[u32]) -> String {
        String::from_utf8_lossy(&self.detokenize(ids, true, true)).into_owned()
    }

    /// Decoding to raw bytes with llama.cpp's options: `remove_special` drops the BOS/EOS the
    /// vocabulary adds; `unparse_special` renders control tokens (otherwise they give nothing).
    pub fn detokenize(&self, ids: &[u32], remove_special: bool, unparse_special: bool) -> Vec<u8> {
        match &self.backend {
            Backend::Gguf(v) => v.detokenize(ids, remove_special, unparse_special),
            Backend::Hf(h) => {
                let mut ids = ids;
                if remove_special && h.add_bos && h.bos.is_some() && ids.first().copied() == h.bos {
                    ids = &ids[1..];
                }
                if remove_special && h.add_eos && h.eos.is_some() && ids.last().copied() == h.eos {
                    ids = &ids[..ids.len() - 1];
                }
                let mut out = Vec::new();
                for &id in ids {
                    if !unparse_special && h.is_special(id) {
                        continue;
                    }
                    if let Some(p) = h.pieces.get(id as usize) {
                        out.extend_from_slice(p);
                    }
                }
                out
            }
        }
    }

    /// The bytes one token stands for, special tokens rendered as their text (llama.cpp's
    /// `token_to_piece` with `special = true`). A piece may be part of a UTF-8 character: a
    /// streaming caller buffers (see [`StreamDecoder`]). Empty for an id outside the vocabulary.
    pub fn token_to_piece(&self, id: u32) -> Vec<u8> {
        self.piece(id).map(<[u8]>::to_vec).unwrap_or_default()
    }

    /// As [`Tokenizer::token_to_piece`], borrowed.
    pub fn piece(&self, id: u32) -> Option<&[u8]> {
        match &self.backend {
            Backend::Gguf(v) => v.piece(id),
            Backend::Hf(h) => h.pieces.get(id as usize).map(|p| &p[..]),
        }
    }

    /// The piece without rendering control tokens (they give no bytes).
    pub fn piece_plain(&self, id: u32) -> Option<&[u8]> {
        match &self.backend {
            Backend::Gguf(v) => v.piece_plain(id),
            Backend::Hf(h) => {
                if h.is_special(id) {
                    h.pieces.get(id as usize).map(|_| &[][..])
                } else {
                    h.pieces.get(id as usize).map(|p| &p[..])
                }
            }
        }
    }

    /// Number of ids (the embedding table's row count for GGUF models).
    pub fn vocab_size(&self) -> usize {
        match &self.backend {
            Backend::Gguf(v) => v.tokens.len(),
            Backend::Hf(h) => h.pieces.len(),
        }
    }

    pub fn is_valid(&self, id: u32) -> bool {
        (id as usize) < self.vocab_size()
    }

    /// The vocabulary's text for a token (GGUF: as stored, e.g. `▁the` or `Ġthe`).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        match &self.backend {
            Backend::Gguf(v) => v.tokens.get(id as usize).map(|t| t.text.as_ref()),
            Backend::Hf(_) => None,
        }
    }

    /// The vocabulary's text for a token, for either kind of tokenizer (owned: a Hugging Face
    /// tokenizer looks it up behind a lock).
    pub fn token_string(&self, id: u32) -> Option<String> {
        match &self.backend {
            Backend::Gguf(_) => self.token_text(id).map(str::to_string),
            Backend::Hf(h) => h.id_to_token(id),
        }
    }

    /// The id of a token given by its vocabulary text (e.g. `<end_of_turn>`).
    pub fn token_id(&self, text: &str) -> Option<u32> {
        match &self.backend {
            Backend::Gguf(v) => v.token_id(text),
            Backend::Hf(h) => h.token_id(text),
        }
    }

    /// Token attributes as llama.cpp computes them (GGUF only).
    pub fn token_attr(&self, id: u32) -> Option<TokenAttr> {
        match &self.backend {
            Backend::Gguf(v) => v.attr(id),
            Backend::Hf(_) => None,
        }
    }

    pub fn bos(&self) -> Option<u32> {
        match &self.backend {
            Backend::Gguf(v) => v.special.bos,
            Backend::Hf(h) => h.bos,
        }
    }

    pub fn eos(&self) -> Option<u32> {
        match &self.backend {
            Backend::Gguf(v) => v.special.eos,
            Backend::Hf(h) => h.eos,
        }
    }

    /// End of turn (`<end_of_turn>`, `<|im_end|>`, `<|eot_id|>`), from the metadata or found by
    /// its text.
    pub fn eot(&self) -> Option<u32> {
        match &self.backend {
            Backend::Gguf(v) => v.special.eot,
            Backend::Hf(_) => None,
        }
    }

    pub fn pad(&self) -> Option<u32> {
        match &self.backend {
            Backend::Gguf(v) => v.special.pad,
            Backend::Hf(_) => None,
        }
    }

    pub fn unk(&self) -> Option<u32> {
        match &self.backend {
            Backend::Gguf(v) => v.special.unk,
            Backend::Hf(_) => None,
        }
    }

    /// Whether `id` ends generation: EOS, EOT, EOM, and every token whose text llama.cpp lists
    /// as an end marker (`<end_of_turn>`, `<|im_end|>`, `<|endoftext|>`, `<|eot_id|>`, `</s>`,
    /// ...), plus the fill-in-the-middle pad/repo/separator tokens.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog_ids().binary_search(&id).is_ok()
    }

    /// The end-of-generation set, sorted.
    pub fn eog_ids(&self) -> &[u32] {
        match &self.backend {
            Backend::Gguf(v) => &v.eog,
            Backend::Hf(h) => &h.eog,
        }
    }

    /// Whether `encode(.., add_special = true, ..)` starts with BOS.
    pub fn add_bos(&self) -> bool {
        match &self.backend {
            Backend::Gguf(v) => v.add_bos,
            Backend::Hf(h) => h.add_bos,
        }
    }

    /// Whether `encode(.., add_special = true, ..)` ends with EOS.
    pub fn add_eos(&self) -> bool {
        match &self.backend {
            Backend::Gguf(v) => v.add_eos,
            Backend::Hf(h) => h.add_eos,
        }
    }

    /// The Jinja chat template (`tokenizer.chat_template`), if the file has one.
    pub fn chat_template(&self) -> Option<&str> {
        match &self.backend {
            Backend::Gguf(v) => v.chat_template.as_deref(),
            Backend::Hf(h) => h.chat_template.as_deref(),
        }
    }

    /// A decoder for streaming generated ids as text.
    pub fn stream_decoder(&self) -> StreamDecoder<'_> {
        StreamDecoder::new(self)
    }
}
