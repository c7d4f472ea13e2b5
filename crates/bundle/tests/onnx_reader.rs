//! The ONNX reader on small files encoded here by a tiny protobuf writer (every field the reader
//! keeps), on every truncation of a valid file and on hostile input (each must give an error
//! naming the file, never a panic), and on the real Piper voice against the `onnx` package's
//! summary (tests/fixtures/onnx/piper_joe_summary.json) when it is cached.

use std::path::{Path, PathBuf};

use half::f16;
use synaptix_bundle::onnx::{AttrValue, DataType, Dim, OnnxError, OnnxFile, TensorData};

mod common;
use common::TempDir;

// ---- a tiny protobuf writer ----

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A message body, built field by field.
#[derive(Default, Clone)]
struct Msg(Vec<u8>);

impl Msg {
    fn new() -> Msg {
        Msg::default()
    }
    fn key(mut self, field: u32, wire: u8) -> Msg {
        varint(&mut self.0, (u64::from(field) << 3) | u64::from(wire));
        self
    }
    fn int(self, field: u32, v: i64) -> Msg {
        let mut m = self.key(field, 0);
        varint(&mut m.0, v as u64);
        m
    }
    fn bytes(self, field: u32, b: &[u8]) -> Msg {
        let mut m = self.key(field, 2);
        varint(&mut m.0, b.len() as u64);
        m.0.extend_from_slice(b);
        m
    }
    fn str(self, field: u32, s: &str) -> Msg {
        self.bytes(field, s.as_bytes())
    }
    fn msg(self, field: u32, m: &Msg) -> Msg {
        self.bytes(field, &m.0)
    }
    fn f32(self, field: u32, v: f32) -> Msg {
        let mut m = self.key(field, 5);
        m.0.extend_from_slice(&v.to_le_bytes());
        m
    }
    fn packed_f32(self, field: u32, v: &[f32]) -> Msg {
        let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.bytes(field, &b)
    }
    fn packed_f64(self, field: u32, v: &[f64]) -> Msg {
        let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.bytes(field, &b)
    }
    fn packed_int(self, field: u32, v: &[i64]) -> Msg {
        let mut b = Vec::new();
        for &x in v {
            varint(&mut b, x as u64);
        }
        self.bytes(field, &b)
    }
    fn raw(mut self, b: &[u8]) -> Msg {
        self.0.extend_from_slice(b);
        self
    }
}

fn dim_value(v: i64) -> Msg {
    Msg::new().int(1, v)
}

fn dim_param(p: &str) -> Msg {
    Msg::new().str(2, p)
}

fn value_info(name: &str, elem: i32, dims: &[Msg]) -> Msg {
    let mut shape = Msg::new();
    for d in dims {
        shape = shape.msg(1, d);
    }
    let tensor_type = Msg::new().int(1, elem.into()).msg(2, &shape);
    Msg::new()
        .str(1, name)
        .msg(2, &Msg::new().msg(1, &tensor_type))
        .str(3, "a doc string, skipped")
}

fn tensor(name: &str, dtype: i32, dims: &[i64]) -> Msg {
    let mut t = Msg::new();
    for &d in dims {
        t = t.int(1, d); // unpacked dims
    }
    t.int(2, dtype.into()).str(8, name)
}

fn node(op: &str, name: &str, inputs: &[&str], outputs: &[&str]) -> Msg {
    let mut n = Msg::new();
    for i in inputs {
        n = n.str(1, i);
    }
    for o in outputs {
        n = n.str(2, o);
    }
    n.str(3, name).str(4, op)
}

fn attr(name: &str, ty: i64) -> Msg {
    Msg::new().str(1, name).int(20, ty)
}

fn graph_with(name: &str, nodes: &[Msg]) -> Msg {
    let mut g = Msg::new().str(2, name);
    for n in nodes {
        g = g.msg(1, n);
    }
    g
}

