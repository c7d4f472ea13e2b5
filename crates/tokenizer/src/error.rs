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

    /// The espeak-ng shared library could not be opened (`lib` is what was asked of dlopen).
    #[error("espeak-ng library not found ({lib}: {reason}): install the Debian/Ubuntu package libespeak-ng1 or set SYNAPTIX_ESPEAK_LIB")]
    EspeakNotFound { lib: String, reason: String },

    /// The library opened but lacks a function every espeak-ng since 1.49 exports.
    #[error("{lib} is not a usable espeak-ng library: it has no `{symbol}`")]
    EspeakSymbol { lib: String, symbol: &'static str },

    /// `espeak_ng_Initialize` failed (typically: no espeak-ng-data where the library looks).
    #[error("espeak-ng ({lib}) failed to initialise: {message} (install the Debian/Ubuntu package espeak-ng-data or set SYNAPTIX_ESPEAK_DATA)")]
    EspeakInit { lib: String, message: String },

    /// `espeak_SetVoiceByName` refused the name.
    #[error("espeak-ng has no voice `{0}`")]
    EspeakVoice(String),

    /// espeak-ng returned something the phonemizer cannot use (a null result, a text pointer
    /// outside the text); the message says which.
    #[error("espeak-ng failed: {0}")]
    Espeak(String),

    /// espeak-ng reads C strings: text with a NUL character cannot be passed (Piper refuses it too).
    #[error("the text contains a NUL character, which espeak-ng cannot read")]
    TextHasNul,

    /// A Piper voice config whose `phoneme_type` is not `espeak`.
    #[error("Piper phoneme_type `{0}` is not supported (only `espeak` is)")]
    UnsupportedPhonemeType(String),

    /// A Piper voice config (`*.onnx.json`) that is missing a field or has one of the wrong shape.
    #[error("Piper voice config {path}: {problem}")]
    PiperConfig { path: String, problem: String },
}

pub type Result<T, E = TokenizerError> = std::result::Result<T, E>;
