//! Bit-exactness against the references under tests/fixtures/quant/:
//! - dequantization against gguf-py (scripts/reference/make_quant_fixtures.py) and ggml's
//!   `to_float`;
//! - activation quantization, `vec_dot`, `matmul` and `matmul_quantized` against ggml's portable
//!   CPU backend (scripts/reference/make_vecdot_goldens.sh), on every kernel path of this CPU.

use std::path::PathBuf;

use serde_json::Value;
use synaptix_core::DType;
use synaptix_kernels_cpu::kernel_paths::{
    matmul_on, matmul_quantized_on, quantize_acts_on, supported, vec_dot_on,
};
use synaptix_kernels_cpu::{dequantize, QuantizedActs, WeightView};

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/quant")
}

fn read(name: &str) -> Vec<u8> {
    let p = fixture_dir().join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn words(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    words(bytes).into_iter().map(f32::from_bits).collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn index() -> Value {
    serde_json::from_slice(&read("index.json")).expect("index.json parses")
}

fn dtype_of(e: &Value) -> DType {
    let name = e["dtype"].as_str().unwrap();
    DType::from_name(name).unwrap_or_else(|| panic!("unknown dtype {name}"))
}

/// First mismatching positions of two bit patterns, for messages.
fn mismatches(got: &[u32], want: &[u32]) -> Vec<String> {
    got.iter()
        .zip(want)
        .enumerate()
        .filter(|(_, (g, w))| g != w)
        .take(5)
        .map(|(i, (g, w))| {
            format!(
                "[{i}] {} ({g:#010x}) vs {} ({w:#010x})",
                f32::from_bits(*g),
                f32::from_bits(*w)
            )
        })
        .collect()
}

#[test]
fn dequantize_is_bit_exact_with_gguf_py_and_ggml() {
    let index = index();
    let entries = index["weights"].as_array().expect("weights list");
    let mut seen = Vec::new();
    for e in entries {
        let dtype = dtype_of(e);
        let n = e["n"].as_u64().unwrap() as usize;
        let src = read(e["bin"].as_str().unwrap());
        let want = words(&read(e["f32"].as_str().unwrap()));
        let ggml = words(&read(&format!("{}.ggml.f32", e["dtype"].as_str().unwrap())));
        assert_eq!(want.len(), n, "{dtype}");
        assert_eq!(ggml, want, "{dtype}: ggml's to_float and gguf-py disagree");
        let mut got = vec![0f32; n];
        dequantize(dtype, &src, &mut got).unwrap();
        let bad = mismatches(&bits(&got), &want);
        assert!(bad.is_empty(), "{dtype}: {bad:?}");
        seen.push(dtype);
    }
    assert_eq!(seen.len(), 13, "one fixture per weight type: {seen:?}");
}

/// gguf-py's Q8_0 quantizer is ggml's `quantize_row_q8_0_ref` (round half away from zero).
#[test]
fn q8_0_activation_quantization_matches_gguf_py() {
    let index = index();
    for e in index["acts"].as_array().unwrap() {
        assert_eq!(e["dtype"].as_str(), Some("q8_0"));
        let x = f32s(&read(e["x"].as_str().unwrap()));
        let want = read(e["bin_ref"].as_str().unwrap());
        for path in supported() {
            let got = quantize_acts_on(path, DType::Q8_0, &x).unwrap();
            assert_eq!(got.to_ggml_bytes(), want, "{path}");
        }
    }
}

/// One dot-product case of the goldens.
struct Case {
    dtype: DType,
    n: usize,
    k: usize,
    m: usize,
    w: Vec<u8>,
    /// m rows of k activations.
    x: Vec<f32>,
    /// ggml's activation rows, concatenated.
    acts: Vec<u8>,
    /// m × n results.
    out: Vec<u32>,
}

fn cases() -> Vec<Case> {
    let index = index();
    let xcols = index["dot_x"]["cols"].as_u64().unwrap() as usize;
    let xall = f32s(&read(index["dot_x"]["file"].as_str().unwrap()));
    let cases: Vec<Case> = index["dots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let (n, k, m) = (
                e["rows"].as_u64().unwrap() as usize,
                e["cols"].as_u64().unwrap() as usize,
                e["m"].as_u64().unwrap() as usize,
            );
            let x = (0..m)
                .flat_map(|i| xall[i * xcols..i * xcols + k].iter().copied())
                .collect();
            Case {
                dtype: dtype_of(e),
                n,
                k,
                m,
                w: read(e["w"].as_str().unwrap()),
                x,
                acts: read(e["acts"].as_str().unwrap()),
                out: words(&read(e["out"].as_str().unwrap())),
            }
        })
        .collect();
    assert_eq!(cases.len(), 13, "one dot case per weight type");
    cases
}

impl Case {
    fn view(&self) -> WeightView<'_> {
        WeightView {
            dtype: self.dtype,
            data: &self.w,
            rows: self.n,
            cols: self.k,
        }
    }

    fn row(&self, j: usize) -> &[u8] {
        let rb = self.w.len() / self.n;
        &self.w[j * rb..(j + 1) * rb]
    }

    fn quantize(&self, path: &str) -> Vec<QuantizedActs> {
        self.x
            .chunks(self.k)
            .map(|r| quantize_acts_on(path, self.dtype, r).unwrap())
            .collect()
    }
}

