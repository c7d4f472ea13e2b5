//! The CTranslate2 `model.bin` reader on small files written here (every dtype, scalars, an
//! alias), on broken and hostile files (each must give an error, never a panic), and on the
//! real Whisper base model when it is cached.

use std::path::{Path, PathBuf};

use half::{bf16, f16};
use synaptix_bundle::ct2::{Ct2DType, Ct2Error, Ct2File};

mod common;
use common::TempDir;

/// A minimal `model.bin` writer; fields can be overridden to build hostile files.
struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    fn new(version: u32, spec: &str, revision: u32, n_vars: u32) -> Writer {
        let mut w = Writer { buf: Vec::new() };
        w.u32(version).string(spec).u32(revision).u32(n_vars);
        w
    }
    fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }
    fn u16(&mut self, v: u16) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn raw(&mut self, b: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(b);
        self
    }
    fn string(&mut self, s: &str) -> &mut Self {
        self.u16(s.len() as u16 + 1).raw(s.as_bytes()).u8(0)
    }
    /// A variable whose byte count is derived from its data.
    fn var(&mut self, name: &str, dims: &[u32], dtype: u8, data: &[u8]) -> &mut Self {
        self.string(name).u8(dims.len() as u8);
        for &d in dims {
            self.u32(d);
        }
        self.u8(dtype).u32(data.len() as u32).raw(data)
    }
}

fn le<T: Copy, const N: usize>(vals: &[T], f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
    vals.iter().flat_map(|&v| f(v)).collect()
}

const F16_MATRIX: [f32; 6] = [1.0, -2.0, 0.5, 65504.0, -0.25, 3.0];
const F32_VECTOR: [f32; 3] = [1.5, -1e-7, 3.25e10];
const BF16_VECTOR: [f32; 4] = [1.0, -3.0, 256.0, 0.0078125];

/// A small valid file exercising every dtype, scalars and an alias.
fn sample() -> Vec<u8> {
    let mut w = Writer::new(6, "TestSpec", 7, 8);
    w.var("cfg/i8", &[], 1, &[(-5i8) as u8])
        .var("cfg/i16", &[], 2, &(-300i16).to_le_bytes())
        .var("cfg/i32", &[], 3, &123_456_789i32.to_le_bytes())
        .var("cfg/one", &[1], 3, &7i32.to_le_bytes())
        .var(
            "w/f16",
            &[2, 3],
            4,
            &le(&F16_MATRIX, |v| f16::from_f32(v).to_le_bytes()),
        )
        .var("w/f32", &[3], 0, &le(&F32_VECTOR, f32::to_le_bytes))
        .var(
            "w/bf16",
            &[4],
            5,
            &le(&BF16_VECTOR, |v| bf16::from_f32(v).to_le_bytes()),
        )
        .var(
            "w/ints",
            &[2, 2],
            2,
            &le(&[1i16, -2, 300, -32768], i16::to_le_bytes),
        )
        .u32(1)
        .string("w/alias")
        .string("w/f16");
    w.buf
}

fn open_bytes(dir: &TempDir, name: &str, bytes: &[u8]) -> Result<Ct2File, Ct2Error> {
    let path = dir.write(name, bytes);
    Ct2File::open(&path)
}

fn expect_err(dir: &TempDir, name: &str, bytes: &[u8]) -> Ct2Error {
    match open_bytes(dir, name, bytes) {
        Ok(f) => panic!("{name}: expected an error, opened {f:?}"),
        Err(e) => {
            let msg = e.to_string();
            assert!(!msg.contains('\n'), "multi-line message: {msg}");
            assert!(msg.contains(name), "message does not name the file: {msg}");
            e
        }
    }
}