/// A model: the graph is written last, so that every proper prefix lacks it.
fn model(graph: &Msg) -> Vec<u8> {
    Msg::new()
        .int(1, 8)
        .str(2, "synaptix-test")
        .str(3, "0.1")
        .msg(8, &Msg::new().str(1, "").int(2, 15))
        .msg(8, &Msg::new().str(1, "com.microsoft").int(2, 1))
        .int(99, 12345) // an unknown field
        .msg(7, graph)
        .0
}

const W: [f32; 6] = [1.0, -2.0, 0.5, 3.25, -0.125, 7.0];

fn sample_graph() -> Msg {
    let raw: Vec<u8> = W.iter().flat_map(|x| x.to_le_bytes()).collect();
    let half: Vec<i64> = [1.5f32, -0.25]
        .iter()
        .map(|&x| i64::from(f16::from_f32(x).to_bits()))
        .collect();
    let inits = [
        tensor("w_raw", 1, &[2, 3]).bytes(9, &raw),
        tensor("w_float", 1, &[3]).packed_f32(4, &[0.5, 1.5, -2.5]),
        tensor("w_float_unpacked", 1, &[2]).f32(4, 4.0).f32(4, -4.0),
        tensor("i64", 7, &[3]).packed_int(7, &[-1, 0, 1 << 40]),
        tensor("i32", 6, &[2]).packed_int(5, &[-7, 9]),
        tensor("h16", 10, &[2]).packed_int(5, &half),
        tensor("h16_raw", 10, &[2]).bytes(
            9,
            &[
                f16::from_f32(2.0).to_le_bytes(),
                f16::from_f32(-3.0).to_le_bytes(),
            ]
            .concat(),
        ),
        tensor("d64", 11, &[2]).packed_f64(10, &[0.25, -8.0]),
        tensor("d64_raw", 11, &[1]).bytes(9, &1.75f64.to_le_bytes()),
        tensor("scalar", 1, &[]).packed_f32(4, &[42.0]),
        tensor("empty", 1, &[0, 4]),
    ];
    let const_tensor = tensor("", 1, &[2]).packed_f32(4, &[9.0, 10.0]);
    let constant =
        node("Constant", "c0", &[], &["c_out"]).msg(5, &attr("value", 4).msg(5, &const_tensor));
    let all_attrs = node("Conv", "conv0", &["x", "w_raw"], &["y"])
        .str(7, "")
        .msg(5, &attr("alpha", 1).f32(2, 0.2))
        .msg(5, &attr("axis", 2).int(3, -1))
        .msg(5, &attr("mode", 3).str(4, "constant"))
        .msg(
            5,
            &attr("t", 4).msg(5, &tensor("", 7, &[1]).packed_int(7, &[5])),
        )
        .msg(5, &attr("fs", 6).packed_f32(7, &[1.0, 2.0]))
        .msg(5, &attr("is", 7).packed_int(8, &[3, -4, 5]))
        .msg(5, &attr("is_unpacked", 7).int(8, 6).int(8, 7))
        .msg(5, &attr("ss", 8).str(9, "a").str(9, "bc"))
        .msg(5, &Msg::new().str(1, "untyped").int(3, 11)) // IR v1: no type field
        .str(6, "a doc string, skipped");
    let then_g = graph_with("then", &[node("Identity", "inner", &["x"], &["t_out"])])
        .msg(12, &value_info("t_out", 1, &[dim_param("n")]));
    let else_g = graph_with("else", &[node("Neg", "inner2", &["x"], &["e_out"])]);
    let if_node = node("If", "if0", &["cond"], &["z"])
        .msg(5, &attr("then_branch", 5).msg(6, &then_g))
        .msg(5, &attr("else_branch", 5).msg(6, &else_g));
    let custom = node("FusedThing", "", &["y"], &["q"]).str(7, "com.microsoft");
    let mut g = graph_with("main", &[constant, all_attrs, if_node, custom]);
    for t in &inits {
        g = g.msg(5, t);
    }
    g.msg(
        11,
        &value_info("x", 1, &[dim_param("batch"), dim_value(3), Msg::new()]),
    )
    .msg(11, &value_info("cond", 9, &[]))
    .msg(12, &value_info("z", 1, &[dim_param("batch"), dim_value(3)]))
    .msg(13, &value_info("y", 1, &[])) // value_info: skipped
}