#[test]
fn activation_quantization_is_bit_exact_with_ggml() {
    for c in cases() {
        for path in supported() {
            let got: Vec<u8> = c
                .quantize(path)
                .iter()
                .flat_map(|a| a.to_ggml_bytes())
                .collect();
            assert_eq!(got.len(), c.acts.len(), "{} {path}", c.dtype);
            let first = got.iter().zip(&c.acts).position(|(g, w)| g != w);
            assert!(
                first.is_none(),
                "{} {path}: activation bytes differ from byte {first:?}",
                c.dtype
            );
        }
    }
}

#[test]
fn vec_dot_is_bit_exact_with_ggml() {
    for c in cases() {
        for path in supported() {
            let acts = c.quantize(path);
            let got: Vec<f32> = (0..c.m)
                .flat_map(|i| (0..c.n).map(move |j| (i, j)))
                .map(|(i, j)| vec_dot_on(path, c.dtype, c.row(j), &acts[i]).unwrap())
                .collect();
            let bad = mismatches(&bits(&got), &c.out);
            assert!(bad.is_empty(), "{} {path}: {bad:?}", c.dtype);
        }
    }
}

#[test]
fn matmul_is_bit_exact_with_ggml() {
    for c in cases() {
        for path in supported() {
            // All m rows at once, then each row alone (the m = 1 kernels).
            let mut y = vec![f32::NAN; c.m * c.n];
            matmul_on(path, c.view(), &c.x, c.m, &mut y).unwrap();
            let bad = mismatches(&bits(&y), &c.out);
            assert!(bad.is_empty(), "{} {path} m={}: {bad:?}", c.dtype, c.m);

            let acts = c.quantize(path);
            let mut yq = vec![f32::NAN; c.m * c.n];
            matmul_quantized_on(path, c.view(), &acts, &mut yq).unwrap();
            assert_eq!(bits(&yq), c.out, "{} {path} matmul_quantized", c.dtype);

            for i in 0..c.m {
                let mut y1 = vec![f32::NAN; c.n];
                matmul_on(path, c.view(), &c.x[i * c.k..(i + 1) * c.k], 1, &mut y1).unwrap();
                let bad = mismatches(&bits(&y1), &c.out[i * c.n..(i + 1) * c.n]);
                assert!(bad.is_empty(), "{} {path} row {i}: {bad:?}", c.dtype);
            }
        }
    }
}

/// A matrix large enough for the parallel split (the fixture rows repeated): every output is
/// still its golden value, whatever the thread count.
#[test]
fn parallel_matmul_is_bit_exact_with_ggml() {
    const REPEAT: usize = 23;
    for threads in [2, 3] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        for c in cases() {
            let w: Vec<u8> = (0..REPEAT).flat_map(|_| c.w.iter().copied()).collect();
            let n = c.n * REPEAT;
            let view = WeightView {
                dtype: c.dtype,
                data: &w,
                rows: n,
                cols: c.k,
            };
            let want: Vec<u32> = (0..c.m)
                .flat_map(|i| (0..n).map(move |j| (i, j % c.n)))
                .map(|(i, j)| c.out[i * c.n + j])
                .collect();
            for path in supported() {
                for m in [1, c.m] {
                    let mut y = vec![f32::NAN; m * n];
                    pool.install(|| matmul_on(path, view, &c.x[..m * c.k], m, &mut y))
                        .unwrap();
                    let bad = mismatches(&bits(&y), &want[..m * n]);
                    assert!(
                        bad.is_empty(),
                        "{} {path} m={m} threads={threads}: {bad:?}",
                        c.dtype
                    );
                }
            }
        }
    }
}

/// MXFP8 (synaptix's own type) against ml_dtypes' E4M3 / E8M0
/// (scripts/reference/make_mxfp8_goldens.py): the quantizer's bytes, the decoded values, and dot
/// products on every kernel path against an f64 dot of the decoded values.
#[test]
fn mxfp8_matches_ml_dtypes() {
    let x = f32s(&read("mxfp8.x.f32"));
    let want_bytes = read("mxfp8.bin");
    let want_values = f32s(&read("mxfp8.f32"));
    let mut got = Vec::new();
    synaptix_kernels_cpu::quantize_weights(DType::MXFP8, &x, &mut got).unwrap();
    assert_eq!(got.len(), want_bytes.len());
    let first_diff = got.iter().zip(&want_bytes).position(|(a, b)| a != b);
    assert_eq!(
        first_diff,
        None,
        "byte {first_diff:?} (block {:?}) differs from ml_dtypes'",
        first_diff.map(|i| i / 33)
    );
    let mut values = vec![0f32; x.len()];
    dequantize(DType::MXFP8, &want_bytes, &mut values).unwrap();
    for (i, (g, w)) in values.iter().zip(&want_values).enumerate() {
        assert!(
            g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
            "value {i}: {g} vs ml_dtypes' {w}"
        );
    }
    // Dots over the finite blocks with modest inputs, four blocks a row.
    let blocks: Vec<usize> = (0..x.len() / 32)
        .filter(|&b| {
            want_values[b * 32..(b + 1) * 32]
                .iter()
                .all(|v| v.is_finite())
        })
        .filter(|&b| x[b * 32..(b + 1) * 32].iter().all(|v| v.abs() < 1e6))
        .collect();
    check_block_dots(DType::MXFP8, &want_bytes, &want_values, &blocks, 4);
}