#[test]
fn reads_every_accessor() {
    let dir = TempDir::new("ct2-ok");
    let bytes = sample();
    let f = open_bytes(&dir, "model.bin", &bytes).unwrap();
    assert_eq!(f.binary_version(), 6);
    assert_eq!(f.spec(), "TestSpec");
    assert_eq!(f.revision(), 7);
    assert_eq!(f.end_offset(), bytes.len() as u64);
    assert_eq!(f.file_len(), bytes.len() as u64);
    let names: Vec<&str> = f.variables().iter().map(|v| v.name.as_str()).collect();
    assert_eq!(
        names,
        ["cfg/i8", "cfg/i16", "cfg/i32", "cfg/one", "w/f16", "w/f32", "w/bf16", "w/ints"]
    );
    assert_eq!(f.aliases(), &[("w/alias".to_string(), "w/f16".to_string())]);

    // Scalars of each int type, and a one-element vector.
    assert_eq!(f.scalar_i64("cfg/i8").unwrap(), Some(-5));
    assert_eq!(f.scalar_i64("cfg/i16").unwrap(), Some(-300));
    assert_eq!(f.scalar_i64("cfg/i32").unwrap(), Some(123_456_789));
    assert_eq!(f.scalar_i64("cfg/one").unwrap(), Some(7));
    assert_eq!(f.scalar_i64("absent").unwrap(), None);
    let i8v = f.get("cfg/i8").unwrap();
    assert!(i8v.is_scalar());
    assert_eq!((i8v.dtype, i8v.elements()), (Ct2DType::I8, 1));
    assert_eq!(f.bytes(i8v), &[(-5i8) as u8]);
    // Not one int element: an error naming the variable.
    for bad in ["w/f32", "w/ints"] {
        let e = f.scalar_i64(bad).unwrap_err();
        assert!(matches!(e, Ct2Error::WrongType { .. }), "{e}");
        assert!(e.to_string().contains(bad), "{e}");
    }

    // Float data of every float type, unaligned in the file.
    let m = f.get("w/f16").unwrap();
    assert_eq!(
        (m.shape.as_slice(), m.dtype),
        (&[2usize, 3][..], Ct2DType::F16)
    );
    assert_eq!(m.byte_len(), 12);
    assert_eq!(f.f32_values("w/f16").unwrap(), F16_MATRIX);
    assert_eq!(f.f32_matrix("w/f16", 2, 3).unwrap(), F16_MATRIX);
    assert_eq!(f.f32_matrix("w/f16", 3, 2).unwrap(), F16_MATRIX);
    assert_eq!(f.f32_values("w/f32").unwrap(), F32_VECTOR);
    assert_eq!(f.f32_matrix("w/f32", 1, 3).unwrap(), F32_VECTOR);
    assert_eq!(f.f32_values("w/bf16").unwrap(), BF16_VECTOR);
    assert_eq!(f.get("w/bf16").unwrap().dtype, Ct2DType::BF16);
    // Ints convert by value.
    assert_eq!(
        f.f32_values("w/ints").unwrap(),
        [1.0, -2.0, 300.0, -32768.0]
    );
    assert_eq!(f.f32_values("cfg/i8").unwrap(), [-5.0]);

    // The alias resolves to its target.
    let a = f.get("w/alias").unwrap();
    assert_eq!(a, m);
    assert_eq!(f.f32_values("w/alias").unwrap(), F16_MATRIX);

    // Missing variable and wrong matrix shape.
    let e = f.f32_values("nope").unwrap_err();
    assert!(matches!(&e, Ct2Error::MissingVariable { name, .. } if name == "nope"));
    let msg = e.to_string();
    assert!(msg.contains("'nope'") && msg.contains("model.bin"), "{msg}");
    let e = f.f32_matrix("w/f16", 4, 2).unwrap_err();
    assert!(matches!(e, Ct2Error::ShapeMismatch { .. }));
    let msg = e.to_string();
    assert!(
        msg.contains("[4, 2]") && msg.contains("[2, 3]") && msg.contains("w/f16"),
        "{msg}"
    );
    let e = f.f32_matrix("w/f16", usize::MAX, 2).unwrap_err();
    assert!(matches!(e, Ct2Error::ShapeMismatch { .. }), "{e}");
}

