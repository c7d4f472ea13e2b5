//! `synaptix quantize` against `llama-quantize --pure` (llama.cpp commit 0c1e570; its portable
//! and AVX-512 builds write the same files): the files it writes are byte for byte llama.cpp's,
//! whose SHA-256 were recorded when these tests were written (`llama-quantize --pure
//! [--allow-requantize] IN OUT TYPE` on the same inputs).

use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};
use synaptix_bundle::cache;

fn synaptix(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_synaptix"))
        .args(args)
        .output()
        .expect("synaptix runs")
}

fn sha256(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap();
    Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("synaptix-quantize-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `synaptix ARGS`, run in `dir` where given (llama-quantize records an importance matrix's path
/// as given, so those tests give relative ones); it must succeed.
fn synaptix_ok_in(dir: Option<&Path>, args: &[&str]) -> std::process::Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_synaptix"));
    if let Some(dir) = dir {
        command.current_dir(dir);
    }
    let run = command.args(args).output().expect("synaptix runs");
    assert!(
        run.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    run
}

fn synaptix_ok(args: &[&str]) -> std::process::Output {
    synaptix_ok_in(None, args)
}

fn synaptix_in(dir: &Path, args: &[&str]) {
    synaptix_ok_in(Some(dir), args);
}

/// `synaptix quantize INPUT OUTPUT --type DTYPE` plus `extra` flags; it must succeed.
fn quantize(input: &Path, output: &Path, dtype: &str, extra: &[&str]) {
    let (i, o) = (input.to_str().unwrap(), output.to_str().unwrap());
    let mut args = vec!["quantize", i, o, "--type", dtype];
    args.extend_from_slice(extra);
    synaptix_ok(&args);
}

/// The tiny synthetic llama (F16, Q8_0 and F32 tensors) to F32, then `--pure` to every float and
/// 32-element type: each file equals llama-quantize's.
#[test]
fn every_type_writes_llama_quantize_s_file() {
    let dir = scratch("tiny");
    let tiny = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/synthetic/llama-tiny.gguf");
    let f32 = dir.join("f32.gguf");
    quantize(&tiny, &f32, "f32", &["--allow-requantize"]);
    assert_eq!(
        sha256(&f32),
        "d1d5a6e67baded528375335ae9d07428ed36e10df0153bd20b5277bb6f39a44e",
        "F32"
    );
    for (dtype, want) in [
        (
            "q8_0",
            "7d7a4fd0f773db4dd2ab01e650411c7ba83b25bf49b7e70798f4ff493a8c3436",
        ),
        (
            "q4_0",
            "15d131b09460b947fc067e11f04fedc294e91c6e6f7491fd8b25a3697b34e055",
        ),
        (
            "q4_1",
            "6530ec29e8617eb3082b0759da41f65247f09ceff71b0e5ffd6cef54072f8800",
        ),
        (
            "q5_0",
            "84e6e187fc581ea02e811115c6d127bd89a3dee84ca156b19ede3619704dd807",
        ),
        (
            "q5_1",
            "84c543f2fccf6f50f6564fef3558cb0c05f5d787adbc39aee06e7191f807781f",
        ),
        (
            "f16",
            "b77a8941b07e3b67f3f336dc5203c219c86244bfb6261f5a7ecc84db26664c3d",
        ),
        (
            "bf16",
            "e36fe7452b866961a8fd14755c53f429859c66361fc43a2eb17eb2e439cc7065",
        ),
    ] {
        let out = dir.join(format!("{dtype}.gguf"));
        quantize(&f32, &out, dtype, &["--pure"]);
        assert_eq!(sha256(&out), want, "{dtype}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The real Gemma 3 270M Q4_K_M file requantized to five types (its 640-column matrices fall
/// back from the k-quants as in llama-quantize: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0): the
/// same bytes as llama-quantize, and the Q8_0 result runs.
#[test]
fn gemma_requantized_matches_llama_quantize_and_runs() {
    let gemma = cache::models_dir().join("gemma-3-270m-q4_k_m.gguf");
    assert!(
        gemma.exists(),
        "{} is missing: run scripts/fetch-models.sh",
        gemma.display()
    );
    let dir = scratch("gemma");
    for (dtype, want) in [
        (
            "q8_0",
            "d3d21138dcca83884e329b4cd6939b905c15e06022a930ce13d6db4d9e67290a",
        ),
        (
            "q5_1",
            "92fc0f2cb00c278bfcb4cf65cc717f0c18d02aab1493175f0be1354fc94dee04",
        ),
        (
            "q4_k",
            "d5713b021e4067e05866c5bae7c43663fb89071b2fdd4bd273c7c46356998abc",
        ),
        (
            "q5_k",
            "ca982b5b0a8a1cdcaf0709caef3b8b7383423cb925a78bcccea214802a91a295",
        ),
        (
            "q6_k",
            "20343b302ced09851f62ba12410a1bdebfc57b66399a451fcd2a51517a00673b",
        ),
    ] {
        let out = dir.join(format!("{dtype}.gguf"));
        quantize(&gemma, &out, dtype, &["--pure", "--allow-requantize"]);
        assert_eq!(sha256(&out), want, "gemma {dtype}");
    }
    let run = synaptix_ok(&[
        "run",
        dir.join("q8_0.gguf").to_str().unwrap(),
        "The capital of France is",
        "-n",
        "8",
        "--temp",
        "0",
        "--device",
        "cpu",
    ]);
    assert!(
        String::from_utf8_lossy(&run.stdout).contains("France"),
        "{}",
        String::from_utf8_lossy(&run.stdout)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Qwen2.5-Coder 0.5B Q4_K_M to Q4_K: 4864-column matrices in Q4_K, 896-column ones fall back to
/// Q5_0; the same bytes as llama-quantize.
#[test]
fn qwen_to_q4_k_matches_llama_quantize() {
    let qwen = cache::models_dir().join("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    assert!(
        qwen.exists(),
        "{} is missing: run scripts/fetch-models.sh",
        qwen.display()
    );
    let dir = scratch("qwen");
    let out = dir.join("q4_k.gguf");
    quantize(&qwen, &out, "q4_k", &["--pure", "--allow-requantize"]);
    assert_eq!(
        sha256(&out),
        "f6886072ba3985165efb3c0978a6749f5a4f8cc7ef04a486e69a4df6b89fa395"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The presets' mixtures (which matrices get more bits), as llama-quantize chooses them. Gemma 3
/// 270M's published Q4_K_M file, requantized with the Q4_K_M preset, comes back byte for byte
/// (its quants are a fixed point of ggml's quantizers), as it does with llama-quantize.
#[test]
fn presets_mix_types_like_llama_quantize() {
    let models = cache::models_dir();
    let gemma = models.join("gemma-3-270m-q4_k_m.gguf");
    let qwen = models.join("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    let dir = scratch("presets");
    let tiny = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/synthetic/llama-tiny.gguf");
    for (input, dtype, want) in [
        (
            &gemma,
            "q4_k_m",
            "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        ),
        (
            &gemma,
            "q4_0",
            "8b90dc09855b7fc6fe7d3bec8afbe0e27541fa3ed72eb0b3b2ea0e56f3b47d88",
        ),
        (
            &gemma,
            "q3_k_m",
            "606afb013edee89c314a12071162e069c44d46eb626ed1ccc72af450b7e177eb",
        ),
        (
            &qwen,
            "q2_k",
            "a545def2e749dcd13c0308cce30b09d06c972803005354b1f1d1a334b156db84",
        ),
        (
            &qwen,
            "q4_k_m",
            "2af77c2d2582f43afd59e659e427600c73e9ef83a8a49ea320d134bbce498a7a",
        ),
        (
            &tiny,
            "q4_0",
            "7e30877cf304f063d2253602a08d347f812399a62b23b4acc4c96138be615ee7",
        ),
    ] {
        let out = dir.join(format!("{dtype}.gguf"));
        quantize(input, &out, dtype, &["--allow-requantize"]);
        assert_eq!(sha256(&out), want, "{} {dtype}", input.display());
    }
    // Explicit types for the output matrix (here Gemma's tied token embeddings) and the token
    // embeddings: the embeddings' own type wins, as in llama-quantize.
    let out = dir.join("typed.gguf");
    quantize(
        &gemma,
        &out,
        "q4_k_m",
        &[
            "--allow-requantize",
            "--output-tensor-type",
            "q8_0",
            "--token-embedding-type",
            "f16",
        ],
    );
    assert_eq!(
        sha256(&out),
        "db3bc86e12f163a785a2d3c848b6103d6e2679ee2edb7e8065863a396bedff01"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Wrong types, a requantization not asked for, and an output that is the input are one-line
/// errors; nothing is left behind.
#[test]
fn bad_requests_are_one_line_errors() {
    let dir = scratch("bad");
    let tiny = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/synthetic/llama-tiny.gguf");
    let (t, out) = (tiny.to_str().unwrap(), dir.join("out.gguf"));
    let o = out.to_str().unwrap();
    let qwen_imatrix = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/imatrix/qwen2.5-coder-0.5b.imatrix.gguf");
    let tiny_text = dir.join("short.txt");
    std::fs::write(&tiny_text, "A few words only.").unwrap();
    for (args, expect) in [
        (vec!["quantize", t, o, "--type", "iq2_xs"], "not a preset"),
        (
            vec![
                "quantize",
                t,
                o,
                "--type",
                "q8_0",
                "--output-tensor-type",
                "q9",
            ],
            "--output-tensor-type q9",
        ),
        (
            vec!["quantize", t, o, "--type", "q4_0"],
            "--allow-requantize",
        ),
        (vec!["quantize", t, t, "--type", "f16"], "overwrite"),
        (
            vec!["quantize", t, o, "--type", "mxfp8", "--allow-requantize"],
            "*.syn",
        ),
        (
            vec!["quantize", "/nonexistent.gguf", o, "--type", "f16"],
            "nonexistent",
        ),
        (
            vec![
                "quantize",
                t,
                o,
                "--type",
                "q4_k_m",
                "--allow-requantize",
                "--imatrix",
                t,
            ],
            "not an importance matrix",
        ),
        (
            vec![
                "quantize",
                t,
                o,
                "--type",
                "q4_k_m",
                "--allow-requantize",
                "--imatrix",
                "/nonexistent.imatrix",
            ],
            "nonexistent.imatrix",
        ),
        (
            // Another model's matrix: its columns do not fit.
            vec![
                "quantize",
                t,
                o,
                "--type",
                "q4_0",
                "--allow-requantize",
                "--imatrix",
                qwen_imatrix.to_str().unwrap(),
            ],
            "the importance matrix has 896 values",
        ),
        (
            vec!["imatrix", t, "-f", "/nonexistent.txt", "-o", o],
            "cannot read /nonexistent.txt",
        ),
        (
            vec![
                "imatrix",
                t,
                "-f",
                tiny_text.to_str().unwrap(),
                "-o",
                o,
                "-c",
                "8",
            ],
            "at least 16 tokens",
        ),
        (
            vec![
                "imatrix",
                t,
                "-f",
                tiny_text.to_str().unwrap(),
                "-o",
                o,
                "-c",
                "4096",
            ],
            "not one chunk of 4096",
        ),
    ] {
        let r = synaptix(&args);
        let stderr = String::from_utf8_lossy(&r.stderr);
        assert!(!r.status.success(), "{args:?}");
        assert_ne!(r.status.code(), Some(101), "{stderr}");
        let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{args:?}: {stderr}");
        assert!(
            lines[0].starts_with("error: ") && lines[0].contains(expect),
            "{args:?}: {stderr}"
        );
        assert!(!out.exists(), "{args:?} left {o} behind");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The last row of a `.npy` file of f32 `[rows, cols]` (what `--dump-tensors` writes).
fn npy_last_row(path: &Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&bytes[..6], b"\x93NUMPY", "{}", path.display());
    let header_len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let header = String::from_utf8_lossy(&bytes[10..10 + header_len]);
    assert!(header.contains("'<f4'"), "{header}");
    let cols: usize = header
        .split("'shape': (")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .and_then(|s| s.split(',').map(str::trim).rfind(|d| !d.is_empty()))
        .and_then(|d| d.parse().ok())
        .unwrap_or_else(|| panic!("no shape in {header}"));
    let data = &bytes[10 + header_len..];
    data[data.len() - 4 * cols..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Gemma 3 270M requantized to MXFP8, NVFP4 and SQ3 / SQ8 (synaptix's own types, .syn bundles): their
/// next-token logits stay near the source file's (the same pick; NMSE a few times Q8_0's for
/// MXFP8's three mantissa bits, more for NVFP4's four-bit values), and NVFP4 keeps the output
/// matrix (here the tied embeddings) in MXFP8; decoding the blocks wrongly would put the NMSE
/// near 1.
#[test]
fn gemma_microscaling_bundles_run_close_to_their_source() {
    let gemma = cache::models_dir().join("gemma-3-270m-q4_k_m.gguf");
    assert!(
        gemma.exists(),
        "{} is missing: run scripts/fetch-models.sh",
        gemma.display()
    );
    let dir = scratch("microscaling");
    let (mx, nv, q8) = (
        dir.join("mxfp8.syn"),
        dir.join("nvfp4.syn"),
        dir.join("q8_0.syn"),
    );
    quantize(&gemma, &mx, "mxfp8", &["--allow-requantize"]);
    quantize(&gemma, &nv, "nvfp4", &["--allow-requantize"]);
    quantize(&gemma, &q8, "q8_0", &["--pure", "--allow-requantize"]);
    let logits = |model: &Path, tag: &str| {
        let out_dir = dir.join(tag);
        synaptix_ok(&[
            "run",
            model.to_str().unwrap(),
            "The capital of France is a city that",
            "-n",
            "1",
            "--temp",
            "0",
            "--device",
            "cpu",
            "--dump-tensors",
            out_dir.to_str().unwrap(),
            "--dump-filter",
            "result_output",
        ]);
        npy_last_row(&out_dir.join("result_output.npy"))
    };
    let want = logits(&gemma, "source");
    let nmse = |got: &[f32]| {
        let (mut err, mut norm) = (0f64, 0f64);
        for (g, w) in got.iter().zip(&want) {
            err += (*g as f64 - *w as f64).powi(2);
            norm += (*w as f64).powi(2);
        }
        err / norm
    };
    let argmax = |v: &[f32]| {
        v.iter()
            .enumerate()
            .fold((0, f32::MIN), |b, (i, &x)| if x > b.1 { (i, x) } else { b })
            .0
    };
    let (got_mx, got_nv, got_q8) = (
        logits(&mx, "mxfp8"),
        logits(&nv, "nvfp4"),
        logits(&q8, "q8_0"),
    );
    let (e_mx, e_nv, e_q8) = (nmse(&got_mx), nmse(&got_nv), nmse(&got_q8));
    eprintln!(
        "next-token logits NMSE against the source: mxfp8 {e_mx:.2e}, nvfp4 {e_nv:.2e}, q8_0 {e_q8:.2e}"
    );
    assert!(
        e_q8 < e_mx && e_mx < e_nv,
        "mxfp8 {e_mx:e}, nvfp4 {e_nv:e}, q8_0 {e_q8:e}"
    );
    assert!(e_mx < 1e-2 && e_nv < 5e-2, "mxfp8 {e_mx:e}, nvfp4 {e_nv:e}");
    assert_eq!(argmax(&got_mx), argmax(&want));
    assert_eq!(argmax(&got_nv), argmax(&want));
    // SQ presets: every matrix with rows of whole 256-value super-blocks (FFN down), the others
    // falling back (640-value rows: SQ3 to NVFP4, SQ8 to MXFP8). More bits, closer logits.
    let (s3, s8) = (dir.join("sq3.syn"), dir.join("sq8.syn"));
    quantize(&gemma, &s3, "sq3", &["--allow-requantize"]);
    quantize(&gemma, &s8, "sq8", &["--allow-requantize"]);
    let (e_s3, e_s8) = (nmse(&logits(&s3, "sq3")), nmse(&logits(&s8, "sq8")));
    eprintln!("sq3 {e_s3:.2e}, sq8 {e_s8:.2e}");
    assert!(
        e_s8 < e_mx && e_s8 < e_s3 && e_s3 < 0.2,
        "sq3 {e_s3:e}, sq8 {e_s8:e}"
    );
    for (file, types) in [
        (&mx, &["\"mxfp8\""][..]),
        (&nv, &["\"nvfp4\"", "\"mxfp8\""][..]),
        (&s3, &["\"sq3\"", "\"nvfp4\"", "\"mxfp8\""][..]),
    ] {
        let inspect = synaptix(&["inspect", file.to_str().unwrap(), "--json"]);
        let text = String::from_utf8_lossy(&inspect.stdout);
        for t in types {
            assert!(text.contains(t), "{}: no {t} tensor", file.display());
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A mixture-of-experts file with k-quant-sized rows: `llama` with 8 experts of 2 per token
/// (llama-quantize gives 8-expert models' attention more bits), 4 layers, width 256, F16
/// matrices of deterministic noise and an F32 router. Written here, the same bytes every time.
fn synthetic_moe(path: &Path) {
    use synaptix_bundle::gguf::GgufWriter;
    use synaptix_bundle::Value;
    use synaptix_core::DType;
    let (d, ff, n_expert, n_layer, vocab) = (256u64, 256u64, 8u64, 4u64, 256u64);
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut noise = |n: u64, scale: f32| -> Vec<f32> {
        (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * scale
            })
            .collect()
    };
    let f16 = |v: Vec<f32>| -> Vec<u8> {
        v.iter()
            .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
            .collect()
    };
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", Value::String("llama".into()));
    for (k, v) in [
        ("context_length", 256u32),
        ("embedding_length", d as u32),
        ("block_count", n_layer as u32),
        ("feed_forward_length", ff as u32),
        ("attention.head_count", 4),
        ("attention.head_count_kv", 2),
        ("rope.dimension_count", 64),
        ("expert_count", n_expert as u32),
        ("expert_used_count", 2),
    ] {
        w.add_metadata(format!("llama.{k}"), Value::U32(v));
    }
    w.add_metadata("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5));
    w.add_tensor(
        "token_embd.weight",
        &[vocab, d],
        DType::F16,
        f16(noise(vocab * d, 0.1)),
    );
    w.add_f32("output_norm.weight", &[d], &vec![1.0; d as usize]);
    w.add_tensor(
        "output.weight",
        &[vocab, d],
        DType::F16,
        f16(noise(vocab * d, 0.1)),
    );
    for i in 0..n_layer {
        let b = |n: &str| format!("blk.{i}.{n}.weight");
        w.add_f32(b("attn_norm"), &[d], &vec![1.0; d as usize]);
        w.add_tensor(b("attn_q"), &[d, d], DType::F16, f16(noise(d * d, 0.2)));
        w.add_tensor(
            b("attn_k"),
            &[d / 2, d],
            DType::F16,
            f16(noise(d * d / 2, 0.2)),
        );
        w.add_tensor(
            b("attn_v"),
            &[d / 2, d],
            DType::F16,
            f16(noise(d * d / 2, 0.2)),
        );
        w.add_tensor(
            b("attn_output"),
            &[d, d],
            DType::F16,
            f16(noise(d * d, 0.2)),
        );
        w.add_f32(b("ffn_norm"), &[d], &vec![1.0; d as usize]);
        w.add_f32(b("ffn_gate_inp"), &[n_expert, d], &noise(n_expert * d, 0.2));
        for part in ["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"] {
            let data = f16(noise(n_expert * ff * d, 0.2));
            w.add_tensor(b(part), &[n_expert, ff, d], DType::F16, data);
        }
    }
    std::fs::write(path, w.to_bytes()).unwrap();
}

/// llama-quantize's mixtures on a mixture-of-experts file (llama.cpp as vendored by
/// llama-cpp-python in late 2026, whose dense files equal 0c1e570's above): expert tensors
/// quantized expert by expert, their layer read from their names, 8-expert attention in Q8_0
/// (values, keys) and Q5_K (output).
#[test]
fn moe_presets_match_llama_quantize() {
    let dir = scratch("moe");
    let input = dir.join("moe-f16.gguf");
    synthetic_moe(&input);
    assert_eq!(
        sha256(&input),
        "36562ea2cbf7672a8ff29a1a08bf2e0c7116cf08d42f78365644f3ac23ebe4e3",
        "the synthetic input changed: the hashes below are for another file"
    );
    for (dtype, want) in [
        (
            "q4_k_m",
            "38df2059cdc69da9187da07a64afae3a5adef4764644c7b7b3ac04be3b5921dc",
        ),
        (
            "q2_k",
            "a73df26ee7a475552f140f030707f3329e6b76184cb11be98694953eff3fadf3",
        ),
        (
            "q3_k_m",
            "89b4f81a3497bb0897ce916291107495350f2b86e11df5110e30e82d535b6155",
        ),
        (
            "q3_k_l",
            "91c6554b74885522ae7c44b1039fa4cd1d3c3f996b2a0894a1ece4ebd221c46c",
        ),
        (
            "q4_k_s",
            "fe929dfe8561c8ee0e17fea10671f36c3edb9a4d02097a540a5140974b27cdbc",
        ),
        (
            "q5_k_m",
            "5b3931b17b9419c9bdebc9b0fcda4d4c25892b5bb94d27bf4d12014b55038b65",
        ),
        (
            "q6_k",
            "dd322f6c819e6fdb6ee461150be0a418b0082e4387837400caf56f4dd1b90bc7",
        ),
        (
            "q4_0",
            "d293e8bebbe208e384f482a9c86e413f140f7c6f6ef41bbf0a05fcd0dace7488",
        ),
        (
            "iq4_nl",
            "af620828c8f128b5f2bae6f6fda60e1d2c69e6e740f2096a34ab50f2961514b0",
        ),
        (
            "iq4_xs",
            "16a757bbe5caa7a667794ecb4c88cb3f5658ddf930494eac80118e4510f70c0e",
        ),
    ] {
        let out = dir.join(format!("{dtype}.gguf"));
        quantize(&input, &out, dtype, &[]);
        assert_eq!(sha256(&out), want, "{dtype}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// An importance matrix for [`synthetic_moe`]'s matrices, of deterministic noise: every layer
/// matrix, the experts' with one count per expert (expert 5 of each layer never reached, which
/// makes its importance 1).
fn synthetic_imatrix(path: &Path) {
    use synaptix_bundle::imatrix::{Imatrix, ImatrixEntry};
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32
    };
    let mut m = Imatrix {
        datasets: vec!["synthetic.txt".into()],
        chunk_count: 4,
        chunk_size: 512,
        ..Imatrix::default()
    };
    for i in 0..4 {
        for (name, cols, n_mat) in [
            ("attn_q", 256, 1),
            ("attn_k", 256, 1),
            ("attn_v", 256, 1),
            ("attn_output", 256, 1),
            ("ffn_gate_exps", 256, 8),
            ("ffn_up_exps", 256, 8),
            ("ffn_down_exps", 256, 8),
        ] {
            let counts: Vec<f32> = (0..n_mat)
                .map(|e| if n_mat > 1 && e == 5 { 0.0 } else { 2048.0 })
                .collect();
            let sums = (0..cols * n_mat)
                .map(|_| {
                    let u = next();
                    2048.0 * (0.05 + u * u * 4.0)
                })
                .collect();
            m.entries.insert(
                format!("blk.{i}.{name}.weight"),
                ImatrixEntry { sums, counts },
            );
        }
    }
    m.write(path).unwrap();
}

/// `--imatrix`: llama-quantize's weighted quantizers (ggml's `quantize_row_*_impl`) for every
/// type that has one, experts weighted by their own rows, and the file's record of the
/// matrix (`quantize.imatrix.*`), byte for byte as llama-quantize `--imatrix` writes them (the
/// same llama.cpp as above). The matrix's path is recorded as given, so both ran with
/// `moe.imatrix.gguf` from the same directory.
#[test]
fn imatrix_quantization_matches_llama_quantize() {
    let dir = scratch("imatrix");
    let input = dir.join("moe-f16.gguf");
    synthetic_moe(&input);
    synthetic_imatrix(&dir.join("moe.imatrix.gguf"));
    assert_eq!(
        sha256(&dir.join("moe.imatrix.gguf")),
        "54194b9752b9008a67be2a6d1f61a36580078eb0a70294294d6393bf3346a039",
        "the synthetic matrix changed: the hashes below are for another file"
    );
    for (dtype, want) in [
        (
            "q4_k_m",
            "af2120518b734504422de502365510578255ee07c88914a8c29ac7901a74e350",
        ),
        (
            "q2_k",
            "621e81a98a17a2e6be62731dddfca4c088bffa7eb768bf496625df564a79d6df",
        ),
        (
            "q3_k_m",
            "294f824aed7c737c9c302ca982cbfd308b3584edfb4879f9720f99685b6325e9",
        ),
        (
            "q5_k_m",
            "fd8c2e21d26b29f8afa3138379024bac2b6aef7265ec365780790e84863c3d2f",
        ),
        (
            "q6_k",
            "706b4f1999aa9c5d06a9b456ce2402adfaf2d43d793fb5b96a2502fb543d6096",
        ),
        (
            "q4_0",
            "e0fb2dbc7b87557cc2590ed2a02570e1d15a89cdd6b4e13f02a4aa784bafcf08",
        ),
        (
            "q4_1",
            "0f8272fba647b4647e207a3140977450f350be544851930cc9a6a5629cceea3c",
        ),
        (
            "q5_0",
            "d514527911676d312dcd38cf84d0841924dc1ce16c668d4ee49a2c8d6da8766d",
        ),
        (
            "q5_1",
            "312b3e3652bfba63ec874028a188dfb6c594deb9c31d16d1fc61129d249cc9a7",
        ),
        (
            "iq4_nl",
            "eff389cd154ae6e10fda58d441d04e3ffc84b827c1448a53bf3ec51ebba64d13",
        ),
        (
            "iq4_xs",
            "5a25d301ea30789db82b3d6da97a6e2afc1346230f1fda1c91b6cbc0c3e71fca",
        ),
    ] {
        let out = format!("{dtype}.gguf");
        let args = ["quantize", "moe-f16.gguf", &out, "--type", dtype];
        synaptix_in(
            &dir,
            &[&args[..], &["--imatrix", "moe.imatrix.gguf"]].concat(),
        );
        assert_eq!(sha256(&dir.join(&out)), want, "{dtype}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The real Qwen2.5-Coder 0.5B with a real importance matrix: `llama-imatrix` on 8 chunks of
/// 256 tokens of the tokenizer corpus and the README (tests/fixtures/imatrix). The F16 file
/// written first is the input llama-quantize `--imatrix` was given; Q4_K_M, Q4_0 (whose
/// first three FFN down projections become Q4_1 with a matrix), IQ4_XS and Q2_K_S (which needs
/// the matrix) equal its files.
#[test]
fn qwen_with_a_llama_imatrix_matches_llama_quantize() {
    let dir = scratch("qwen-imatrix");
    let qwen = cache::models_dir().join("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    let f16 = dir.join("qwen-f16.gguf");
    quantize(&qwen, &f16, "f16", &["--allow-requantize"]);
    assert_eq!(
        sha256(&f16),
        "effda79250f4c1d2f4b26ce88c2847581717938fb1ea7ccf577f8d6def15baa5"
    );
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/imatrix/qwen2.5-coder-0.5b.imatrix.gguf"),
        dir.join("qwen-imatrix.gguf"),
    )
    .unwrap();
    for (dtype, want) in [
        (
            "q4_k_m",
            "f03a31a997f6ff7e7039a2bfea77edd604c7038cacd4b42f89c32dab47772e13",
        ),
        (
            "q4_0",
            "c11eb8bc30bfef204845df2d4b084fb8bf374efd9c66a8373e21f478619d1d37",
        ),
        (
            "iq4_xs",
            "8581c915f28d6c3ae30c8b5b4d105a87a0b225f8eac1a5cfdc40cbed897ebdc0",
        ),
        (
            "q2_k_s",
            "6e873910c24d7b29aee1f24f9400630313768b6785a06eebf7eefd117ec21d49",
        ),
    ] {
        let out = format!("{dtype}.gguf");
        let args = ["quantize", "qwen-f16.gguf", &out, "--type", dtype];
        synaptix_in(
            &dir,
            &[&args[..], &["--imatrix", "qwen-imatrix.gguf"]].concat(),
        );
        assert_eq!(sha256(&dir.join(&out)), want, "{dtype}");
    }
    // A named type for the first attention values only (so the mixture's count of them, which
    // decides which later ones get Q6_K, starts at the second) and for the FFN up and gate
    // matrices: llama-quantize's file.
    synaptix_in(
        &dir,
        &[
            "quantize",
            "qwen-f16.gguf",
            "named.gguf",
            "--type",
            "q4_k_m",
            "--tensor-type",
            r"blk\.0\.attn_v=q8_0",
            "--tensor-type",
            "ffn_(up|gate)=q5_0",
        ],
    );
    assert_eq!(
        sha256(&dir.join("named.gguf")),
        "3aafcff7122c3dbb9de259d0f3b287023e50d9c04435d268af8921983f68d6e9"
    );
    // Q2_K_S without a matrix is refused, as llama-quantize refuses it, and writes nothing.
    let refused = synaptix(&[
        "quantize",
        f16.to_str().unwrap(),
        dir.join("refused.gguf").to_str().unwrap(),
        "--type",
        "q2_k_s",
    ]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("needs an importance matrix"));
    assert!(!dir.join("refused.gguf").exists());
    // IQ4_XS runs (on the CPU) and still knows the capital of France.
    let run = synaptix_ok(&[
        "run",
        dir.join("iq4_xs.gguf").to_str().unwrap(),
        "The capital of France is",
        "-n",
        "2",
        "--temp",
        "0",
        "--json",
        "--device",
        "cpu",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    assert!(v["text"].as_str().unwrap().starts_with(" Paris"), "{v}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `synaptix imatrix` on the real Qwen2.5 0.5B with the text and settings llama-imatrix was
/// given for tests/fixtures/imatrix (8 chunks of 256 tokens): the same matrices, the same row
/// counts, and sums of squares within 3% (norm of the difference over the norm, per matrix;
/// measured at most 1.04%, in the last layers' FFN down projections: llama.cpp's AVX2 build
/// and synaptix's portable-order arithmetic give slightly different activations). The file
/// quantizes as llama-quantize quantizes with it.
#[test]
fn imatrix_matches_llama_imatrix() {
    use synaptix_bundle::imatrix::Imatrix;
    let dir = scratch("imatrix-make");
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/imatrix");
    let qwen = cache::models_dir().join("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    let out = dir.join("ours.imatrix.gguf");
    synaptix_ok(&[
        "imatrix",
        qwen.to_str().unwrap(),
        "-f",
        fixtures.join("corpus.txt").to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "-c",
        "256",
        "--chunks",
        "8",
        "--json",
    ]);
    let ours = Imatrix::read(&out).unwrap();
    let theirs = Imatrix::read(&fixtures.join("qwen2.5-coder-0.5b.imatrix.gguf")).unwrap();
    assert_eq!((ours.chunk_count, ours.chunk_size), (8, 256));
    assert_eq!(
        ours.entries.keys().collect::<Vec<_>>(),
        theirs.entries.keys().collect::<Vec<_>>()
    );
    let mut worst = 0f64;
    for (name, t) in &theirs.entries {
        let o = &ours.entries[name];
        assert_eq!(o.counts, t.counts, "{name}: counts");
        let diff: f64 = o
            .sums
            .iter()
            .zip(&t.sums)
            .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
            .sum();
        let norm: f64 = t.sums.iter().map(|b| (*b as f64).powi(2)).sum();
        worst = worst.max((diff / norm).sqrt());
    }
    eprintln!("worst relative difference of a matrix's sums: {worst:.4}");
    assert!(worst < 0.03, "{worst}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Mixture-of-experts statistics: one matrix per expert, each token counted once for each of
/// the experts it was routed to; the shared expert's and the router's as dense matrices.
#[test]
fn imatrix_counts_experts_rows() {
    use synaptix_bundle::imatrix::Imatrix;
    let dir = scratch("imatrix-moe");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
    let out = dir.join("moe.imatrix.gguf");
    synaptix_ok(&[
        "imatrix",
        root.join("moe/qwen2moe-tiny.gguf").to_str().unwrap(),
        "-f",
        root.join("imatrix/corpus.txt").to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "-c",
        "64",
        "--chunks",
        "6",
    ]);
    let m = Imatrix::read(&out).unwrap();
    let tokens = 6.0 * 64.0;
    for layer in 0..2 {
        let exps = &m.entries[&format!("blk.{layer}.ffn_gate_exps.weight")];
        assert_eq!(exps.counts.len(), 4);
        assert_eq!(exps.cols(), 64);
        // Two experts per token.
        assert_eq!(exps.counts.iter().sum::<f32>(), 2.0 * tokens);
        let down = &m.entries[&format!("blk.{layer}.ffn_down_exps.weight")];
        assert_eq!(down.cols(), 48);
        assert_eq!(down.counts, exps.counts);
        for dense in [
            "attn_q",
            "ffn_gate_inp",
            "ffn_gate_inp_shexp",
            "ffn_up_shexp",
            "ffn_down_shexp",
        ] {
            assert_eq!(
                m.entries[&format!("blk.{layer}.{dense}.weight")].counts,
                vec![tokens],
                "{dense}"
            );
        }
    }
    // The matrix drives quantization.
    let q = dir.join("q4_0.gguf");
    synaptix_ok(&[
        "quantize",
        root.join("moe/qwen2moe-tiny.gguf").to_str().unwrap(),
        q.to_str().unwrap(),
        "--type",
        "q4_0",
        "--allow-requantize",
        "--imatrix",
        out.to_str().unwrap(),
    ]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// llama-quantize's `--tensor-type`, `--tensor-type-file` and `--leave-output-tensor` on the tiny
/// synthetic llama: the same files as llama-quantize's (a pattern's match replaces the mixture's
/// choice, patterns lower-cased; the output matrix copied as it is). Malformed entries are
/// one-line errors that write nothing.
#[test]
fn tensor_type_overrides_match_llama_quantize() {
    let tiny = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/synthetic/llama-tiny.gguf");
    let dir = scratch("tensor-type");
    let kept = dir.join("kept.gguf");
    quantize(
        &tiny,
        &kept,
        "q4_0",
        &["--allow-requantize", "--leave-output-tensor"],
    );
    assert_eq!(
        sha256(&kept),
        "7e30877cf304f063d2253602a08d347f812399a62b23b4acc4c96138be615ee7"
    );
    let list = dir.join("types.txt");
    std::fs::write(&list, "attn_q=q8_0\n  blk\\.1\\.ffn_down=Q5_1\n").unwrap();
    let named = dir.join("named.gguf");
    quantize(
        &tiny,
        &named,
        "q4_k_m",
        &[
            "--allow-requantize",
            "--tensor-type-file",
            list.to_str().unwrap(),
        ],
    );
    assert_eq!(
        sha256(&named),
        "7d191ff05f23a6c87fc15127f352f43cb97d40c9fddb09f937dee71efec30a51"
    );
    // The same entries on the command line give the same file.
    let inline = dir.join("inline.gguf");
    quantize(
        &tiny,
        &inline,
        "q4_k_m",
        &[
            "--allow-requantize",
            "--tensor-type",
            "attn_q=q8_0",
            "--tensor-type",
            r"blk\.1\.ffn_down=q5_1",
        ],
    );
    assert_eq!(sha256(&inline), sha256(&named));
    for (entry, says) in [
        ("attn_v", "expected PATTERN=TYPE"),
        ("attn_v=", "expected PATTERN=TYPE"),
        ("attn_v=q9_9", "not a type synaptix quantizes to"),
        ("(=q8_0", "not a regular expression"),
    ] {
        let out = dir.join("refused.gguf");
        let run = synaptix(&[
            "quantize",
            tiny.to_str().unwrap(),
            out.to_str().unwrap(),
            "--type",
            "q4_0",
            "--allow-requantize",
            "--tensor-type",
            entry,
        ]);
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert!(!run.status.success(), "{entry}");
        assert!(stderr.contains(says), "{entry}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{entry}: {stderr}");
        assert!(!out.exists(), "{entry}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
