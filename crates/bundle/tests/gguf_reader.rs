//! The GGUF reader on well-formed files (every value type, nested arrays, alignment, v2 and v3)
//! and on every kind of broken or hostile file: each must give a typed error, never a panic.

use synaptix_bundle::gguf::{GgufErrorKind as K, GgufFile, GgufWriter, Value, ValueType};
use synaptix_core::DType;

mod common;
use common::TempDir;

fn sample_writer() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", Value::String("llama".into()))
        .add_metadata("u8", Value::U8(200))
        .add_metadata("i8", Value::I8(-100))
        .add_metadata("u16", Value::U16(60000))
        .add_metadata("i16", Value::I16(-30000))
        .add_metadata("u32", Value::U32(4_000_000_000))
        .add_metadata("i32", Value::I32(-2_000_000_000))
        .add_metadata("f32", Value::F32(1.5))
        .add_metadata("bool", Value::Bool(true))
        .add_metadata("u64", Value::U64(u64::MAX))
        .add_metadata("i64", Value::I64(i64::MIN))
        .add_metadata("f64", Value::F64(-2.25))
        .add_metadata("unicode", Value::String("héllo 世界 🎉".into()))
        .add_metadata(
            "nested",
            Value::Array(
                ValueType::Array,
                vec![
                    Value::Array(ValueType::I32, vec![Value::I32(1), Value::I32(-2)]),
                    Value::Array(ValueType::String, vec![Value::String("x".into())]),
                    Value::Array(ValueType::F32, vec![]),
                ],
            ),
        );
    w.add_f32("a.weight", &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    w.add_tensor("b.weight", &[1, 32], DType::Q8_0, vec![7u8; 34]);
    w
}

fn open_bytes(tag: &str, bytes: &[u8]) -> Result<GgufFile, synaptix_bundle::GgufError> {
    let dir = TempDir::new(tag);
    let path = dir.write("model.gguf", bytes);
    GgufFile::open(path)
}

