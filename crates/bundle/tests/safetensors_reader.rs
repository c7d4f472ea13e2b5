//! The safetensors reader on small files written here (F32, F16, BF16, an int tensor, a scalar,
//! metadata), on every truncation of a valid file and on hostile headers (each must give an
//! error naming the file, never a panic), and on the real all-MiniLM-L6-v2 file when it is
//! cached.

use std::path::Path;

use half::{bf16, f16};
use synaptix_bundle::safetensors::{SafetensorsError, SafetensorsFile, StDType};

mod common;
use common::TempDir;

/// A file from a header (JSON text) and the data after it.
fn file(header: &str, data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

const F32_MATRIX: [f32; 6] = [1.0, -2.0, 0.5, 1e-7, -3.25e10, 7.0];
const F16_VECTOR: [f32; 3] = [1.0, -0.5, 65504.0];
const BF16_VECTOR: [f32; 2] = [256.0, -0.0078125];

/// A valid file: an F32 [2, 3] matrix, an F16 [3] vector, a BF16 [2] vector, an I64 [1, 2]
/// tensor, an F32 scalar and metadata; data in a different order from the header's.
fn sample() -> Vec<u8> {
    let mut data = Vec::new();
    // bf16 first (0..4), then f32 matrix (4..28), f16 (28..34), i64 (34..50), scalar (50..54).
    data.extend(
        BF16_VECTOR
            .iter()
            .flat_map(|&v| bf16::from_f32(v).to_le_bytes()),
    );
    data.extend(F32_MATRIX.iter().flat_map(|v| v.to_le_bytes()));
    data.extend(
        F16_VECTOR
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_le_bytes()),
    );
    data.extend([7i64, -9].iter().flat_map(|v| v.to_le_bytes()));
    data.extend(2.5f32.to_le_bytes());
    let header = r#"{"__metadata__":{"format":"pt","note":"x"},
        "m":{"dtype":"F32","shape":[2,3],"data_offsets":[4,28]},
        "h":{"dtype":"F16","shape":[3],"data_offsets":[28,34]},
        "b":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},
        "ids":{"dtype":"I64","shape":[1,2],"data_offsets":[34,50]},
        "s":{"dtype":"F32","shape":[],"data_offsets":[50,54]}}"#;
    file(header, &data)
}

#[test]
fn reads_a_small_file() {
    let dir = TempDir::new("st-small");
    let path = dir.write("a.safetensors", &sample());
    let f = SafetensorsFile::open(&path).expect("valid file");
    let names: Vec<&str> = f.tensors().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["m", "h", "b", "ids", "s"]);
    assert_eq!(
        f.metadata(),
        [
            ("format".to_string(), "pt".to_string()),
            ("note".to_string(), "x".to_string())
        ]
    );
    let m = f.get("m").unwrap();
    assert_eq!(
        (m.dtype, m.shape.clone(), m.elements()),
        (StDType::F32, vec![2, 3], 6)
    );
    assert_eq!(f.f32_matrix("m", 2, 3).unwrap(), F32_MATRIX);
    assert_eq!(f.f32_matrix("m", 3, 2).unwrap(), F32_MATRIX);
    assert_eq!(f.f32_matrix("h", 1, 3).unwrap(), F16_VECTOR);
    assert_eq!(f.f32_values("b").unwrap(), BF16_VECTOR);
    assert_eq!(f.f32_values("s").unwrap(), [2.5]);
    assert_eq!(f.get("s").unwrap().shape, Vec::<usize>::new());
    let ids = f.get("ids").unwrap();
    assert_eq!(ids.dtype, StDType::I64);
    assert_eq!(f.bytes(ids).len(), 16);
    assert_eq!(
        i64::from_le_bytes(f.bytes(ids)[8..].try_into().unwrap()),
        -9
    );
    assert_eq!(f.header_len() + 8 + 54, f.file_len());

    // Accessor errors name the file and the tensor.
    let e = f.f32_matrix("m", 4, 2).unwrap_err();
    assert!(matches!(e, SafetensorsError::ShapeMismatch { .. }), "{e}");
    assert!(
        e.to_string().contains("a.safetensors") && e.to_string().contains("'m'"),
        "{e}"
    );
    let e = f.f32_values("nope").unwrap_err();
    assert!(matches!(e, SafetensorsError::MissingTensor { .. }), "{e}");
    let e = f.f32_values("ids").unwrap_err();
    assert!(matches!(e, SafetensorsError::WrongType { .. }), "{e}");
    assert_eq!(e.path(), path.as_path());
}