/// NVFP4 (synaptix's own type) against ml_dtypes' E2M1 / E4M3
/// (scripts/reference/make_nvfp4_goldens.py): the quantizer's bytes for the whole tensor, the
/// decoded values, and dot products on every kernel path against an f64 dot of the decoded values.
#[test]
fn nvfp4_matches_ml_dtypes() {
    let x = f32s(&read("nvfp4.x.f32"));
    let want_bytes = read("nvfp4.bin");
    let want_values = f32s(&read("nvfp4.f32"));
    let mut got = Vec::new();
    synaptix_kernels_cpu::quantize_weights(DType::NVFP4, &x, &mut got).unwrap();
    assert_eq!(got.len(), want_bytes.len());
    let first_diff = got.iter().zip(&want_bytes).position(|(a, b)| a != b);
    assert_eq!(
        first_diff,
        None,
        "byte {first_diff:?} (block {:?}) differs from ml_dtypes'",
        first_diff.map(|i| i / 40)
    );
    // The same bytes from parts of the tensor given the whole tensor's scale.
    let scale = synaptix_kernels_cpu::nvfp4_tensor_scale(synaptix_kernels_cpu::finite_amax(&x));
    let mut parts = Vec::new();
    for part in x.chunks(128) {
        synaptix_kernels_cpu::quantize_nvfp4_with_scale(part, scale, &mut parts).unwrap();
    }
    assert_eq!(parts, want_bytes);
    let mut values = vec![0f32; x.len()];
    dequantize(DType::NVFP4, &want_bytes, &mut values).unwrap();
    for (i, (g, w)) in values.iter().zip(&want_values).enumerate() {
        assert!(
            g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
            "value {i}: {g} vs ml_dtypes' {w}"
        );
    }
    let blocks: Vec<usize> = (0..x.len() / 64)
        .filter(|&b| {
            want_values[b * 64..(b + 1) * 64]
                .iter()
                .all(|v| v.is_finite())
        })
        .collect();
    assert!(blocks.len() >= 4, "{blocks:?}");
    check_block_dots(DType::NVFP4, &want_bytes, &want_values, &blocks, 2);
}

/// Dot products of rows made of `per_row` of the given blocks (`bytes` and their decoded
/// `values`) with a fixed activation row, on every kernel path, against an f64 dot of the decoded
/// values (within 1e-6 of the products' magnitudes).
fn check_block_dots(dtype: DType, bytes: &[u8], values: &[f32], blocks: &[usize], per_row: usize) {
    let (bb, bl) = (dtype.block_bytes(), dtype.block_len());
    let acts_x: Vec<f32> = (0..bl * per_row)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
        .collect();
    for path in supported() {
        for rows in blocks.windows(per_row).step_by(per_row.max(2) / 2) {
            let w: Vec<u8> = rows
                .iter()
                .flat_map(|&b| bytes[b * bb..(b + 1) * bb].to_vec())
                .collect();
            let vals: Vec<f32> = rows
                .iter()
                .flat_map(|&b| values[b * bl..(b + 1) * bl].to_vec())
                .collect();
            let acts = quantize_acts_on(path, dtype, &acts_x).unwrap();
            let dot = vec_dot_on(path, dtype, &w, &acts).unwrap();
            let (exact, size) = vals
                .iter()
                .zip(&acts_x)
                .fold((0f64, 0f64), |(e, s), (&a, &b)| {
                    (e + a as f64 * b as f64, s + (a as f64 * b as f64).abs())
                });
            assert!(
                (dot as f64 - exact).abs() <= size * 1e-6,
                "{dtype} {path}: blocks {rows:?}: {dot} vs {exact}"
            );
        }
    }
}

/// IQ4_NL and IQ4_XS (scripts/reference/make_iq4_fixtures.py): random blocks dequantize bit for
/// bit as gguf-py's `dequantize` does.
#[test]
fn iq4_dequantize_is_bit_exact_with_gguf_py() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/quant");
    for (name, dtype) in [("iq4_nl", DType::IQ4NL), ("iq4_xs", DType::IQ4XS)] {
        let src = std::fs::read(dir.join(format!("{name}.bin"))).unwrap();
        let want = words(&std::fs::read(dir.join(format!("{name}.f32"))).unwrap());
        assert_eq!(
            want.len(),
            src.len() / dtype.block_bytes() * dtype.block_len()
        );
        let mut got = vec![0f32; want.len()];
        dequantize(dtype, &src, &mut got).unwrap();
        let bad = mismatches(&bits(&got), &want);
        assert!(bad.is_empty(), "{dtype}: {bad:?}");
    }
}
