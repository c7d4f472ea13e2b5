//! Reader for CTranslate2's `model.bin` (binary versions 5 and 6).
//!
//! The whole file is little-endian and unaligned (nothing is padded), so values are copied
//! and converted, never cast in place:
//!
//! ```text
//! u32     binary_version               5 or 6 (the only ones accepted here)
//! string  spec name                    e.g. "WhisperSpec"
//! u32     spec revision
//! u32     variable count
//! per variable, in file order:
//!   string  name                       e.g. "encoder/conv1/weight"
//!   u8      rank                       0 = scalar (one element)
//!   u32     dims[rank]                 outermost first (row-major)
//!   u8      dtype id                   0 f32, 1 i8, 2 i16, 3 i32, 4 f16, 5 bf16
//!   u32     byte count                 must equal product(dims) × dtype size
//!   u8      data[byte count]
//! u32     alias count
//! per alias:
//!   string  alias name                 e.g. "decoder/projection/weight"
//!   string  target variable name       e.g. "decoder/embeddings/weight"
//!
//! string = u16 length INCLUDING a trailing NUL, then that many bytes (UTF-8, NUL last)
//! ```
//!
//! Every length, count and offset is checked against the file: a truncated or hostile file
//! gives a [`Ct2Error`] naming the file and the offending byte offset, never a panic or an
//! out-of-bounds read. Duplicate names, aliases that shadow a variable and aliases to a
//! missing variable are rejected at open. Bytes after the alias table are tolerated (see
//! [`Ct2File::end_offset`]). The layout was confirmed on a real Whisper base file
//! (`WhisperSpec` revision 3, binary version 6); version 5 shares it.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

/// Element type of a stored variable (CTranslate2's `DataType` ids 0..=5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ct2DType {
    F32,
    I8,
    I16,
    I32,
    F16,
    BF16,
}

impl Ct2DType {
    /// The dtype for a file's id byte, `None` for an unknown id.
    pub fn from_id(id: u8) -> Option<Ct2DType> {
        Some(match id {
            0 => Ct2DType::F32,
            1 => Ct2DType::I8,
            2 => Ct2DType::I16,
            3 => Ct2DType::I32,
            4 => Ct2DType::F16,
            5 => Ct2DType::BF16,
            _ => return None,
        })
    }

    pub fn id(self) -> u8 {
        match self {
            Ct2DType::F32 => 0,
            Ct2DType::I8 => 1,
            Ct2DType::I16 => 2,
            Ct2DType::I32 => 3,
            Ct2DType::F16 => 4,
            Ct2DType::BF16 => 5,
        }
    }

    pub fn size_bytes(self) -> usize {
        match self {
            Ct2DType::I8 => 1,
            Ct2DType::I16 | Ct2DType::F16 | Ct2DType::BF16 => 2,
            Ct2DType::F32 | Ct2DType::I32 => 4,
        }
    }

    /// CTranslate2's own name for the type ("float32", "int8", ...).
    pub fn name(self) -> &'static str {
        match self {
            Ct2DType::F32 => "float32",
            Ct2DType::I8 => "int8",
            Ct2DType::I16 => "int16",
            Ct2DType::I32 => "int32",
            Ct2DType::F16 => "float16",
            Ct2DType::BF16 => "bfloat16",
        }
    }

    pub fn is_int(self) -> bool {
        matches!(self, Ct2DType::I8 | Ct2DType::I16 | Ct2DType::I32)
    }

    pub fn is_float(self) -> bool {
        !self.is_int()
    }
}