fn sample() -> Vec<u8> {
    model(&sample_graph())
}

fn open_bytes(dir: &TempDir, name: &str, bytes: &[u8]) -> Result<OnnxFile, OnnxError> {
    OnnxFile::open(dir.write(name, bytes))
}

fn expect_err(dir: &TempDir, name: &str, bytes: &[u8]) -> OnnxError {
    let e = open_bytes(dir, name, bytes).expect_err("must be an error");
    assert!(e.to_string().contains(name), "error names the file: {e}");
    e
}

#[test]
fn reads_every_field() {
    let dir = TempDir::new("onnx-full");
    let f = open_bytes(&dir, "m.onnx", &sample()).unwrap();
    assert_eq!(f.ir_version, 8);
    assert_eq!(f.producer_name, "synaptix-test");
    assert_eq!(f.producer_version, "0.1");
    assert_eq!(f.opset_imports.len(), 2);
    assert_eq!(f.opset_imports[1].domain, "com.microsoft");
    assert_eq!(f.default_opset(), Some(15));
    let g = &f.graph;
    assert_eq!(g.name, "main");
    assert_eq!(g.inputs.len(), 2);
    assert_eq!(g.inputs[0].name, "x");
    assert_eq!(g.inputs[0].elem_type, Some(DataType::FLOAT));
    assert_eq!(
        g.inputs[0].shape,
        Some(vec![
            Dim::Param("batch".into()),
            Dim::Value(3),
            Dim::Unknown
        ])
    );
    assert_eq!(g.inputs[1].elem_type, Some(DataType::BOOL));
    assert_eq!(g.inputs[1].shape, Some(vec![]));
    assert_eq!(g.outputs.len(), 1);
    assert_eq!(g.outputs[0].name, "z");

    // Initializers.
    assert_eq!(g.initializers.len(), 11);
    let w = f.initializer("w_raw").unwrap();
    assert_eq!(w.dims, vec![2, 3]);
    assert_eq!(w.data_type, DataType::FLOAT);
    assert_eq!(w.elements(), 6);
    assert_eq!(w.byte_len(), 24);
    let raw = f.raw_data(w).unwrap();
    assert_eq!(raw.len(), 24);
    // Borrowed from the map: the bytes sit inside the file at the recorded range.
    let TensorData::Raw(r) = &w.data else {
        panic!("raw")
    };
    assert_eq!(
        &std::fs::read(dir.0.join("m.onnx")).unwrap()[r.clone()],
        raw
    );
    assert_eq!(f.f32_values("w_raw").unwrap(), W);
    assert_eq!(f.f32_values("w_float").unwrap(), [0.5, 1.5, -2.5]);
    assert_eq!(f.f32_values("w_float_unpacked").unwrap(), [4.0, -4.0]);
    assert_eq!(f.f32_values("h16").unwrap(), [1.5, -0.25]);
    assert_eq!(f.f32_values("h16_raw").unwrap(), [2.0, -3.0]);
    assert_eq!(f.f32_values("d64").unwrap(), [0.25, -8.0]);
    assert_eq!(f.f32_values("d64_raw").unwrap(), [1.75]);
    assert_eq!(f.f32_values("scalar").unwrap(), [42.0]);
    assert!(f.initializer("scalar").unwrap().dims.is_empty());
    assert_eq!(f.f32_values("empty").unwrap(), Vec::<f32>::new());
    assert_eq!(
        f.initializer("i64").unwrap().data,
        TensorData::Int64(vec![-1, 0, 1 << 40])
    );
    assert_eq!(
        f.initializer("i32").unwrap().data,
        TensorData::Int32(vec![-7, 9])
    );
    assert!(matches!(
        f.f32_values("i64"),
        Err(OnnxError::NotFloat { .. })
    ));
    assert!(matches!(
        f.f32_values("nope"),
        Err(OnnxError::NotFound { .. })
    ));

    // Nodes and attributes.
    assert_eq!(g.nodes.len(), 4);
    assert_eq!(f.f32_values("c_out").unwrap(), [9.0, 10.0]);
    assert_eq!(f.constant("c_out").unwrap().dims, vec![2]);
    assert!(f.constant("y").is_none());
    let conv = &g.nodes[1];
    assert_eq!(
        (
            conv.name.as_str(),
            conv.op_type.as_str(),
            conv.domain.as_str()
        ),
        ("conv0", "Conv", "")
    );
    assert_eq!(conv.inputs, ["x", "w_raw"]);
    assert_eq!(conv.outputs, ["y"]);
    assert_eq!(conv.attribute("alpha"), Some(&AttrValue::Float(0.2)));
    assert_eq!(conv.attribute("axis"), Some(&AttrValue::Int(-1)));
    assert_eq!(
        conv.attribute("mode"),
        Some(&AttrValue::String("constant".into()))
    );
    let Some(AttrValue::Tensor(t)) = conv.attribute("t") else {
        panic!("tensor attribute")
    };
    assert_eq!(t.data, TensorData::Int64(vec![5]));
    assert_eq!(
        conv.attribute("fs"),
        Some(&AttrValue::Floats(vec![1.0, 2.0]))
    );
    assert_eq!(conv.attribute("is"), Some(&AttrValue::Ints(vec![3, -4, 5])));
    assert_eq!(
        conv.attribute("is_unpacked"),
        Some(&AttrValue::Ints(vec![6, 7]))
    );
    assert_eq!(
        conv.attribute("ss"),
        Some(&AttrValue::Strings(vec!["a".into(), "bc".into()]))
    );
    assert_eq!(conv.attribute("untyped"), Some(&AttrValue::Int(11)));
    let iff = &g.nodes[2];
    let Some(AttrValue::Graph(then_g)) = iff.attribute("then_branch") else {
        panic!("graph attribute")
    };
    assert_eq!(then_g.name, "then");
    assert_eq!(then_g.nodes[0].op_type, "Identity");
    assert_eq!(then_g.outputs[0].shape, Some(vec![Dim::Param("n".into())]));
    let Some(AttrValue::Graph(else_g)) = iff.attribute("else_branch") else {
        panic!("graph attribute")
    };
    assert_eq!(else_g.nodes[0].op_type, "Neg");
    assert_eq!(g.nodes[3].domain, "com.microsoft");
    assert_eq!(DataType::FLOAT16.name(), "FLOAT16");
    assert_eq!(DataType(99).name(), "UNKNOWN");
}

