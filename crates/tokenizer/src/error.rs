use std::path::PathBuf;

use synaptix_bundle::GgufError;

/// Everything that can go wrong loading a tokenizer or encoding with it.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A metadata key has the wrong type (raised by the GGUF reader).
    #[error(transparent)]
    Gguf(#[from] GgufError),

    #[error("tokenizer metadata key `{0}` is missing")]
    MissingKey(&'static str),

    #[error("tokenizer metadata key `{key}` is invalid: {problem}")]
    InvalidKey { key: &'static str, problem: String },

    /// `tokenizer.ggml.model` names a tokenizer this crate does not implement.
    #[error("unsupported tokenizer model `{0}` (supported: `llama` (SentencePiece), `gpt2` (byte-level BPE))")]
    UnsupportedModel(String),

    /// `tokenizer.ggml.pre` names a pre-tokenizer this crate does not implement.
    #[error("unsupported pre-tokenizer `{0}` for a `gpt2` vocabulary")]
    UnsupportedPreTokenizer(String),

    /// A special token the vocabulary asks for (e.g. BOS with `add_bos_token`) is not defined.
    #[error("the vocabulary asks to add a {0} token but defines none")]
    MissingSpecialToken(&'static str),

    /// SentencePiece byte fallback found no token for a byte (neither `<0xXX>` nor the byte).
    #[error("no byte-fallback token for byte 0x{0:02X}")]
    NoByteToken(u8),

    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// Loading or running a Hugging Face `tokenizer.json`.
    #[error("tokenizer.json {path}: {message}")]
    TokenizerJson { path: PathBuf, message: String },
}

pub type Result<T, E = TokenizerError> = std::result::Result<T, E>;