impl std::fmt::Display for Ct2DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One entry of the variable table. Its bytes are read with [`Ct2File::bytes`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ct2Variable {
    pub name: String,
    /// Outermost first; empty for a scalar.
    pub shape: Vec<usize>,
    pub dtype: Ct2DType,
    /// Absolute offset of the data in the file (checked to lie inside it at open).
    offset: usize,
    /// Data length in bytes (== elements × dtype size, checked at open).
    len: usize,
}

impl Ct2Variable {
    /// Number of elements (1 for a scalar).
    pub fn elements(&self) -> usize {
        // Cannot overflow: checked at open.
        self.shape.iter().product()
    }

    pub fn byte_len(&self) -> usize {
        self.len
    }

    /// Absolute byte offset of the data in the file.
    pub fn file_offset(&self) -> usize {
        self.offset
    }

    pub fn is_scalar(&self) -> bool {
        self.shape.is_empty()
    }
}

/// A `model.bin` that could not be read or a variable that is missing or ill-shaped; every
/// message is one line and names the file.
#[derive(Debug, thiserror::Error)]
pub enum Ct2Error {
    #[error("{}: cannot open: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: is a directory, not a model file", path.display())]
    IsDirectory { path: PathBuf },
    #[error("{}: file is empty", path.display())]
    Empty { path: PathBuf },
    #[error("{}: unsupported CTranslate2 binary version {version} (supported: 5, 6)", path.display())]
    UnsupportedVersion { path: PathBuf, version: u32 },
    #[error(
        "{}: truncated at byte {offset} reading {what} (needs {needed} bytes, {available} left)",
        path.display()
    )]
    Truncated {
        path: PathBuf,
        offset: u64,
        what: String,
        needed: u64,
        available: u64,
    },
    #[error("{}: bad string at byte {offset} ({what}): {problem}", path.display())]
    BadString {
        path: PathBuf,
        offset: u64,
        what: String,
        problem: String,
    },
    #[error("{}: variable '{name}' at byte {offset}: unknown dtype id {dtype_id}", path.display())]
    UnknownDType {
        path: PathBuf,
        name: String,
        dtype_id: u8,
        offset: u64,
    },
    #[error("{}: variable '{name}' at byte {offset}: dimensions {dims:?} {problem}", path.display())]
    BadShape {
        path: PathBuf,
        name: String,
        dims: Vec<u32>,
        offset: u64,
        problem: String,
    },
    #[error(
        "{}: variable '{name}' at byte {offset}: byte count {found} disagrees with shape {shape:?} of {dtype} ({expected} bytes)",
        path.display()
    )]
    ByteCountMismatch {
        path: PathBuf,
        name: String,
        offset: u64,
        shape: Vec<usize>,
        dtype: Ct2DType,
        expected: u64,
        found: u32,
    },
    #[error("{}: duplicate name '{name}' at byte {offset}", path.display())]
    DuplicateName {
        path: PathBuf,
        name: String,
        offset: u64,
    },
    #[error("{}: alias '{alias}' points to '{target}', which is not a variable in the file", path.display())]
    DanglingAlias {
        path: PathBuf,
        alias: String,
        target: String,
    },
    #[error("{}: no variable named '{name}'", path.display())]
    MissingVariable { path: PathBuf, name: String },
    #[error(
        "{}: variable '{name}' has shape {actual:?} ({actual_elements} elements), expected [{rows}, {cols}] ({} elements)",
        path.display(),
        .rows.checked_mul(*.cols).map_or_else(|| "overflowing".to_string(), |n| n.to_string())
    )]
    ShapeMismatch {
        path: PathBuf,
        name: String,
        rows: usize,
        cols: usize,
        actual: Vec<usize>,
        actual_elements: usize,
    },
    #[error(
        "{}: variable '{name}' is {dtype} of shape {shape:?}, expected {expected}",
        path.display()
    )]
    WrongType {
        path: PathBuf,
        name: String,
        dtype: Ct2DType,
        shape: Vec<usize>,
        expected: String,
    },
}

impl Ct2Error {
    /// The file the error is about.
    pub fn path(&self) -> &Path {
        match self {
            Ct2Error::Io { path, .. }
            | Ct2Error::IsDirectory { path }
            | Ct2Error::Empty { path }
            | Ct2Error::UnsupportedVersion { path, .. }
            | Ct2Error::Truncated { path, .. }
            | Ct2Error::BadString { path, .. }
            | Ct2Error::UnknownDType { path, .. }
            | Ct2Error::BadShape { path, .. }
            | Ct2Error::ByteCountMismatch { path, .. }
            | Ct2Error::DuplicateName { path, .. }
            | Ct2Error::DanglingAlias { path, .. }
            | Ct2Error::MissingVariable { path, .. }
            | Ct2Error::ShapeMismatch { path, .. }
            | Ct2Error::WrongType { path, .. } => path,
        }
    }
}

/// A validated, memory-mapped CTranslate2 `model.bin`.
pub struct Ct2File {
    path: PathBuf,
    map: Mmap,
    binary_version: u32,
    spec: String,
    revision: u32,
    variables: Vec<Ct2Variable>,
    aliases: Vec<(String, String)>,
    /// Variable and alias names → index into `variables`.
    index: HashMap<String, usize>,
    end_offset: usize,
}