#[test]
fn every_truncation_is_an_error() {
    let dir = TempDir::new("onnx-trunc");
    let bytes = sample();
    for n in 0..bytes.len() {
        let r = open_bytes(&dir, "t.onnx", &bytes[..n]);
        assert!(
            r.is_err(),
            "prefix of {n} of {} bytes was accepted",
            bytes.len()
        );
    }
}

#[test]
fn hostile_input_is_an_error() {
    let dir = TempDir::new("onnx-hostile");
    let good_graph = graph_with("g", &[node("Relu", "r", &["x"], &["y"])]);

    // A length far beyond the file.
    let mut b = Msg::new().int(1, 8).key(7, 2).0;
    varint(&mut b, u64::MAX >> 1);
    let e = expect_err(&dir, "len.onnx", &b);
    assert!(matches!(e, OnnxError::Truncated { offset: 3, .. }), "{e}");

    // A nested length beyond its parent (but within the file).
    let inner = Msg::new().key(2, 2).raw(&[50]).raw(b"abc");
    let mut bytes = model(&inner);
    bytes.extend_from_slice(&[0u8; 60]);
    let e = expect_err(&dir, "nested.onnx", &bytes);
    assert!(matches!(e, OnnxError::Truncated { .. }), "{e}");

    // An eleven-byte varint, and a ten-byte one that overflows.
    expect_err(
        &dir,
        "varint.onnx",
        &Msg::new().key(1, 0).raw(&[0xff; 10]).raw(&[1]).0,
    );
    expect_err(
        &dir,
        "varint2.onnx",
        &Msg::new().key(1, 0).raw(&[0xff; 9]).raw(&[2]).0,
    );

    // Wrong wire types for known fields.
    let e = expect_err(
        &dir,
        "wire.onnx",
        &Msg::new().str(1, "8").msg(7, &good_graph).0,
    );
    assert!(matches!(e, OnnxError::WireType { field: 1, .. }), "{e}");
    let g = graph_with("g", &[node("Relu", "r", &[], &[]).int(4, 3)]);
    expect_err(&dir, "wire2.onnx", &model(&g));
    let g = good_graph.clone().msg(5, &tensor("t", 1, &[1]).int(4, 3));
    expect_err(&dir, "wire3.onnx", &model(&g));
    let n = node("Relu", "r", &[], &[]).msg(5, &attr("a", 1).int(2, 3));
    expect_err(&dir, "wire4.onnx", &model(&graph_with("g", &[n])));
    // Groups and field number 0.
    expect_err(
        &dir,
        "group.onnx",
        &Msg::new().key(5, 3).msg(7, &good_graph).0,
    );
    expect_err(
        &dir,
        "field0.onnx",
        &Msg::new().int(0, 1).msg(7, &good_graph).0,
    );

    // Bad UTF-8 in a node name, a graph name, a producer.
    let n = Msg::new().bytes(3, &[0x66, 0xff, 0x80]).str(4, "Relu");
    let e = expect_err(&dir, "utf8.onnx", &model(&graph_with("g", &[n])));
    assert!(matches!(e, OnnxError::Utf8 { .. }), "{e}");
    expect_err(&dir, "utf8b.onnx", &model(&Msg::new().bytes(2, &[0xc3])));
    let b = Msg::new()
        .int(1, 8)
        .bytes(2, &[0xed, 0xa0, 0x80])
        .msg(7, &good_graph)
        .0;
    expect_err(&dir, "utf8c.onnx", &b);

    // Huge counts: a packed field claiming more than is there, dims whose product overflows,
    // dims with no data, data that does not match the dims.
    let t = Msg::new()
        .key(1, 2)
        .raw(&[0xff, 0xff, 0xff, 0x7f])
        .raw(&[1, 2]);
    expect_err(&dir, "packed.onnx", &model(&good_graph.clone().msg(5, &t)));
    let t = tensor("big", 1, &[1 << 40, 1 << 40, 1 << 40]).packed_f32(4, &[1.0]);
    expect_err(
        &dir,
        "overflow.onnx",
        &model(&good_graph.clone().msg(5, &t)),
    );
    let t = tensor("nodata", 1, &[1 << 40]);
    expect_err(&dir, "nodata.onnx", &model(&good_graph.clone().msg(5, &t)));
    let t = tensor("short", 1, &[3]).bytes(9, &[0; 8]);
    expect_err(&dir, "short.onnx", &model(&good_graph.clone().msg(5, &t)));
    let t = tensor("count", 1, &[3]).packed_f32(4, &[1.0, 2.0]);
    expect_err(&dir, "count.onnx", &model(&good_graph.clone().msg(5, &t)));
    let t = tensor("neg", 1, &[-2]).packed_f32(4, &[]);
    expect_err(&dir, "neg.onnx", &model(&good_graph.clone().msg(5, &t)));
    let t = tensor("wrongfield", 7, &[1]).packed_f32(4, &[1.0]);
    expect_err(
        &dir,
        "wrongfield.onnx",
        &model(&good_graph.clone().msg(5, &t)),
    );
    let t = tensor("packed3", 1, &[1]).bytes(4, &[0; 3]);
    expect_err(&dir, "packed3.onnx", &model(&good_graph.clone().msg(5, &t)));

    // External data.
    let t = tensor("ext", 1, &[4])
        .msg(13, &Msg::new().str(1, "location").str(2, "w.bin"))
        .int(14, 1);
    let e = expect_err(&dir, "ext.onnx", &model(&good_graph.clone().msg(5, &t)));
    assert!(
        matches!(&e, OnnxError::ExternalData { name, .. } if name == "ext"),
        "{e}"
    );
    assert!(e.to_string().contains("external"), "{e}");

    // No graph, and a zero IR version.
    expect_err(&dir, "nograph.onnx", &Msg::new().int(1, 8).0);
    expect_err(&dir, "ir0.onnx", &Msg::new().msg(7, &good_graph).0);
    // An attribute with an unknown type, or a type whose value is missing.
    let n = node("Relu", "r", &[], &[]).msg(5, &attr("a", 42));
    expect_err(&dir, "attrtype.onnx", &model(&graph_with("g", &[n])));
    let n = node("Relu", "r", &[], &[]).msg(5, &attr("a", 1));
    expect_err(&dir, "attrmissing.onnx", &model(&graph_with("g", &[n])));
    // A missing file.
    assert!(matches!(
        OnnxFile::open(dir.0.join("absent.onnx")),
        Err(OnnxError::Io { .. })
    ));
}