#[test]
fn dtype_ids_sizes_and_names() {
    let all = [
        (0, Ct2DType::F32, 4, "float32"),
        (1, Ct2DType::I8, 1, "int8"),
        (2, Ct2DType::I16, 2, "int16"),
        (3, Ct2DType::I32, 4, "int32"),
        (4, Ct2DType::F16, 2, "float16"),
        (5, Ct2DType::BF16, 2, "bfloat16"),
    ];
    for (id, dt, size, name) in all {
        assert_eq!(Ct2DType::from_id(id), Some(dt));
        assert_eq!(dt.id(), id);
        assert_eq!(dt.size_bytes(), size);
        assert_eq!(dt.name(), name);
    }
    assert_eq!(Ct2DType::from_id(6), None);
}

#[test]
fn version_5_and_trailing_bytes_are_accepted() {
    let dir = TempDir::new("ct2-v5");
    let mut bytes = sample();
    bytes[0] = 5;
    let f = open_bytes(&dir, "v5.bin", &bytes).unwrap();
    assert_eq!(f.binary_version(), 5);
    let len = bytes.len() as u64;
    bytes.extend_from_slice(b"junk");
    let f = open_bytes(&dir, "trailing.bin", &bytes).unwrap();
    assert_eq!(f.end_offset(), len);
    assert_eq!(f.file_len(), len + 4);
}

#[test]
fn empty_file_and_directory() {
    let dir = TempDir::new("ct2-empty");
    let e = expect_err(&dir, "empty.bin", &[]);
    assert!(matches!(e, Ct2Error::Empty { .. }), "{e}");
    let e = Ct2File::open(&dir.0).unwrap_err();
    assert!(matches!(e, Ct2Error::IsDirectory { .. }), "{e}");
    let e = Ct2File::open(&dir.0.join("missing.bin")).unwrap_err();
    assert!(matches!(e, Ct2Error::Io { .. }), "{e}");
    assert_eq!(e.path(), dir.0.join("missing.bin"));
}

#[test]
fn wrong_version() {
    let dir = TempDir::new("ct2-version");
    for v in [0u32, 3, 4, 7, u32::MAX] {
        let mut bytes = sample();
        bytes[..4].copy_from_slice(&v.to_le_bytes());
        let e = expect_err(&dir, "v.bin", &bytes);
        assert!(
            matches!(e, Ct2Error::UnsupportedVersion { version, .. } if version == v),
            "{e}"
        );
        let msg = e.to_string();
        assert!(
            msg.contains(&format!("unsupported CTranslate2 binary version {v}")),
            "{msg}"
        );
    }
}

#[test]
fn every_truncation_is_an_error() {
    let dir = TempDir::new("ct2-trunc");
    let bytes = sample();
    for len in 0..bytes.len() {
        let e = expect_err(&dir, "t.bin", &bytes[..len]);
        if len > 0 {
            assert!(matches!(e, Ct2Error::Truncated { .. }), "prefix {len}: {e}");
        }
    }
    // One truncated inside the f16 data names the variable and the shortfall.
    let start = bytes.windows(6).position(|w| w == b"w/f16\0").unwrap();
    // name (6) + rank (1) + 2 dims (8) + dtype (1) + byte count (4), then 12 data bytes.
    let data = start + 6 + 1 + 8 + 1 + 4;
    let e = expect_err(&dir, "t.bin", &bytes[..data + 5]);
    let msg = e.to_string();
    assert!(
        msg.contains(&format!(
            "truncated at byte {data} reading variable 'w/f16' data (needs 12 bytes, 5 left)"
        )),
        "{msg}"
    );
}

#[test]
fn string_length_past_the_end() {
    let dir = TempDir::new("ct2-strlen");
    let mut w = Writer::new(6, "S", 1, 1);
    w.u16(60000).raw(b"abc");
    let e = expect_err(&dir, "s.bin", &w.buf);
    assert!(
        matches!(e, Ct2Error::Truncated { needed: 60000, .. }),
        "{e}"
    );

    // The spec name itself overrunning.
    let mut w = Writer { buf: Vec::new() };
    w.u32(6).u16(u16::MAX).raw(b"x");
    let e = expect_err(&dir, "s.bin", &w.buf);
    assert!(matches!(e, Ct2Error::Truncated { .. }), "{e}");
}