#[test]
fn empty_header_and_zero_size_tensors() {
    let dir = TempDir::new("st-empty");
    let f = SafetensorsFile::open(&dir.write("e.safetensors", &file("{}", &[]))).unwrap();
    assert!(f.tensors().is_empty());
    // Header padded with spaces (as the reference writer aligns it), a [0, 4] tensor.
    let bytes = file(
        r#"{"z":{"dtype":"F32","shape":[0,4],"data_offsets":[0,0]},"o":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}   "#,
        &1f32.to_le_bytes(),
    );
    let f = SafetensorsFile::open(&dir.write("z.safetensors", &bytes)).unwrap();
    assert_eq!(f.f32_values("z").unwrap(), Vec::<f32>::new());
    assert_eq!(f.f32_values("o").unwrap(), [1.0]);
}

fn open_err(dir: &TempDir, name: &str, bytes: &[u8]) -> SafetensorsError {
    let path = dir.write(name, bytes);
    let e = SafetensorsFile::open(&path).expect_err("must be rejected");
    let msg = e.to_string();
    assert!(msg.contains(name), "message does not name the file: {msg}");
    assert!(!msg.contains('\n'), "not one line: {msg}");
    assert_eq!(e.path(), Path::new(&path));
    e
}

#[test]
fn every_truncation_is_an_error() {
    let dir = TempDir::new("st-trunc");
    let full = sample();
    for len in 0..full.len() {
        let e = open_err(&dir, "t.safetensors", &full[..len]);
        let ok = match e {
            SafetensorsError::TooShort { .. } => len < 8,
            SafetensorsError::BadHeaderLength { .. } => len >= 8,
            // Whole header, data short: an offset past the data or an incomplete cover.
            SafetensorsError::BadOffsets { .. } | SafetensorsError::BadHeader { .. } => len >= 8,
            _ => false,
        };
        assert!(ok, "truncated to {len}: unexpected {e}");
    }
    // Bytes after the last tensor are rejected too (the data must be covered exactly).
    let mut long = full.clone();
    long.push(0);
    assert!(matches!(
        open_err(&dir, "long.safetensors", &long),
        SafetensorsError::BadHeader { .. }
    ));
}

