use std::path::PathBuf;

/// A GGUF file that could not be read, with the file named.
#[derive(Debug, thiserror::Error)]
#[error("{}: {kind}", path.display())]
pub struct GgufError {
    pub path: PathBuf,
    pub kind: GgufErrorKind,
}

/// What was wrong, with the offending key or tensor and its byte offset.
#[derive(Debug, thiserror::Error)]
pub enum GgufErrorKind {
    #[error("cannot open: {0}")]
    Io(#[from] std::io::Error),
    #[error("is a directory, not a model file")]
    IsDirectory,
    #[error("file is empty")]
    Empty,
    #[error("not a GGUF or .syn file (magic {found:02x?} at offset 0, expected \"GGUF\" or \"SYNAPTIX\")")]
    BadMagic { found: Vec<u8> },
    #[error("unsupported GGUF version {0} (supported: 2, 3)")]
    UnsupportedVersion(u32),
    #[error(
        "truncated at offset {offset}: {what} needs {needed} bytes, file has {available} left"
    )]
    Truncated {
        offset: u64,
        what: String,
        needed: u64,
        available: u64,
    },
    #[error("implausible {what} {count} at offset {offset} (the file cannot hold that many)")]
    ImplausibleCount {
        what: String,
        count: u64,
        offset: u64,
    },
    #[error("metadata key '{key}' at offset {offset}: unknown value type {type_id}")]
    UnknownValueType {
        key: String,
        type_id: u32,
        offset: u64,
    },
    #[error("metadata key '{key}' at offset {offset}: arrays nested deeper than {max_depth}")]
    NestingTooDeep {
        key: String,
        offset: u64,
        max_depth: usize,
    },
    #[error("string at offset {offset} is not valid UTF-8 ({what})")]
    BadUtf8 { offset: u64, what: String },
    #[error("duplicate metadata key '{key}' at offset {offset}")]
    DuplicateKey { key: String, offset: u64 },
    #[error("duplicate tensor name '{name}' at offset {offset}")]
    DuplicateTensor { name: String, offset: u64 },
    #[error("general.alignment = {0} is not a power of two between 1 and 65536")]
    BadAlignment(u64),
    #[error("tensor '{name}' at offset {offset}: rank {rank} exceeds the maximum of 4")]
    BadRank {
        name: String,
        rank: u32,
        offset: u64,
    },
    #[error("tensor '{name}' at offset {offset}: unknown tensor type id {type_id}")]
    UnknownTensorType {
        name: String,
        type_id: u32,
        offset: u64,
    },
    #[error("tensor '{name}' at offset {offset}: dimensions {dims:?} {problem}")]
    BadDims {
        name: String,
        dims: Vec<u64>,
        offset: u64,
        problem: String,
    },
    #[error(
        "tensor '{name}': data offset {data_offset} is not a multiple of the alignment {alignment}"
    )]
    Misaligned {
        name: String,
        data_offset: u64,
        alignment: u64,
    },
    #[error("tensor '{name}': data [{start}, {end}) lies outside the file ({file_len} bytes)")]
    DataOutOfBounds {
        name: String,
        start: u64,
        end: u64,
        file_len: u64,
    },
    #[error("tensors '{first}' and '{second}' overlap in the data section")]
    Overlap { first: String, second: String },
    #[error("metadata key '{key}': {problem}")]
    BadMetadata { key: String, problem: String },
    #[error("no tensor named '{0}'")]
    MissingTensor(String),
    #[error(".syn header: {0}")]
    SynHeader(String),
    #[error(".syn directory: {0}")]
    SynDirectory(String),
    #[error("{what} is damaged: checksum {found:016x}, the bundle says {expected:016x}")]
    SynChecksum {
        what: String,
        expected: u64,
        found: u64,
    },
}

impl GgufError {
    pub fn new(path: impl Into<PathBuf>, kind: GgufErrorKind) -> Self {
        GgufError {
            path: path.into(),
            kind,
        }
    }
}
