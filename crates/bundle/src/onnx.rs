//! Reader for ONNX `ModelProto` files (as Piper's VITS voices ship them).
//!
//! The file is memory-mapped and its protobuf wire format parsed by hand: varints (at most ten
//! bytes), fixed 64- and 32-bit values and length-delimited fields. Every length is checked
//! against the bytes left in the enclosing message, message nesting is capped at [`MAX_DEPTH`],
//! unknown fields are skipped, and a known field with the wrong wire type, a string that is not
//! UTF-8, a group (wire types 3 and 4) or a field number 0 is an error. Nothing is allocated
//! beyond what the bytes read can justify, so a hostile file is an [`OnnxError`] naming the
//! file and the byte offset, never a panic.
//!
//! What is kept: the model's IR version, opset imports, producer and graph; a graph's name,
//! inputs and outputs (element type and shape), initializers and nodes; a node's attributes of
//! every kind VITS graphs use, subgraphs (`If`/`Loop` bodies) parsed recursively. A tensor's
//! `raw_data` stays in the map (a byte range, see [`OnnxFile::raw_data`]); the typed repeated
//! fields (`float_data`, `int32_data`, `int64_data`, `double_data`, `uint64_data`) are decoded.
//! Tensors stored outside the file (`data_location = EXTERNAL`) are refused.

use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

/// The deepest nesting of messages accepted (the model is depth 0).
pub const MAX_DEPTH: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum OnnxError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: byte {offset}: truncated: {what}")]
    Truncated {
        path: PathBuf,
        offset: usize,
        what: &'static str,
    },
    #[error("{path}: byte {offset}: malformed: {what}")]
    Malformed {
        path: PathBuf,
        offset: usize,
        what: String,
    },
    #[error("{path}: byte {offset}: field {field} of {message} has wire type {wire}")]
    WireType {
        path: PathBuf,
        offset: usize,
        message: &'static str,
        field: u32,
        wire: u8,
    },
    #[error("{path}: byte {offset}: string is not UTF-8")]
    Utf8 { path: PathBuf, offset: usize },
    #[error("{path}: byte {offset}: messages nested deeper than {MAX_DEPTH}")]
    TooDeep { path: PathBuf, offset: usize },
    #[error(
        "{path}: byte {offset}: tensor '{name}' keeps its data in an external file (not supported)"
    )]
    ExternalData {
        path: PathBuf,
        offset: usize,
        name: String,
    },
    #[error("{path}: no initializer or Constant output named '{name}'")]
    NotFound { path: PathBuf, name: String },
    #[error("{path}: tensor '{name}' has data type {dtype}, not FLOAT, FLOAT16 or DOUBLE")]
    NotFloat {
        path: PathBuf,
        name: String,
        dtype: String,
    },
}