/// A graph holding an If node whose then-branch nests `levels` further graphs.
fn nested(levels: usize) -> Msg {
    let mut g = graph_with("leaf", &[node("Relu", "r", &["x"], &["y"])]);
    for _ in 0..levels {
        let n = node("If", "if", &["c"], &["y"]).msg(5, &attr("then_branch", 5).msg(6, &g));
        g = graph_with("g", &[n]);
    }
    g
}

#[test]
fn nesting_is_capped() {
    let dir = TempDir::new("onnx-deep");
    // Each If level is three messages deep (node, attribute, graph).
    let f = open_bytes(&dir, "ok.onnx", &model(&nested(15))).unwrap();
    let mut g = &f.graph;
    let mut depth = 0;
    while let Some(AttrValue::Graph(inner)) = g.nodes[0].attribute("then_branch") {
        g = inner;
        depth += 1;
    }
    assert_eq!((depth, g.name.as_str()), (15, "leaf"));
    let e = expect_err(&dir, "deep.onnx", &model(&nested(40)));
    assert!(matches!(e, OnnxError::TooDeep { .. }), "{e}");
    // Far deeper than any stack would allow, if the cap were missing.
    let e = expect_err(&dir, "deeper.onnx", &model(&nested(5000)));
    assert!(matches!(e, OnnxError::TooDeep { .. }), "{e}");
}