impl std::fmt::Debug for Ct2File {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ct2File")
            .field("path", &self.path)
            .field("binary_version", &self.binary_version)
            .field("spec", &self.spec)
            .field("revision", &self.revision)
            .field("variables", &self.variables.len())
            .field("aliases", &self.aliases.len())
            .finish()
    }
}

impl Ct2File {
    /// Opens, maps and validates a `model.bin`.
    pub fn open(path: &Path) -> Result<Ct2File, Ct2Error> {
        let io = |source| Ct2Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(io)?;
        if meta.is_dir() {
            return Err(Ct2Error::IsDirectory {
                path: path.to_path_buf(),
            });
        }
        if meta.len() == 0 {
            return Err(Ct2Error::Empty {
                path: path.to_path_buf(),
            });
        }
        let file = File::open(path).map_err(io)?;
        // SAFETY: the map is read-only; a model file modified while mapped is a user error
        // that at worst yields wrong values (the GGUF reader maps models the same way).
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        let header = parse(&map[..]).map_err(|k| k.into_error(path))?;
        Ok(Ct2File {
            path: path.to_path_buf(),
            map,
            binary_version: header.binary_version,
            spec: header.spec,
            revision: header.revision,
            variables: header.variables,
            aliases: header.aliases,
            index: header.index,
            end_offset: header.end_offset,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn spec(&self) -> &str {
        &self.spec
    }

    pub fn revision(&self) -> u32 {
        self.revision
    }

    pub fn binary_version(&self) -> u32 {
        self.binary_version
    }

    pub fn file_len(&self) -> u64 {
        self.map.len() as u64
    }

    /// Offset just past the alias table; equal to [`Ct2File::file_len`] for a file with no
    /// trailing bytes (trailing bytes are tolerated).
    pub fn end_offset(&self) -> u64 {
        self.end_offset as u64
    }

    /// The variable table in file order (aliases not included).
    pub fn variables(&self) -> &[Ct2Variable] {
        &self.variables
    }

    /// `(alias, target variable)` pairs in file order.
    pub fn aliases(&self) -> &[(String, String)] {
        &self.aliases
    }

    /// A variable by name or alias; through an alias, the target variable (with its own name).
    pub fn get(&self, name: &str) -> Option<&Ct2Variable> {
        self.index.get(name).map(|&i| &self.variables[i])
    }

    /// Like [`Ct2File::get`], with a [`Ct2Error::MissingVariable`] when absent.
    pub fn require(&self, name: &str) -> Result<&Ct2Variable, Ct2Error> {
        self.get(name).ok_or_else(|| Ct2Error::MissingVariable {
            path: self.path.clone(),
            name: name.to_string(),
        })
    }

    /// The variable's raw little-endian bytes, borrowed from the mapping.
    ///
    /// # Panics
    /// If `v` does not come from this file and lies outside it.
    pub fn bytes(&self, v: &Ct2Variable) -> &[u8] {
        &self.map[v.offset..v.offset + v.len]
    }

    /// All elements converted to f32 (float types exactly; ints by value, i32 rounding
    /// beyond 2^24).
    pub fn f32_values(&self, name: &str) -> Result<Vec<f32>, Ct2Error> {
        let v = self.require(name)?;
        Ok(to_f32(v.dtype, self.bytes(v)))
    }

    /// All elements as f32 after checking that there are exactly `rows × cols` of them
    /// (a `[512, 80, 3]` conv weight reads as a 512 × 240 matrix).
    pub fn f32_matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Vec<f32>, Ct2Error> {
        let v = self.require(name)?;
        let expected = rows.checked_mul(cols);
        if expected != Some(v.elements()) {
            return Err(Ct2Error::ShapeMismatch {
                path: self.path.clone(),
                name: name.to_string(),
                rows,
                cols,
                actual: v.shape.clone(),
                actual_elements: v.elements(),
            });
        }
        Ok(to_f32(v.dtype, self.bytes(v)))
    }

    /// A one-element integer variable (CTranslate2 stores config such as `num_heads` this
    /// way): `Ok(None)` when absent, an error when not exactly one element of an int dtype.
    pub fn scalar_i64(&self, name: &str) -> Result<Option<i64>, Ct2Error> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        if !v.dtype.is_int() || v.elements() != 1 {
            return Err(Ct2Error::WrongType {
                path: self.path.clone(),
                name: name.to_string(),
                dtype: v.dtype,
                shape: v.shape.clone(),
                expected: "one element of an int dtype".into(),
            });
        }
        let b = self.bytes(v);
        Ok(Some(match v.dtype {
            Ct2DType::I8 => b[0] as i8 as i64,
            Ct2DType::I16 => i16::from_le_bytes([b[0], b[1]]) as i64,
            _ => i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64,
        }))
    }
}

fn to_f32(dtype: Ct2DType, bytes: &[u8]) -> Vec<f32> {
    match dtype {
        Ct2DType::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        Ct2DType::F16 => bytes
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Ct2DType::BF16 => bytes
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Ct2DType::I8 => bytes.iter().map(|&b| b as i8 as f32).collect(),
        Ct2DType::I16 => bytes
            .chunks_exact(2)
            .map(|c| i16::from_le_bytes([c[0], c[1]]) as f32)
            .collect(),
        Ct2DType::I32 => bytes
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f32)
            .collect(),
    }
}

/// A parse failure before the path is attached.
enum Fail {
    UnsupportedVersion(u32),
    Truncated {
        offset: u64,
        what: String,
        needed: u64,
        available: u64,
    },
    BadString {
        offset: u64,
        what: String,
        problem: String,
    },
    UnknownDType {
        name: String,
        dtype_id: u8,
        offset: u64,
    },
    BadShape {
        name: String,
        dims: Vec<u32>,
        offset: u64,
        problem: String,
    },
    ByteCountMismatch {
        name: String,
        offset: u64,
        shape: Vec<usize>,
        dtype: Ct2DType,
        expected: u64,
        found: u32,
    },
    DuplicateName {
        name: String,
        offset: u64,
    },
    DanglingAlias {
        alias: String,
        target: String,
    },
}

impl Fail {
    fn into_error(self, path: &Path) -> Ct2Error {
        let path = path.to_path_buf();
        match self {
            Fail::UnsupportedVersion(version) => Ct2Error::UnsupportedVersion { path, version },
            Fail::Truncated {
                offset,
                what,
                needed,
                available,
            } => Ct2Error::Truncated {
                path,
                offset,
                what,
                needed,
                available,
            },
            Fail::BadString {
                offset,
                what,
                problem,
            } => Ct2Error::BadString {
                path,
                offset,
                what,
                problem,
            },
            Fail::UnknownDType {
                name,
                dtype_id,
                offset,
            } => Ct2Error::UnknownDType {
                path,
                name,
                dtype_id,
                offset,
            },
            Fail::BadShape {
                name,
                dims,
                offset,
                problem,
            } => Ct2Error::BadShape {
                path,
                name,
                dims,
                offset,
                problem,
            },
            Fail::ByteCountMismatch {
                name,
                offset,
                shape,
                dtype,
                expected,
                found,
            } => Ct2Error::ByteCountMismatch {
                path,
                name,
                offset,
                shape,
                dtype,
                expected,
                found,
            },
            Fail::DuplicateName { name, offset } => Ct2Error::DuplicateName { path, name, offset },
            Fail::DanglingAlias { alias, target } => Ct2Error::DanglingAlias {
                path,
                alias,
                target,
            },
        }
    }
}

struct Header {
    binary_version: u32,
    spec: String,
    revision: u32,
    variables: Vec<Ct2Variable>,
    aliases: Vec<(String, String)>,
    index: HashMap<String, usize>,
    end_offset: usize,
}

/// A bounds-checked little-endian reader that knows its offset.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8], Fail> {
        if n > self.remaining() {
            return Err(Fail::Truncated {
                offset: self.pos as u64,
                what: what(),
                needed: n as u64,
                available: self.remaining() as u64,
            });
        }
        let start = self.pos;
        self.pos += n;
        Ok(&self.buf[start..self.pos])
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], Fail> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    fn u8(&mut self, what: &dyn Fn() -> String) -> Result<u8, Fail> {
        self.array::<1>(what).map(|b| b[0])
    }

    fn u16(&mut self, what: &dyn Fn() -> String) -> Result<u16, Fail> {
        self.array(what).map(u16::from_le_bytes)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, Fail> {
        self.array(what).map(u32::from_le_bytes)
    }

    /// u16 length (including the trailing NUL), then the bytes.
    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, Fail> {
        let offset = self.pos as u64;
        let len = self.u16(what)? as usize;
        let bytes = self.take(len, what)?;
        let bad = |problem: &str| Fail::BadString {
            offset,
            what: what(),
            problem: problem.to_string(),
        };
        let Some((&last, body)) = bytes.split_last() else {
            return Err(bad("length 0 leaves no room for the trailing NUL"));
        };
        if last != 0 {
            return Err(bad(&format!("last byte is 0x{last:02x}, not NUL")));
        }
        if body.contains(&0) {
            return Err(bad("NUL before the end"));
        }
        String::from_utf8(body.to_vec()).map_err(|_| bad("not valid UTF-8"))
    }
}