/// A parse failure before the path is attached.
#[derive(Debug)]
enum Fault {
    Truncated(usize, &'static str),
    Malformed(usize, String),
    WireType(usize, &'static str, u32, u8),
    Utf8(usize),
    TooDeep(usize),
    External(usize, String),
}

impl Fault {
    fn with_path(self, path: &Path) -> OnnxError {
        let path = path.to_path_buf();
        match self {
            Fault::Truncated(offset, what) => OnnxError::Truncated { path, offset, what },
            Fault::Malformed(offset, what) => OnnxError::Malformed { path, offset, what },
            Fault::WireType(offset, message, field, wire) => OnnxError::WireType {
                path,
                offset,
                message,
                field,
                wire,
            },
            Fault::Utf8(offset) => OnnxError::Utf8 { path, offset },
            Fault::TooDeep(offset) => OnnxError::TooDeep { path, offset },
            Fault::External(offset, name) => OnnxError::ExternalData { path, offset, name },
        }
    }
}

type R<T> = Result<T, Fault>;

/// ONNX `TensorProto.DataType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct DataType(pub i32);

impl DataType {
    pub const UNDEFINED: DataType = DataType(0);
    pub const FLOAT: DataType = DataType(1);
    pub const UINT8: DataType = DataType(2);
    pub const INT8: DataType = DataType(3);
    pub const UINT16: DataType = DataType(4);
    pub const INT16: DataType = DataType(5);
    pub const INT32: DataType = DataType(6);
    pub const INT64: DataType = DataType(7);
    pub const STRING: DataType = DataType(8);
    pub const BOOL: DataType = DataType(9);
    pub const FLOAT16: DataType = DataType(10);
    pub const DOUBLE: DataType = DataType(11);
    pub const UINT32: DataType = DataType(12);
    pub const UINT64: DataType = DataType(13);
    pub const COMPLEX64: DataType = DataType(14);
    pub const COMPLEX128: DataType = DataType(15);
    pub const BFLOAT16: DataType = DataType(16);

    const NAMES: [&'static str; 24] = [
        "UNDEFINED",
        "FLOAT",
        "UINT8",
        "INT8",
        "UINT16",
        "INT16",
        "INT32",
        "INT64",
        "STRING",
        "BOOL",
        "FLOAT16",
        "DOUBLE",
        "UINT32",
        "UINT64",
        "COMPLEX64",
        "COMPLEX128",
        "BFLOAT16",
        "FLOAT8E4M3FN",
        "FLOAT8E4M3FNUZ",
        "FLOAT8E5M2",
        "FLOAT8E5M2FNUZ",
        "UINT4",
        "INT4",
        "FLOAT4E2M1",
    ];

    /// The name `onnx.TensorProto.DataType` gives it ("FLOAT", "INT64", ...), or "UNKNOWN".
    pub fn name(self) -> &'static str {
        usize::try_from(self.0)
            .ok()
            .and_then(|i| Self::NAMES.get(i))
            .copied()
            .unwrap_or("UNKNOWN")
    }

    /// Bytes of `n` elements in `raw_data`, where the type has a fixed size.
    pub fn raw_bytes(self, n: u64) -> Option<u64> {
        let size = match self.0 {
            2 | 3 | 9 | 17..=20 => 1,
            4 | 5 | 10 | 16 => 2,
            1 | 6 | 12 => 4,
            7 | 11 | 13 | 14 => 8,
            15 => 16,
            21..=23 => return Some(n.div_ceil(2)),
            _ => return None,
        };
        n.checked_mul(size)
    }
}

impl std::fmt::Display for DataType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One dimension of a value's shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dim {
    Value(i64),
    Param(String),
    Unknown,
}

impl std::fmt::Display for Dim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Dim::Value(v) => write!(f, "{v}"),
            Dim::Param(p) => f.write_str(p),
            Dim::Unknown => f.write_str("?"),
        }
    }
}

/// A graph input or output (`ValueInfoProto` with a tensor type).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ValueInfo {
    pub name: String,
    /// None where the value is not a tensor or its type is left out.
    pub elem_type: Option<DataType>,
    /// None where the shape is left out (unknown rank).
    pub shape: Option<Vec<Dim>>,
}

/// Where a tensor's values are.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum TensorData {
    /// No values (an empty tensor, or a type this reader does not decode, such as STRING).
    #[default]
    None,
    /// `raw_data`: a byte range of the mapped file (little-endian values).
    Raw(Range<usize>),
    Float(Vec<f32>),
    Int32(Vec<i32>),
    Int64(Vec<i64>),
    Double(Vec<f64>),
    Uint64(Vec<u64>),
}

/// A tensor (`TensorProto`): an initializer, or a tensor attribute.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Tensor {
    pub name: String,
    pub data_type: DataType,
    pub dims: Vec<i64>,
    pub data: TensorData,
    /// The byte offset of the tensor's message in the file.
    pub offset: usize,
}

impl Tensor {
    /// The number of elements (the product of `dims`; 1 for a scalar).
    pub fn elements(&self) -> u64 {
        self.dims.iter().map(|&d| d as u64).product()
    }

    /// Bytes of the values as stored (`raw_data`'s length, or the typed field's in memory).
    pub fn byte_len(&self) -> u64 {
        match &self.data {
            TensorData::None => 0,
            TensorData::Raw(r) => r.len() as u64,
            TensorData::Float(v) => 4 * v.len() as u64,
            TensorData::Int32(v) => 4 * v.len() as u64,
            TensorData::Int64(v) => 8 * v.len() as u64,
            TensorData::Double(v) => 8 * v.len() as u64,
            TensorData::Uint64(v) => 8 * v.len() as u64,
        }
    }
}

/// A node attribute's value.
#[derive(Debug, Clone, PartialEq)]
pub enum AttrValue {
    Float(f32),
    Int(i64),
    String(String),
    Tensor(Tensor),
    Graph(Box<Graph>),
    Floats(Vec<f32>),
    Ints(Vec<i64>),
    Strings(Vec<String>),
    Tensors(Vec<Tensor>),
    Graphs(Vec<Graph>),
    /// A kind this reader does not keep (sparse tensors, type protos), by its type number.
    Other(i32),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Attribute {
    pub name: String,
    pub value: AttrValue,
}

/// A node (`NodeProto`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Node {
    pub name: String,
    pub op_type: String,
    pub domain: String,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    pub attributes: Vec<Attribute>,
}