#[test]
fn malformed_strings() {
    let dir = TempDir::new("ct2-str");
    let cases: [(&str, &[u8]); 4] = [
        ("zero length", &[0, 0]),
        ("no NUL", &[2, 0, b'a', b'b']),
        ("inner NUL", &[3, 0, b'a', 0, 0]),
        ("bad UTF-8", &[3, 0, 0xff, 0xfe, 0]),
    ];
    for (label, s) in cases {
        let mut w = Writer { buf: Vec::new() };
        w.u32(6).raw(s).u32(1).u32(0).u32(0);
        let e = expect_err(&dir, "s.bin", &w.buf);
        assert!(matches!(e, Ct2Error::BadString { .. }), "{label}: {e}");
    }
}

#[test]
fn dims_overflowing_usize() {
    let dir = TempDir::new("ct2-overflow");
    let mut w = Writer::new(6, "S", 1, 1);
    w.string("huge")
        .u8(3)
        .u32(u32::MAX)
        .u32(u32::MAX)
        .u32(u32::MAX);
    w.u8(0).u32(16).raw(&[0; 16]).u32(0);
    let e = expect_err(&dir, "o.bin", &w.buf);
    assert!(matches!(e, Ct2Error::BadShape { .. }), "{e}");
    assert!(e.to_string().contains("'huge'"), "{e}");

    // A product that fits but whose byte size overflows with a wide dtype.
    let mut w = Writer::new(6, "S", 1, 1);
    w.string("wide")
        .u8(2)
        .u32(u32::MAX)
        .u32(u32::MAX)
        .u8(0)
        .u32(0);
    let e = expect_err(&dir, "o.bin", &w.buf);
    // 2^64 - 2^33 + 1 elements fit in usize; × 4 bytes does not.
    assert!(matches!(e, Ct2Error::BadShape { .. }), "{e}");
}

#[test]
fn byte_count_disagreeing_with_shape() {
    let dir = TempDir::new("ct2-bytes");
    let mut w = Writer::new(6, "S", 1, 1);
    w.string("x")
        .u8(2)
        .u32(2)
        .u32(3)
        .u8(4)
        .u32(10)
        .raw(&[0; 10])
        .u32(0);
    let e = expect_err(&dir, "b.bin", &w.buf);
    assert!(
        matches!(
            e,
            Ct2Error::ByteCountMismatch {
                expected: 12,
                found: 10,
                ..
            }
        ),
        "{e}"
    );
    let msg = e.to_string();
    assert!(msg.contains("'x'") && msg.contains("float16"), "{msg}");

    // A huge claimed count with a matching shape is truncation, not an over-read.
    let mut w = Writer::new(6, "S", 1, 1);
    w.string("big")
        .u8(1)
        .u32(1 << 28)
        .u8(0)
        .u32(1 << 30)
        .raw(&[0; 8]);
    let e = expect_err(&dir, "b.bin", &w.buf);
    assert!(matches!(e, Ct2Error::Truncated { .. }), "{e}");
}

#[test]
fn unknown_dtype() {
    let dir = TempDir::new("ct2-dtype");
    let mut w = Writer::new(6, "S", 1, 1);
    w.var("x", &[2], 9, &[0; 2]).u32(0);
    let e = expect_err(&dir, "d.bin", &w.buf);
    assert!(
        matches!(&e, Ct2Error::UnknownDType { dtype_id: 9, name, .. } if name == "x"),
        "{e}"
    );
}

#[test]
fn alias_to_missing_variable() {
    let dir = TempDir::new("ct2-alias");
    let mut w = Writer::new(6, "S", 1, 1);
    w.var("x", &[1], 0, &[0; 4])
        .u32(1)
        .string("y")
        .string("missing");
    let e = expect_err(&dir, "a.bin", &w.buf);
    assert!(
        matches!(&e, Ct2Error::DanglingAlias { alias, target, .. } if alias == "y" && target == "missing"),
        "{e}"
    );

    // An alias to an alias is not a variable either.
    let mut w = Writer::new(6, "S", 1, 1);
    w.var("x", &[1], 0, &[0; 4])
        .u32(2)
        .string("y")
        .string("x")
        .string("z")
        .string("y");
    let e = expect_err(&dir, "a.bin", &w.buf);
    assert!(matches!(e, Ct2Error::DanglingAlias { .. }), "{e}");
}