#[test]
fn hostile_headers_are_errors() {
    let dir = TempDir::new("st-hostile");
    let four = [0u8; 8];
    let t = |json: &str, data: &[u8]| file(json, data);

    // Header length: huge, past the end, and beyond the 100 MB limit.
    let mut huge = u64::MAX.to_le_bytes().to_vec();
    huge.extend_from_slice(b"{}");
    assert!(matches!(
        open_err(&dir, "huge.safetensors", &huge),
        SafetensorsError::BadHeaderLength { .. }
    ));
    let mut past = 1000u64.to_le_bytes().to_vec();
    past.extend_from_slice(b"{}");
    assert!(matches!(
        open_err(&dir, "past.safetensors", &past),
        SafetensorsError::BadHeaderLength { .. }
    ));
    let mut limit = 200_000_000u64.to_le_bytes().to_vec();
    limit.extend_from_slice(b"{}");
    assert!(matches!(
        open_err(&dir, "limit.safetensors", &limit),
        SafetensorsError::BadHeaderLength { .. }
    ));

    let header_errors: &[(&str, Vec<u8>)] = &[
        ("badjson", t("{\"a\":", &[])),
        ("notobject", t("[1,2]", &[])),
        ("notutf8", file_raw(&[b'{', 0xff, b'}'])),
        ("metadata_nonstring", t(r#"{"__metadata__":{"k":1}}"#, &[])),
        ("metadata_notobject", t(r#"{"__metadata__":[]}"#, &[])),
        (
            "deep",
            t(
                &format!("{}{}", "[".repeat(10_000), "]".repeat(10_000)),
                &[],
            ),
        ),
    ];
    for (name, bytes) in header_errors {
        let e = open_err(&dir, &format!("{name}.safetensors"), bytes);
        assert!(
            matches!(e, SafetensorsError::BadHeader { .. }),
            "{name}: {e}"
        );
    }

    let e = open_err(
        &dir,
        "dtype.safetensors",
        &t(
            r#"{"a":{"dtype":"F12","shape":[1],"data_offsets":[0,4]}}"#,
            &four[..4],
        ),
    );
    assert!(matches!(e, SafetensorsError::UnknownDType { .. }), "{e}");

    let tensor_errors: &[(&str, &str)] = &[
        ("nodtype", r#"{"a":{"shape":[1],"data_offsets":[0,4]}}"#),
        ("noshape", r#"{"a":{"dtype":"F32","data_offsets":[0,4]}}"#),
        ("nooffsets", r#"{"a":{"dtype":"F32","shape":[1]}}"#),
        (
            "negdim",
            r#"{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}"#,
        ),
        (
            "floatdim",
            r#"{"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}}"#,
        ),
        (
            "threeoffsets",
            r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}}"#,
        ),
        (
            "extrafield",
            r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}}"#,
        ),
        ("entrynotobject", r#"{"a":7}"#),
        (
            "overflow",
            r#"{"a":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,4]}}"#,
        ),
    ];
    for (name, json) in tensor_errors {
        let e = open_err(&dir, &format!("{name}.safetensors"), &t(json, &four[..4]));
        assert!(
            matches!(e, SafetensorsError::BadTensor { .. }),
            "{name}: {e}"
        );
    }

    let offset_errors: &[(&str, &str)] = &[
        // end before begin
        (
            "reversed",
            r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}}"#,
        ),
        // past the data
        (
            "outofrange",
            r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}"#,
        ),
        (
            "hugeoffset",
            r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[18446744073709551612,18446744073709551615]}}"#,
        ),
        // size disagrees with the shape
        (
            "shapesize",
            r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#,
        ),
        // two tensors over the same bytes
        (
            "overlap",
            r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#,
        ),
        // a hole between tensors
        (
            "hole",
            r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[2],"data_offsets":[6,8]}}"#,
        ),
    ];
    for (name, json) in offset_errors {
        let e = open_err(&dir, &format!("{name}.safetensors"), &t(json, &four));
        assert!(
            matches!(e, SafetensorsError::BadOffsets { .. }),
            "{name}: {e}"
        );
    }

    // A directory and a missing file.
    let e = SafetensorsFile::open(&dir.0).unwrap_err();
    assert!(matches!(e, SafetensorsError::IsDirectory { .. }), "{e}");
    let e = SafetensorsFile::open(&dir.0.join("missing.safetensors")).unwrap_err();
    assert!(matches!(e, SafetensorsError::Io { .. }), "{e}");
}

fn file_raw(header: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header);
    out
}

/// Hostile bytes after a valid length prefix never panic (a deterministic byte soup).
#[test]
fn random_headers_never_panic() {
    let dir = TempDir::new("st-fuzz");
    let base = sample();
    let mut s = 0x9e37_79b9u32;
    for i in 0..400 {
        let mut bytes = base.clone();
        for _ in 0..1 + i % 4 {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            let at = s as usize % bytes.len();
            bytes[at] = (s >> 8) as u8;
        }
        let path = dir.write("f.safetensors", &bytes);
        if let Ok(f) = SafetensorsFile::open(&path) {
            for t in f.tensors() {
                let _ = f.bytes(t);
                let _ = f.f32_values(&t.name);
            }
        }
    }
}

#[test]
fn real_minilm_file() {
    let path = synaptix_bundle::cache::models_dir().join("all-minilm-l6-v2/model.safetensors");
    if !path.is_file() {
        eprintln!(
            "SKIPPED: {} not found (run scripts/fetch-models.sh all-minilm-l6-v2)",
            path.display()
        );
        return;
    }
    let f = SafetensorsFile::open(&path).expect("real file");
    assert_eq!(f.file_len(), 90_868_376);
    assert_eq!(f.tensors().len(), 104);
    let w = f.get("embeddings.word_embeddings.weight").unwrap();
    assert_eq!((w.dtype, w.shape.clone()), (StDType::F32, vec![30522, 384]));
    let q = f
        .f32_matrix("encoder.layer.5.attention.self.query.weight", 384, 384)
        .unwrap();
    assert!(q.iter().all(|v| v.is_finite()));
    assert_eq!(
        f.get("embeddings.position_ids").unwrap().dtype,
        StDType::I64
    );
    let total: usize = f.tensors().iter().map(|t| t.byte_len()).sum();
    assert_eq!(total as u64 + 8 + f.header_len(), f.file_len());
}