impl Node {
    pub fn attribute(&self, name: &str) -> Option<&AttrValue> {
        self.attributes
            .iter()
            .find(|a| a.name == name)
            .map(|a| &a.value)
    }
}

/// A graph (`GraphProto`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Graph {
    pub name: String,
    pub inputs: Vec<ValueInfo>,
    pub outputs: Vec<ValueInfo>,
    pub initializers: Vec<Tensor>,
    pub nodes: Vec<Node>,
}

/// An opset import: `domain` ("" is the default ONNX domain) at `version`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpsetImport {
    pub domain: String,
    pub version: i64,
}

/// An ONNX model file, memory-mapped and parsed.
pub struct OnnxFile {
    path: PathBuf,
    map: Mmap,
    pub ir_version: i64,
    pub opset_imports: Vec<OpsetImport>,
    pub producer_name: String,
    pub producer_version: String,
    pub graph: Graph,
    /// Initializer name -> index in `graph.initializers`.
    init_index: HashMap<String, usize>,
    /// Constant node output -> (node index, attribute index) of its `value` tensor.
    const_index: HashMap<String, (usize, usize)>,
}

impl std::fmt::Debug for OnnxFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnnxFile")
            .field("path", &self.path)
            .field("ir_version", &self.ir_version)
            .field("opset_imports", &self.opset_imports)
            .field("producer_name", &self.producer_name)
            .finish_non_exhaustive()
    }
}