#[test]
fn duplicate_names() {
    let dir = TempDir::new("ct2-dup");
    let mut w = Writer::new(6, "S", 1, 2);
    w.var("x", &[1], 0, &[0; 4])
        .var("x", &[1], 0, &[0; 4])
        .u32(0);
    let e = expect_err(&dir, "d.bin", &w.buf);
    assert!(matches!(e, Ct2Error::DuplicateName { .. }), "{e}");

    let mut w = Writer::new(6, "S", 1, 2);
    w.var("x", &[1], 0, &[0; 4])
        .var("z", &[1], 0, &[0; 4])
        .u32(1)
        .string("z")
        .string("x");
    let e = expect_err(&dir, "d.bin", &w.buf);
    assert!(matches!(e, Ct2Error::DuplicateName { .. }), "{e}");
}

#[test]
fn huge_counts_do_not_allocate() {
    let dir = TempDir::new("ct2-counts");
    let mut w = Writer::new(6, "S", 1, u32::MAX);
    w.raw(&[1, 2, 3]);
    let e = expect_err(&dir, "c.bin", &w.buf);
    assert!(matches!(e, Ct2Error::Truncated { .. }), "{e}");
    let mut w = Writer::new(6, "S", 1, 0);
    w.u32(u32::MAX);
    let e = expect_err(&dir, "c.bin", &w.buf);
    assert!(matches!(e, Ct2Error::Truncated { .. }), "{e}");
}

fn whisper_base() -> Option<PathBuf> {
    let mut candidates = Vec::new();
    if let Some(dir) = std::env::var_os("SYNAPTIX_MODELS") {
        candidates.push(Path::new(&dir).join("whisper-base/model.bin"));
    }
    if let Some(home) = std::env::var_os("HOME") {
        candidates.push(Path::new(&home).join(".cache/synaptix/models/whisper-base/model.bin"));
    }
    candidates.into_iter().find(|p| p.is_file())
}

#[test]
fn real_whisper_base() {
    let Some(path) = whisper_base() else {
        println!(
            "skipping: no whisper-base/model.bin under $SYNAPTIX_MODELS or ~/.cache/synaptix/models"
        );
        return;
    };
    let f = Ct2File::open(&path).unwrap();
    assert_eq!(f.spec(), "WhisperSpec");
    assert_eq!(f.binary_version(), 6);
    assert_eq!(f.variables().len(), 212);
    assert_eq!(f.end_offset(), f.file_len());

    let emb = f.get("decoder/embeddings/weight").unwrap();
    assert_eq!(emb.shape, [51865, 512]);
    assert_eq!(emb.dtype, Ct2DType::F16);
    let proj = f.get("decoder/projection/weight").unwrap();
    assert_eq!(proj.shape, [51865, 512]);
    assert_eq!(proj.name, "decoder/embeddings/weight");
    assert!(f
        .aliases()
        .iter()
        .any(|(a, t)| a == "decoder/projection/weight" && t == "decoder/embeddings/weight"));

    let conv = f.get("encoder/conv1/weight").unwrap();
    assert_eq!(conv.shape, [512, 80, 3]);
    let w = f.f32_matrix("encoder/conv1/weight", 512, 240).unwrap();
    assert_eq!(w.len(), 512 * 240);
    assert!(w.iter().all(|v| v.is_finite()));
    assert!(w.iter().any(|&v| v != 0.0));

    assert_eq!(f.scalar_i64("decoder/num_heads").unwrap(), Some(8));
    assert_eq!(f.scalar_i64("encoder/num_heads").unwrap(), Some(8));
    assert_eq!(
        f.get("decoder/num_heads").unwrap().shape,
        Vec::<usize>::new()
    );
    println!(
        "{}: {} variables, {} aliases",
        path.display(),
        f.variables().len(),
        f.aliases().len()
    );
}