fn parse(buf: &[u8]) -> Result<Header, Fail> {
    let mut c = Cursor { buf, pos: 0 };
    let binary_version = c.u32(&|| "the binary version".into())?;
    if binary_version != 5 && binary_version != 6 {
        return Err(Fail::UnsupportedVersion(binary_version));
    }
    let spec = c.string(&|| "the spec name".into())?;
    let revision = c.u32(&|| "the spec revision".into())?;
    let n_vars = c.u32(&|| "the variable count".into())? as usize;

    // A variable takes at least 2 (name length) + 1 (NUL) + 1 (rank) + 1 (dtype) + 4 (byte
    // count) bytes: never reserve more than the rest of the file could hold.
    let mut variables: Vec<Ct2Variable> = Vec::with_capacity(n_vars.min(c.remaining() / 9));
    let mut index: HashMap<String, usize> = HashMap::with_capacity(variables.capacity());
    for i in 0..n_vars {
        let entry_offset = c.pos as u64;
        let name = c.string(&|| format!("the name of variable #{i}"))?;
        let what = |part: &str| {
            let name = name.clone();
            let part = part.to_string();
            move || format!("variable '{name}' {part}")
        };
        let rank = c.u8(&what("rank"))?;
        let mut dims = Vec::with_capacity(rank as usize);
        for _ in 0..rank {
            dims.push(c.u32(&what("dimensions"))?);
        }
        let dtype_offset = c.pos as u64;
        let dtype_id = c.u8(&what("dtype"))?;
        let dtype = Ct2DType::from_id(dtype_id).ok_or_else(|| Fail::UnknownDType {
            name: name.clone(),
            dtype_id,
            offset: dtype_offset,
        })?;
        let byte_count = c.u32(&what("byte count"))?;
        let shape: Vec<usize> = dims.iter().map(|&d| d as usize).collect();
        let expected = shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .and_then(|n| n.checked_mul(dtype.size_bytes()))
            .ok_or_else(|| Fail::BadShape {
                name: name.clone(),
                dims: dims.clone(),
                offset: entry_offset,
                problem: format!("overflow the byte size of {dtype} data"),
            })?;
        if expected as u64 != byte_count as u64 {
            return Err(Fail::ByteCountMismatch {
                name,
                offset: entry_offset,
                shape,
                dtype,
                expected: expected as u64,
                found: byte_count,
            });
        }
        let offset = c.pos;
        c.take(byte_count as usize, &what("data"))?;
        if index.insert(name.clone(), variables.len()).is_some() {
            return Err(Fail::DuplicateName {
                name,
                offset: entry_offset,
            });
        }
        variables.push(Ct2Variable {
            name,
            shape,
            dtype,
            offset,
            len: byte_count as usize,
        });
    }

    let n_aliases = c.u32(&|| "the alias count".into())? as usize;
    // An alias takes at least two strings of 3 bytes.
    let mut aliases = Vec::with_capacity(n_aliases.min(c.remaining() / 6));
    for i in 0..n_aliases {
        let entry_offset = c.pos as u64;
        let alias = c.string(&|| format!("the name of alias #{i}"))?;
        let target = c.string(&|| format!("the target of alias '{alias}'"))?;
        let Some(&target_index) = index.get(&target).filter(|&&t| variables[t].name == target)
        else {
            return Err(Fail::DanglingAlias { alias, target });
        };
        if index.insert(alias.clone(), target_index).is_some() {
            return Err(Fail::DuplicateName {
                name: alias,
                offset: entry_offset,
            });
        }
        aliases.push((alias, target));
    }

    Ok(Header {
        binary_version,
        spec,
        revision,
        variables,
        aliases,
        index,
        end_offset: c.pos,
    })
}