impl OnnxFile {
    pub fn open(path: impl AsRef<Path>) -> Result<OnnxFile, OnnxError> {
        let path = path.as_ref();
        let io = |source| OnnxError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the map is read-only; the file is not expected to change while it is open.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        let mut c = Cur {
            buf: &map[..],
            pos: 0,
            end: map.len(),
        };
        let model = parse_model(&mut c).map_err(|f| f.with_path(path))?;
        let mut init_index = HashMap::new();
        for (i, t) in model.graph.initializers.iter().enumerate() {
            init_index.entry(t.name.clone()).or_insert(i);
        }
        let mut const_index = HashMap::new();
        for (n, node) in model.graph.nodes.iter().enumerate() {
            if node.op_type != "Constant" || !(node.domain.is_empty() || node.domain == "ai.onnx") {
                continue;
            }
            let Some(a) = node
                .attributes
                .iter()
                .position(|a| a.name == "value" && matches!(a.value, AttrValue::Tensor(_)))
            else {
                continue;
            };
            if let Some(out) = node.outputs.first() {
                const_index.entry(out.clone()).or_insert((n, a));
            }
        }
        Ok(OnnxFile {
            path: path.to_path_buf(),
            map,
            ir_version: model.ir_version,
            opset_imports: model.opsets,
            producer_name: model.producer_name,
            producer_version: model.producer_version,
            graph: model.graph,
            init_index,
            const_index,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn file_len(&self) -> usize {
        self.map.len()
    }

    /// The version of the default domain's opset ("" or "ai.onnx"), if imported.
    pub fn default_opset(&self) -> Option<i64> {
        self.opset_imports
            .iter()
            .find(|o| o.domain.is_empty() || o.domain == "ai.onnx")
            .map(|o| o.version)
    }

    pub fn initializer(&self, name: &str) -> Option<&Tensor> {
        self.init_index
            .get(name)
            .map(|&i| &self.graph.initializers[i])
    }

    /// The tensor of the top-level `Constant` node (attribute `value`) whose output is `name`.
    pub fn constant(&self, name: &str) -> Option<&Tensor> {
        let &(n, a) = self.const_index.get(name)?;
        match &self.graph.nodes[n].attributes[a].value {
            AttrValue::Tensor(t) => Some(t),
            _ => None,
        }
    }

    /// An initializer, else a Constant node's output, by name.
    pub fn tensor(&self, name: &str) -> Option<&Tensor> {
        self.initializer(name).or_else(|| self.constant(name))
    }

    /// A tensor's `raw_data`, borrowed from the map (None where its values are typed fields).
    pub fn raw_data(&self, t: &Tensor) -> Option<&[u8]> {
        match &t.data {
            TensorData::Raw(r) => self.map.get(r.clone()),
            _ => None,
        }
    }

    /// The values of the initializer or Constant output `name` as f32 (FLOAT, FLOAT16 or
    /// DOUBLE).
    pub fn f32_values(&self, name: &str) -> Result<Vec<f32>, OnnxError> {
        let t = self.tensor(name).ok_or_else(|| OnnxError::NotFound {
            path: self.path.clone(),
            name: name.to_string(),
        })?;
        self.tensor_f32(t)
    }

    /// A tensor's values as f32 (FLOAT, FLOAT16 or DOUBLE).
    pub fn tensor_f32(&self, t: &Tensor) -> Result<Vec<f32>, OnnxError> {
        let not_float = || OnnxError::NotFloat {
            path: self.path.clone(),
            name: t.name.clone(),
            dtype: t.data_type.name().to_string(),
        };
        let out = match (t.data_type, &t.data) {
            (_, TensorData::None) if t.elements() == 0 => Vec::new(),
            (DataType::FLOAT, TensorData::Float(v)) => v.clone(),
            (DataType::DOUBLE, TensorData::Double(v)) => v.iter().map(|&x| x as f32).collect(),
            (DataType::FLOAT16, TensorData::Int32(v)) => v
                .iter()
                .map(|&x| half::f16::from_bits(x as u16).to_f32())
                .collect(),
            (dt, TensorData::Raw(_)) => {
                let raw = self.raw_data(t).unwrap_or(&[]);
                match dt {
                    DataType::FLOAT => raw
                        .chunks_exact(4)
                        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                        .collect(),
                    DataType::FLOAT16 => raw
                        .chunks_exact(2)
                        .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                        .collect(),
                    DataType::DOUBLE => raw
                        .chunks_exact(8)
                        .map(|b| {
                            let mut a = [0u8; 8];
                            a.copy_from_slice(b);
                            f64::from_le_bytes(a) as f32
                        })
                        .collect(),
                    _ => return Err(not_float()),
                }
            }
            _ => return Err(not_float()),
        };
        Ok(out)
    }
}

/// A cursor over one message: `pos` and `end` are absolute offsets into the file.
struct Cur<'a> {
    buf: &'a [u8],
    pos: usize,
    end: usize,
}

impl<'a> Cur<'a> {
    fn done(&self) -> bool {
        self.pos >= self.end
    }

    fn byte(&mut self, what: &'static str) -> R<u8> {
        if self.pos >= self.end {
            return Err(Fault::Truncated(self.pos, what));
        }
        let b = self.buf[self.pos];
        self.pos += 1;
        Ok(b)
    }

    fn varint(&mut self) -> R<u64> {
        let start = self.pos;
        let mut v = 0u64;
        for i in 0..10 {
            let b = self.byte("varint")?;
            if i == 9 && b > 1 {
                return Err(Fault::Malformed(start, "varint longer than 64 bits".into()));
            }
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(Fault::Malformed(
            start,
            "varint longer than 10 bytes".into(),
        ))
    }

    fn bytes(&mut self, n: usize, what: &'static str) -> R<&'a [u8]> {
        if n > self.end - self.pos {
            return Err(Fault::Truncated(self.pos, what));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn fixed32(&mut self) -> R<u32> {
        let b = self.bytes(4, "fixed32")?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn fixed64(&mut self) -> R<u64> {
        let b = self.bytes(8, "fixed64")?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    /// A length prefix, checked against the bytes left; returns the range it covers.
    fn len_delim(&mut self) -> R<Range<usize>> {
        let at = self.pos;
        let n = self.varint()?;
        if n > (self.end - self.pos) as u64 {
            return Err(Fault::Truncated(at, "length-delimited field"));
        }
        let start = self.pos;
        self.pos += n as usize;
        Ok(start..self.pos)
    }

    /// The next field's (number, wire type, offset of its key), or None at the end.
    fn key(&mut self) -> R<Option<(u32, u8, usize)>> {
        if self.done() {
            return Ok(None);
        }
        let at = self.pos;
        let k = self.varint()?;
        let field = k >> 3;
        let wire = (k & 7) as u8;
        if field == 0 || field > u64::from(u32::MAX >> 3) {
            return Err(Fault::Malformed(at, format!("field number {field}")));
        }
        Ok(Some((field as u32, wire, at)))
    }

    fn skip(&mut self, wire: u8, at: usize) -> R<()> {
        match wire {
            0 => self.varint().map(drop),
            1 => self.fixed64().map(drop),
            2 => self.len_delim().map(drop),
            5 => self.fixed32().map(drop),
            w => Err(Fault::Malformed(
                at,
                format!("wire type {w} (groups are not supported)"),
            )),
        }
    }

    /// A sub-message's cursor at `depth` (checked against the cap).
    fn sub(&mut self, depth: usize, at: usize) -> R<Cur<'a>> {
        if depth > MAX_DEPTH {
            return Err(Fault::TooDeep(at));
        }
        let r = self.len_delim()?;
        Ok(Cur {
            buf: self.buf,
            pos: r.start,
            end: r.end,
        })
    }

    fn string(&mut self) -> R<String> {
        let r = self.len_delim()?;
        std::str::from_utf8(&self.buf[r.clone()])
            .map(str::to_owned)
            .map_err(|_| Fault::Utf8(r.start))
    }
}

/// Checks a known field's wire type.
fn want(message: &'static str, field: u32, wire: u8, expected: u8, at: usize) -> R<()> {
    if wire == expected {
        Ok(())
    } else {
        Err(Fault::WireType(at, message, field, wire))
    }
}

/// Repeated varint field, packed (wire 2) or not (wire 0), appended to `out`.
fn rep_varint(
    c: &mut Cur,
    msg: &'static str,
    f: u32,
    w: u8,
    at: usize,
    out: &mut Vec<u64>,
) -> R<()> {
    match w {
        0 => out.push(c.varint()?),
        2 => {
            let r = c.len_delim()?;
            let mut p = Cur {
                buf: c.buf,
                pos: r.start,
                end: r.end,
            };
            while !p.done() {
                out.push(p.varint()?);
            }
        }
        _ => return Err(Fault::WireType(at, msg, f, w)),
    }
    Ok(())
}

/// Repeated fixed-size field (4 or 8 bytes), packed or not, appended to `out` as raw bits.
fn rep_fixed(
    c: &mut Cur,
    msg: &'static str,
    f: u32,
    w: u8,
    at: usize,
    size: usize,
    out: &mut Vec<u64>,
) -> R<()> {
    let single = if size == 4 { 5 } else { 1 };
    if w == single {
        out.push(if size == 4 {
            u64::from(c.fixed32()?)
        } else {
            c.fixed64()?
        });
        return Ok(());
    }
    if w != 2 {
        return Err(Fault::WireType(at, msg, f, w));
    }
    let r = c.len_delim()?;
    if r.len() % size != 0 {
        return Err(Fault::Malformed(
            r.start,
            format!(
                "packed field of {} bytes, not a multiple of {size}",
                r.len()
            ),
        ));
    }
    out.reserve(r.len() / size);
    for b in c.buf[r].chunks_exact(size) {
        let mut a = [0u8; 8];
        a[..size].copy_from_slice(b);
        out.push(u64::from_le_bytes(a));
    }
    Ok(())
}

fn int32_of(v: u64, at: usize) -> R<i32> {
    // int32 values are sign-extended to 64 bits on the wire.
    i32::try_from(v as i64)
        .map_err(|_| Fault::Malformed(at, format!("int32 value {v} out of range")))
}

struct Model {
    ir_version: i64,
    opsets: Vec<OpsetImport>,
    producer_name: String,
    producer_version: String,
    graph: Graph,
}

fn parse_model(c: &mut Cur) -> R<Model> {
    const M: &str = "ModelProto";
    let mut m = Model {
        ir_version: 0,
        opsets: Vec::new(),
        producer_name: String::new(),
        producer_version: String::new(),
        graph: Graph::default(),
    };
    let mut have_graph = false;
    while let Some((f, w, at)) = c.key()? {
        match f {
            1 => {
                want(M, f, w, 0, at)?;
                m.ir_version = c.varint()? as i64;
            }
            2 => {
                want(M, f, w, 2, at)?;
                m.producer_name = c.string()?;
            }
            3 => {
                want(M, f, w, 2, at)?;
                m.producer_version = c.string()?;
            }
            7 => {
                want(M, f, w, 2, at)?;
                if have_graph {
                    return Err(Fault::Malformed(at, "two graphs".into()));
                }
                m.graph = parse_graph(&mut c.sub(1, at)?, 1)?;
                have_graph = true;
            }
            8 => {
                want(M, f, w, 2, at)?;
                let mut s = c.sub(1, at)?;
                let mut o = OpsetImport {
                    domain: String::new(),
                    version: 0,
                };
                while let Some((f, w, at)) = s.key()? {
                    match f {
                        1 => {
                            want("OperatorSetIdProto", f, w, 2, at)?;
                            o.domain = s.string()?;
                        }
                        2 => {
                            want("OperatorSetIdProto", f, w, 0, at)?;
                            o.version = s.varint()? as i64;
                        }
                        _ => s.skip(w, at)?,
                    }
                }
                m.opsets.push(o);
            }
            _ => c.skip(w, at)?,
        }
    }
    if !have_graph {
        return Err(Fault::Malformed(c.pos, "model has no graph".into()));
    }
    if m.ir_version <= 0 {
        return Err(Fault::Malformed(0, format!("ir_version {}", m.ir_version)));
    }
    Ok(m)
}

fn parse_graph(c: &mut Cur, depth: usize) -> R<Graph> {
    const M: &str = "GraphProto";
    let mut g = Graph::default();
    while let Some((f, w, at)) = c.key()? {
        match f {
            1 => {
                want(M, f, w, 2, at)?;
                g.nodes
                    .push(parse_node(&mut c.sub(depth + 1, at)?, depth + 1)?);
            }
            2 => {
                want(M, f, w, 2, at)?;
                g.name = c.string()?;
            }
            5 => {
                want(M, f, w, 2, at)?;
                g.initializers
                    .push(parse_tensor(&mut c.sub(depth + 1, at)?, at)?);
            }
            11 | 12 => {
                want(M, f, w, 2, at)?;
                let v = parse_value_info(&mut c.sub(depth + 1, at)?, depth + 1)?;
                if f == 11 {
                    &mut g.inputs
                } else {
                    &mut g.outputs
                }
                .push(v);
            }
            _ => c.skip(w, at)?,
        }
    }
    Ok(g)
}

fn parse_value_info(c: &mut Cur, depth: usize) -> R<ValueInfo> {
    let mut v = ValueInfo::default();
    while let Some((f, w, at)) = c.key()? {
        match f {
            1 => {
                want("ValueInfoProto", f, w, 2, at)?;
                v.name = c.string()?;
            }
            2 => {
                want("ValueInfoProto", f, w, 2, at)?;
                // TypeProto: only tensor_type (1) is kept.
                let mut t = c.sub(depth + 1, at)?;
                while let Some((f, w, at)) = t.key()? {
                    if f != 1 {
                        t.skip(w, at)?;
                        continue;
                    }
                    want("TypeProto", f, w, 2, at)?;
                    let mut tt = t.sub(depth + 2, at)?;
                    while let Some((f, w, at)) = tt.key()? {
                        match f {
                            1 => {
                                want("TypeProto.Tensor", f, w, 0, at)?;
                                v.elem_type = Some(DataType(int32_of(tt.varint()?, at)?));
                            }
                            2 => {
                                want("TypeProto.Tensor", f, w, 2, at)?;
                                v.shape =
                                    Some(parse_shape(&mut tt.sub(depth + 3, at)?, depth + 3)?);
                            }
                            _ => tt.skip(w, at)?,
                        }
                    }
                }
            }
            _ => c.skip(w, at)?,
        }
    }
    Ok(v)
}

fn parse_shape(c: &mut Cur, depth: usize) -> R<Vec<Dim>> {
    let mut dims = Vec::new();
    while let Some((f, w, at)) = c.key()? {
        if f != 1 {
            c.skip(w, at)?;
            continue;
        }
        want("TensorShapeProto", f, w, 2, at)?;
        let mut d = c.sub(depth + 1, at)?;
        let mut dim = Dim::Unknown;
        while let Some((f, w, at)) = d.key()? {
            match f {
                1 => {
                    want("Dimension", f, w, 0, at)?;
                    dim = Dim::Value(d.varint()? as i64);
                }
                2 => {
                    want("Dimension", f, w, 2, at)?;
                    dim = Dim::Param(d.string()?);
                }
                _ => d.skip(w, at)?,
            }
        }
        dims.push(dim);
    }
    Ok(dims)
}

fn parse_node(c: &mut Cur, depth: usize) -> R<Node> {
    const M: &str = "NodeProto";
    let mut n = Node::default();
    while let Some((f, w, at)) = c.key()? {
        match f {
            1 | 2 | 3 | 4 | 7 => {
                want(M, f, w, 2, at)?;
                let s = c.string()?;
                match f {
                    1 => n.inputs.push(s),
                    2 => n.outputs.push(s),
                    3 => n.name = s,
                    4 => n.op_type = s,
                    _ => n.domain = s,
                }
            }
            5 => {
                want(M, f, w, 2, at)?;
                n.attributes
                    .push(parse_attribute(&mut c.sub(depth + 1, at)?, depth + 1, at)?);
            }
            _ => c.skip(w, at)?,
        }
    }
    Ok(n)
}

fn parse_attribute(c: &mut Cur, depth: usize, start: usize) -> R<Attribute> {
    const M: &str = "AttributeProto";
    let mut name = String::new();
    let mut ty: Option<i32> = None;
    let (mut fl, mut i, mut s, mut t, mut g) = (None, None, None, None, None);
    let mut floats = Vec::new();
    let mut ints = Vec::new();
    let mut strings = Vec::new();
    let mut tensors = Vec::new();
    let mut graphs = Vec::new();
    while let Some((f, w, at)) = c.key()? {
        match f {
            1 => {
                want(M, f, w, 2, at)?;
                name = c.string()?;
            }
            20 => {
                want(M, f, w, 0, at)?;
                ty = Some(int32_of(c.varint()?, at)?);
            }
            2 => {
                want(M, f, w, 5, at)?;
                fl = Some(f32::from_bits(c.fixed32()?));
            }
            3 => {
                want(M, f, w, 0, at)?;
                i = Some(c.varint()? as i64);
            }
            4 => {
                want(M, f, w, 2, at)?;
                s = Some(c.string()?);
            }
            5 => {
                want(M, f, w, 2, at)?;
                t = Some(parse_tensor(&mut c.sub(depth + 1, at)?, at)?);
            }
            6 => {
                want(M, f, w, 2, at)?;
                g = Some(parse_graph(&mut c.sub(depth + 1, at)?, depth + 1)?);
            }
            7 => {
                let mut bits = Vec::new();
                rep_fixed(c, M, f, w, at, 4, &mut bits)?;
                floats.extend(bits.into_iter().map(|b| f32::from_bits(b as u32)));
            }
            8 => {
                let mut v = Vec::new();
                rep_varint(c, M, f, w, at, &mut v)?;
                ints.extend(v.into_iter().map(|x| x as i64));
            }
            9 => {
                want(M, f, w, 2, at)?;
                strings.push(c.string()?);
            }
            10 => {
                want(M, f, w, 2, at)?;
                tensors.push(parse_tensor(&mut c.sub(depth + 1, at)?, at)?);
            }
            11 => {
                want(M, f, w, 2, at)?;
                graphs.push(parse_graph(&mut c.sub(depth + 1, at)?, depth + 1)?);
            }
            _ => c.skip(w, at)?,
        }
    }
    let missing =
        |what: &str| Fault::Malformed(start, format!("attribute '{name}': {what} is missing"));
    let value = match ty {
        Some(1) => AttrValue::Float(fl.ok_or_else(|| missing("f"))?),
        Some(2) => AttrValue::Int(i.ok_or_else(|| missing("i"))?),
        Some(3) => AttrValue::String(s.ok_or_else(|| missing("s"))?),
        Some(4) => AttrValue::Tensor(t.ok_or_else(|| missing("t"))?),
        Some(5) => AttrValue::Graph(Box::new(g.ok_or_else(|| missing("g"))?)),
        Some(6) => AttrValue::Floats(floats),
        Some(7) => AttrValue::Ints(ints),
        Some(8) => AttrValue::Strings(strings),
        Some(9) => AttrValue::Tensors(tensors),
        Some(10) => AttrValue::Graphs(graphs),
        Some(k @ (11..=14)) => AttrValue::Other(k),
        Some(k) => {
            return Err(Fault::Malformed(
                start,
                format!("attribute '{name}': type {k}"),
            ));
        }
        // No type (IR version 1 files): the field that is present.
        None => {
            if let Some(v) = fl {
                AttrValue::Float(v)
            } else if let Some(v) = i {
                AttrValue::Int(v)
            } else if let Some(v) = s {
                AttrValue::String(v)
            } else if let Some(v) = t {
                AttrValue::Tensor(v)
            } else if let Some(v) = g {
                AttrValue::Graph(Box::new(v))
            } else if !floats.is_empty() {
                AttrValue::Floats(floats)
            } else if !ints.is_empty() {
                AttrValue::Ints(ints)
            } else if !strings.is_empty() {
                AttrValue::Strings(strings)
            } else if !tensors.is_empty() {
                AttrValue::Tensors(tensors)
            } else if !graphs.is_empty() {
                AttrValue::Graphs(graphs)
            } else {
                return Err(Fault::Malformed(
                    start,
                    format!("attribute '{name}' has no type and no value"),
                ));
            }
        }
    };
    Ok(Attribute { name, value })
}

fn parse_tensor(c: &mut Cur, start: usize) -> R<Tensor> {
    const M: &str = "TensorProto";
    let mut t = Tensor {
        offset: start,
        ..Tensor::default()
    };
    let mut dims = Vec::new();
    let mut raw: Option<Range<usize>> = None;
    let (mut floats, mut i32s, mut i64s, mut f64s, mut u64s) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut n_strings = 0u64;
    let mut external = false;
    while let Some((f, w, at)) = c.key()? {
        match f {
            1 => rep_varint(c, M, f, w, at, &mut dims)?,
            2 => {
                want(M, f, w, 0, at)?;
                t.data_type = DataType(int32_of(c.varint()?, at)?);
            }
            4 => rep_fixed(c, M, f, w, at, 4, &mut floats)?,
            5 => rep_varint(c, M, f, w, at, &mut i32s)?,
            6 => {
                want(M, f, w, 2, at)?;
                c.len_delim()?;
                n_strings += 1;
            }
            7 => rep_varint(c, M, f, w, at, &mut i64s)?,
            8 => {
                want(M, f, w, 2, at)?;
                t.name = c.string()?;
            }
            9 => {
                want(M, f, w, 2, at)?;
                raw = Some(c.len_delim()?);
            }
            10 => rep_fixed(c, M, f, w, at, 8, &mut f64s)?,
            11 => rep_varint(c, M, f, w, at, &mut u64s)?,
            13 => {
                want(M, f, w, 2, at)?;
                c.len_delim()?;
                external = true;
            }
            14 => {
                want(M, f, w, 0, at)?;
                external |= c.varint()? == 1;
            }
            _ => c.skip(w, at)?,
        }
    }
    if external {
        return Err(Fault::External(start, t.name));
    }
    let bad = |what: String| Fault::Malformed(start, format!("tensor '{}': {what}", t.name));
    let mut elements = 1u64;
    for &d in &dims {
        let d = d as i64;
        if d < 0 {
            return Err(bad(format!("negative dimension {d}")));
        }
        elements = elements
            .checked_mul(d as u64)
            .ok_or_else(|| bad("element count overflows".into()))?;
    }
    let dt = t.data_type;
    let kinds = [
        raw.is_some(),
        !floats.is_empty(),
        !i32s.is_empty(),
        !i64s.is_empty(),
        !f64s.is_empty(),
        !u64s.is_empty(),
        n_strings > 0,
    ];
    if kinds.iter().filter(|&&k| k).count() > 1 {
        return Err(bad("values in more than one field".into()));
    }
    // Typed fields hold one value per element (two for complex types, packed pairs for 4-bit).
    let typed = |n: usize, field: &str, ok: bool| -> R<()> {
        if !ok {
            return Err(bad(format!("{field} for data type {dt}")));
        }
        let want = match dt.0 {
            14 | 15 => elements.saturating_mul(2),
            21..=23 => elements.div_ceil(2),
            _ => elements,
        };
        if n as u64 != want {
            return Err(bad(format!("{n} values in {field}, {want} expected")));
        }
        Ok(())
    };
    t.data = if let Some(r) = raw {
        if dt == DataType::STRING {
            return Err(bad("raw_data for a STRING tensor".into()));
        }
        let want = dt
            .raw_bytes(elements)
            .ok_or_else(|| bad(format!("raw_data for data type {dt}")))?;
        if r.len() as u64 != want {
            return Err(bad(format!(
                "raw_data of {} bytes, {want} expected",
                r.len()
            )));
        }
        TensorData::Raw(r)
    } else if !floats.is_empty() {
        typed(floats.len(), "float_data", matches!(dt.0, 1 | 14))?;
        TensorData::Float(
            floats
                .into_iter()
                .map(|b| f32::from_bits(b as u32))
                .collect(),
        )
    } else if !i32s.is_empty() {
        typed(
            i32s.len(),
            "int32_data",
            matches!(dt.0, 2..=6 | 9 | 10 | 16..=23),
        )?;
        let mut v = Vec::with_capacity(i32s.len());
        for x in i32s {
            v.push(int32_of(x, start)?);
        }
        TensorData::Int32(v)
    } else if !i64s.is_empty() {
        typed(i64s.len(), "int64_data", dt == DataType::INT64)?;
        TensorData::Int64(i64s.into_iter().map(|x| x as i64).collect())
    } else if !f64s.is_empty() {
        typed(f64s.len(), "double_data", matches!(dt.0, 11 | 15))?;
        TensorData::Double(f64s.into_iter().map(f64::from_bits).collect())
    } else if !u64s.is_empty() {
        typed(u64s.len(), "uint64_data", matches!(dt.0, 12 | 13))?;
        TensorData::Uint64(u64s)
    } else {
        if n_strings > 0 {
            typed(n_strings as usize, "string_data", dt == DataType::STRING)?;
        } else if elements > 0 && dt != DataType::UNDEFINED {
            return Err(bad(format!("{elements} elements and no data")));
        }
        TensorData::None
    };
    t.dims = dims.into_iter().map(|d| d as i64).collect();
    Ok(t)
}