#[test]
fn random_corruptions_never_panic() {
    let dir = TempDir::new("onnx-fuzz");
    let good = sample();
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for i in 0..400 {
        let mut b = good.clone();
        for _ in 0..1 + next() % 4 {
            let at = (next() % b.len() as u64) as usize;
            b[at] = next() as u8;
        }
        // Either outcome is fine; reaching here without a panic is the point.
        let _ = open_bytes(&dir, &format!("f{}.onnx", i % 8), &b);
    }
}

fn piper_joe() -> Option<PathBuf> {
    let p =
        synaptix_bundle::cache::models_dir().join("piper-en-us-joe-medium/en_US-joe-medium.onnx");
    if p.is_file() {
        Some(p)
    } else {
        eprintln!(
            "skipping: {} not fetched (scripts/fetch-models.sh piper-en-us-joe-medium)",
            p.display()
        );
        None
    }
}

fn fixture(name: &str) -> serde_json::Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/onnx")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn dims_json(shape: &Option<Vec<Dim>>) -> serde_json::Value {
    shape
        .iter()
        .flatten()
        .map(|d| match d {
            Dim::Value(v) => serde_json::json!(v),
            Dim::Param(p) => serde_json::json!(p),
            Dim::Unknown => serde_json::Value::Null,
        })
        .collect()
}