#[test]
fn round_trips_every_value_type() {
    for version in [2, 3] {
        let mut w = sample_writer();
        w.version = version;
        let f = open_bytes(&format!("rt{version}"), &w.to_bytes()).unwrap();
        assert_eq!(f.version, version);
        assert_eq!(f.get("u8"), Some(&Value::U8(200)));
        assert_eq!(f.get("i64"), Some(&Value::I64(i64::MIN)));
        assert_eq!(f.get("u64").and_then(Value::as_u64), Some(u64::MAX));
        assert_eq!(f.get_str("unicode").unwrap(), Some("héllo 世界 🎉"));
        assert_eq!(f.get_bool("bool").unwrap(), Some(true));
        let nested = f.get_array("nested").unwrap().unwrap();
        assert_eq!(nested.len(), 3);
        assert_eq!(nested[0].as_array().unwrap()[1], Value::I32(-2));
        assert_eq!(nested[2], Value::Array(ValueType::F32, vec![]));
        let a = f.tensor_info("a.weight").unwrap();
        assert_eq!(a.shape.dims(), &[2, 3]);
        assert_eq!(a.dtype, DType::F32);
        let bytes = f.tensor_bytes(a);
        let vals: Vec<f32> = bytes
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(vals, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let b = f.tensor_info("b.weight").unwrap();
        assert_eq!(b.file_offset % f.alignment, 0);
        assert_eq!(f.tensor_bytes(b), &[7u8; 34][..]);
        // Typed getters reject the wrong type with an error naming the key.
        let e = f.get_str("u8").unwrap_err().to_string();
        assert!(e.contains("'u8'") && e.contains("expected a string"), "{e}");
    }
}

#[test]
fn honours_custom_alignment() {
    let mut w = sample_writer();
    w.add_metadata("general.alignment", Value::U32(256));
    let f = open_bytes("align", &w.to_bytes()).unwrap();
    assert_eq!(f.alignment, 256);
    for t in f.tensors() {
        assert_eq!(t.file_offset % 256, 0, "{}", t.name);
    }
}

fn expect_err(tag: &str, bytes: &[u8], check: impl Fn(&K) -> bool) -> String {
    match open_bytes(tag, bytes) {
        Ok(_) => panic!("{tag}: a broken file was accepted"),
        Err(e) => {
            assert!(check(&e.kind), "{tag}: unexpected error kind: {e}");
            let msg = e.to_string();
            assert!(
                msg.contains("model.gguf"),
                "{tag}: error does not name the file: {msg}"
            );
            assert!(!msg.contains('\n'), "{tag}: error is not one line: {msg}");
            msg
        }
    }
}

/// Offset of the first tensor's type id in a file from `sample_writer`.
fn first_tensor_type_offset(bytes: &[u8]) -> usize {
    let f = open_bytes("probe", bytes).unwrap();
    let t = &f.tensors()[0];
    t.info_offset as usize + 8 + t.name.len() + 4 + 8 * t.shape.rank()
}

#[test]
fn missing_directory_and_empty_files() {
    let dir = TempDir::new("gguf-paths");
    let e = GgufFile::open(dir.0.join("nope.gguf")).unwrap_err();
    assert!(matches!(e.kind, K::Io(_)), "{e}");
    let e = GgufFile::open(&dir.0).unwrap_err();
    assert!(matches!(e.kind, K::IsDirectory), "{e}");
    expect_err("empty", &[], |k| matches!(k, K::Empty));
}

#[test]
fn random_bytes_and_bad_headers() {
    let mut state = 12345u32;
    let noise: Vec<u8> = (0..4096)
        .map(|_| {
            state = state.wrapping_mul(1103515245).wrapping_add(12345);
            (state >> 16) as u8
        })
        .collect();
    expect_err("noise", &noise, |k| matches!(k, K::BadMagic { .. }));
    expect_err("short", b"GG", |k| matches!(k, K::BadMagic { .. }));
    let mut v1 = sample_writer().to_bytes();
    v1[4..8].copy_from_slice(&1u32.to_le_bytes());
    expect_err("v1", &v1, |k| matches!(k, K::UnsupportedVersion(1)));
    // Valid magic followed by noise: must fail cleanly, whatever the noise says.
    let mut fake = b"GGUF\x03\x00\x00\x00".to_vec();
    fake.extend_from_slice(&noise);
    assert!(open_bytes("magic-noise", &fake).is_err());
}

/// Where the last tensor's data ends (the writer pads the file past it to the alignment, as
/// llama.cpp's writers do; cutting that padding loses nothing).
fn data_end(bytes: &[u8]) -> usize {
    let f = open_bytes("probe-end", bytes).unwrap();
    f.tensors()
        .iter()
        .map(|t| (t.file_offset + t.n_bytes) as usize)
        .max()
        .unwrap()
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = sample_writer().to_bytes();
    let end = data_end(&bytes);
    assert!(end <= bytes.len() && bytes.len() - end < 32);
    for cut in (0..end).step_by(7).chain([end - 1]) {
        let r = open_bytes(&format!("cut{cut}"), &bytes[..cut]);
        assert!(
            r.is_err(),
            "file cut at {cut} of {} was accepted",
            bytes.len()
        );
    }
}

#[test]
fn absurd_counts_and_lengths() {
    let bytes = sample_writer().to_bytes();
    let mut huge_tensors = bytes.clone();
    huge_tensors[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    expect_err("ntensors", &huge_tensors, |k| {
        matches!(k, K::ImplausibleCount { .. })
    });
    let mut huge_kv = bytes.clone();
    huge_kv[16..24].copy_from_slice(&(1u64 << 60).to_le_bytes());
    expect_err("nkv", &huge_kv, |k| matches!(k, K::ImplausibleCount { .. }));
    // The first key's length.
    let mut huge_key = bytes.clone();
    huge_key[24..32].copy_from_slice(&(u64::MAX - 3).to_le_bytes());
    expect_err("keylen", &huge_key, |k| matches!(k, K::Truncated { .. }));

    let mut w = GgufWriter::new();
    w.add_metadata("arr", Value::Array(ValueType::U32, vec![Value::U32(1)]));
    let mut b = w.to_bytes();
    // magic+version+counts (24) + key (8+3) + type (4) + item type (4) = count offset.
    let count_at = 24 + 8 + 3 + 4 + 4;
    b[count_at..count_at + 8].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    expect_err("arrlen", &b, |k| matches!(k, K::ImplausibleCount { .. }));
}

#[test]
fn unknown_types() {
    let mut w = GgufWriter::new();
    w.add_metadata("k", Value::U8(1));
    let mut b = w.to_bytes();
    b[24 + 8 + 1..24 + 8 + 1 + 4].copy_from_slice(&99u32.to_le_bytes());
    let msg = expect_err("valtype", &b, |k| {
        matches!(k, K::UnknownValueType { type_id: 99, .. })
    });
    assert!(msg.contains("'k'"), "{msg}");

    let bytes = sample_writer().to_bytes();
    let at = first_tensor_type_offset(&bytes);
    let mut b = bytes.clone();
    b[at..at + 4].copy_from_slice(&4u32.to_le_bytes()); // id 4 was removed from ggml
    let msg = expect_err("ttype", &b, |k| {
        matches!(k, K::UnknownTensorType { type_id: 4, .. })
    });
    assert!(msg.contains("a.weight"), "{msg}");
}

#[test]
fn absurd_dimensions_and_out_of_bounds_data() {
    let mut w = GgufWriter::new();
    w.add_tensor("big", &[1 << 40, 1 << 40], DType::F32, vec![0u8; 32]);
    let msg = expect_err("dims", &w.to_bytes(), |k| {
        matches!(k, K::BadDims { .. } | K::DataOutOfBounds { .. })
    });
    assert!(msg.contains("big"), "{msg}");

    let mut w = GgufWriter::new();
    w.add_tensor("overflow", &[u64::MAX / 2, 3], DType::F32, vec![0u8; 32]);
    expect_err("overflow", &w.to_bytes(), |k| {
        matches!(k, K::BadDims { .. })
    });

    let mut w = GgufWriter::new();
    w.add_tensor("rank5", &[1, 1, 1, 1, 1], DType::F32, vec![0u8; 4]);
    expect_err("rank", &w.to_bytes(), |k| {
        matches!(k, K::BadRank { rank: 5, .. })
    });

    let mut w = GgufWriter::new();
    w.add_tensor("partial_block", &[1, 33], DType::Q8_0, vec![0u8; 68]);
    expect_err("block", &w.to_bytes(), |k| matches!(k, K::BadDims { .. }));

    // A tensor whose data runs past the end of the file.
    let bytes = sample_writer().to_bytes();
    let short = &bytes[..data_end(&bytes) - 10];
    let msg = expect_err("oob", short, |k| matches!(k, K::DataOutOfBounds { .. }));
    assert!(msg.contains("b.weight"), "{msg}");

    // An offset that overflows when added to the data section start.
    let at = first_tensor_type_offset(&bytes) + 4;
    let mut b = bytes.clone();
    b[at..at + 8].copy_from_slice(&(u64::MAX - 31).to_le_bytes());
    expect_err("offset-overflow", &b, |k| {
        matches!(k, K::DataOutOfBounds { .. })
    });

    // A misaligned offset.
    let mut b = bytes.clone();
    b[at..at + 8].copy_from_slice(&3u64.to_le_bytes());
    expect_err("misaligned", &b, |k| matches!(k, K::Misaligned { .. }));

    // Two tensors sharing bytes.
    let mut b = bytes.clone();
    let f = open_bytes("probe2", &bytes).unwrap();
    let second = &f.tensors()[1];
    let at2 = second.info_offset as usize + 8 + second.name.len() + 4 + 8 * second.shape.rank() + 4;
    b[at2..at2 + 8].copy_from_slice(&0u64.to_le_bytes());
    expect_err("overlap", &b, |k| matches!(k, K::Overlap { .. }));
}

#[test]
fn duplicate_names_bad_alignment_deep_nesting() {
    let mut w = GgufWriter::new();
    w.add_metadata("k", Value::U8(1))
        .add_metadata("k", Value::U8(2));
    expect_err("dupkey", &w.to_bytes(), |k| {
        matches!(k, K::DuplicateKey { .. })
    });

    let mut w = GgufWriter::new();
    w.add_f32("t", &[1], &[1.0]).add_f32("t", &[1], &[2.0]);
    expect_err("duptensor", &w.to_bytes(), |k| {
        matches!(k, K::DuplicateTensor { .. })
    });

    let mut w = GgufWriter::new();
    w.add_metadata("general.alignment", Value::U32(24));
    expect_err("align", &w.to_bytes(), |k| matches!(k, K::BadAlignment(24)));

    let mut v = Value::Array(ValueType::U8, vec![Value::U8(1)]);
    for _ in 0..20 {
        v = Value::Array(ValueType::Array, vec![v]);
    }
    let mut w = GgufWriter::new();
    w.add_metadata("deep", v);
    expect_err("deep", &w.to_bytes(), |k| {
        matches!(k, K::NestingTooDeep { .. })
    });

    let mut w = GgufWriter::new();
    w.add_metadata("b", Value::Bool(true));
    let mut b = w.to_bytes();
    let at = b.len() - 1;
    b[at] = 7;
    expect_err("bool", &b, |k| matches!(k, K::BadMetadata { .. }));
}