#[test]
fn real_piper_voice_matches_the_onnx_package() {
    let Some(path) = piper_joe() else { return };
    let want = fixture("piper_joe_summary.json");
    let f = OnnxFile::open(&path).unwrap();
    assert_eq!(f.ir_version, want["ir_version"].as_i64().unwrap());
    assert_eq!(f.producer_name, want["producer_name"]);
    assert_eq!(f.producer_version, want["producer_version"]);
    assert_eq!(f.graph.name, want["graph_name"]);
    let opsets: Vec<_> = f
        .opset_imports
        .iter()
        .map(|o| serde_json::json!({"domain": o.domain, "version": o.version}))
        .collect();
    assert_eq!(serde_json::json!(opsets), want["opsets"]);
    for (got, want) in [
        (&f.graph.inputs, &want["inputs"]),
        (&f.graph.outputs, &want["outputs"]),
    ] {
        let got: Vec<_> = got
            .iter()
            .map(|v| {
                serde_json::json!({
                    "name": v.name,
                    "elem_type": v.elem_type.map(|t| t.name()),
                    "shape": dims_json(&v.shape),
                })
            })
            .collect();
        assert_eq!(&serde_json::json!(got), want);
    }
    assert_eq!(
        f.graph.nodes.len() as u64,
        want["n_nodes"].as_u64().unwrap()
    );
    let mut hist = std::collections::BTreeMap::<&str, u64>::new();
    for n in &f.graph.nodes {
        *hist.entry(n.op_type.as_str()).or_default() += 1;
    }
    assert_eq!(serde_json::json!(hist), want["op_types"]);
    let inits = &f.graph.initializers;
    assert_eq!(inits.len() as u64, want["n_initializers"].as_u64().unwrap());
    let mut types = std::collections::BTreeMap::<&str, u64>::new();
    for t in inits {
        *types.entry(t.data_type.name()).or_default() += 1;
    }
    assert_eq!(serde_json::json!(types), want["initializer_types"]);
    let raw: u64 = inits
        .iter()
        .filter_map(|t| f.raw_data(t))
        .map(|b| b.len() as u64)
        .sum();
    assert_eq!(raw, want["initializer_raw_bytes"].as_u64().unwrap());
    for s in want["initializers"].as_array().unwrap() {
        let t = &inits[s["index"].as_u64().unwrap() as usize];
        assert_eq!(t.name, s["name"]);
        assert_eq!(t.data_type.name(), s["data_type"]);
        assert_eq!(serde_json::json!(t.dims), s["dims"]);
        assert_eq!(t.byte_len(), s["raw_bytes"].as_u64().unwrap());
        if let Some(sum) = s["sum_f64"].as_f64() {
            let v = f.f32_values(&t.name).unwrap();
            assert_eq!(v.len() as u64, t.elements());
            let got: f64 = v.iter().map(|&x| f64::from(x)).sum();
            assert!(
                (got - sum).abs() <= 1e-9 * (1.0 + sum.abs()),
                "{}: {got} vs {sum}",
                t.name
            );
            // As f32: serde_json's f64 parsing may differ in the last bit, f32 rounding absorbs it.
            let first: Vec<f32> = v.iter().take(4).copied().collect();
            let want_first: Vec<f32> = s["first4"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect();
            assert_eq!(first, want_first, "{}", t.name);
        }
        if let Some(sum) = s["sum_i64"].as_i64() {
            let b = f.raw_data(t).unwrap();
            let got: i64 = match t.data_type {
                DataType::INT64 => b
                    .chunks_exact(8)
                    .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                    .sum(),
                DataType::INT32 => b
                    .chunks_exact(4)
                    .map(|c| i64::from(i32::from_le_bytes(c.try_into().unwrap())))
                    .sum(),
                other => panic!("{}: {other}", t.name),
            };
            assert_eq!(got, sum, "{}", t.name);
        }
    }
}
