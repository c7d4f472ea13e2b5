//! `.symb` directories (SYNAXIM's INT4 format) through the binary: `quantize --type symb-int4`
//! writes, from Hugging Face directories, the same bytes as the reference packer of
//! `scripts/reference/make_symb_models.py` (tests/fixtures/symb); `run` on a `.symb` directory
//! gives transformers' greedy tokens; `convert` carries one into a `.syn` bundle; broken
//! directories and impossible requests are one-line errors.

use std::path::{Path, PathBuf};

mod common;
use common::{fails, fixtures, greedy_run, ids as json_ids, p, synaptix, Scratch};

fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// `run --json` greedy tokens of `model` after `prompt`.
fn greedy(model: &str, prompt: &str, n: usize) -> Vec<u64> {
    greedy_run(model, prompt, n).1
}

/// Every file under `dir`, relative to it.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let path = e.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.push(path.strip_prefix(dir).unwrap().to_path_buf());
            }
        }
    }
    out.sort();
    out
}

#[test]
fn quantize_writes_what_the_reference_packer_writes() {
    let s = Scratch::new("symb-write");
    for name in ["mistral-tiny", "qwen2-tiny"] {
        let reference = fixtures("symb").join(format!("{name}-int4"));
        let out = s.0.join(format!("{name}-symb"));
        let r = synaptix(&[
            "quantize",
            p(&fixtures("hf").join(name)),
            p(&out),
            "--type",
            "symb-int4",
        ]);
        assert!(
            r.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&r.stderr)
        );
        let want = files(&reference);
        assert_eq!(files(&out), want, "{name}: the same files");
        for f in &want {
            let name_of = f.to_string_lossy();
            if name_of.ends_with(".symb") || name_of.ends_with("tokenizer.json") {
                assert!(
                    std::fs::read(out.join(f)).unwrap()
                        == std::fs::read(reference.join(f)).unwrap(),
                    "{name}: {name_of} differs from the reference packer's"
                );
            }
        }
        // The config: the same fields and values, but for where it came from.
        let mut got = read_json(&out.join("config.symb.json"));
        let mut want = read_json(&reference.join("config.symb.json"));
        got["source_model"] = serde_json::Value::Null;
        want["source_model"] = serde_json::Value::Null;
        assert_eq!(got, want, "{name}: config.symb.json");
        let tok = read_json(&out.join("tokenizer/tokenizer_config.json"));
        let src = read_json(&fixtures("hf").join(name).join("tokenizer_config.json"));
        for key in ["bos_token", "eos_token", "chat_template"] {
            assert_eq!(tok[key], src[key], "{name}: tokenizer_config {key}");
        }
        // Writing again replaces the directory.
        let again = synaptix(&[
            "quantize",
            p(&fixtures("hf").join(name)),
            p(&out),
            "--type",
            "symb-int4",
            "--json",
        ]);
        assert!(again.status.success());
        let v: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap();
        assert_eq!(v["method"], "int4");
        assert_eq!(v["files"].as_u64().unwrap() as usize, want_len(&reference));
    }
}

fn want_len(dir: &Path) -> usize {
    files(dir).len()
}

/// Transformers' greedy tokens for the first prompt (whose steps have no near-ties).
#[test]
fn run_and_convert_symb_directories() {
    let s = Scratch::new("symb-run");
    for name in ["mistral-tiny-int4", "qwen2-tiny-int4"] {
        let dir = fixtures("symb").join(name);
        let golden = read_json(&fixtures("symb").join(format!("{name}.json")));
        let case = &golden["cases"][0];
        let want = json_ids(&case["generated"]);
        let prompt = case["prompt"].as_str().unwrap();
        assert!(case["margins"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m.as_f64().unwrap() > 0.02));
        assert_eq!(greedy(p(&dir), prompt, want.len()), want, "{name}");
        let syn = s.path(&format!("{name}.syn"));
        let r = synaptix(&["convert", p(&dir), &syn]);
        assert!(
            r.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&r.stderr)
        );
        assert_eq!(greedy(&syn, prompt, want.len()), want, "{name}.syn");
        let out = synaptix(&["inspect", p(&dir), "--json"]);
        assert!(out.status.success());
        assert!(String::from_utf8_lossy(&out.stdout).contains(".symb (SYNAXIM)"));
    }
    // GGUF cannot hold SYMB4 blocks.
    fails(
        &[
            "convert",
            p(&fixtures("symb").join("mistral-tiny-int4")),
            &s.path("m.gguf"),
        ],
        "symb4",
    );
}

/// FP32 and FP16 directories hold the checkpoint's own values: transformers' tokens for the
/// original model. INT8 runs too.
#[test]
fn other_encodings_round_trip() {
    let s = Scratch::new("symb-enc");
    let golden = read_json(&fixtures("hf").join("qwen2-tiny.json"));
    let case = &golden["cases"][0];
    let want = json_ids(&case["generated"]);
    let prompt = case["prompt"].as_str().unwrap();
    for method in ["fp32", "fp16", "int8"] {
        let out = s.0.join(format!("q-{method}"));
        let r = synaptix(&[
            "quantize",
            p(&fixtures("hf").join("qwen2-tiny")),
            p(&out),
            "--type",
            &format!("symb-{method}"),
        ]);
        assert!(
            r.status.success(),
            "{method}: {}",
            String::from_utf8_lossy(&r.stderr)
        );
        let cfg = read_json(&out.join("config.symb.json"));
        assert_eq!(cfg["quantization"]["method"], method);
        let q = std::fs::metadata(out.join("layers/layer_00/attn_q.symb"))
            .unwrap()
            .len();
        let bytes_per = match method {
            "fp32" => 4 * 64 * 64,
            "fp16" => 2 * 64 * 64,
            _ => 4 + 64 * 64,
        };
        assert_eq!(q, bytes_per, "{method}: attn_q's size");
        let got = greedy(p(&out), prompt, want.len());
        if method != "int8" {
            assert_eq!(got, want, "{method}: transformers' tokens");
        } else {
            assert_eq!(got.len(), want.len());
        }
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.path().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

fn edit_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("config.symb.json");
    let mut v = read_json(&path);
    edit(&mut v);
    std::fs::write(&path, v.to_string()).unwrap();
}

#[test]
fn broken_symb_directories_and_requests_are_one_line_errors() {
    let s = Scratch::new("symb-bad");
    let src = fixtures("symb").join("mistral-tiny-int4");
    let copy = |name: &str| {
        let d = s.0.join(name);
        copy_dir(&src, &d);
        d
    };

    let d = copy("truncated");
    let q = d.join("layers/layer_01/attn_q.symb");
    let bytes = std::fs::read(&q).unwrap();
    std::fs::write(&q, &bytes[..bytes.len() - 7]).unwrap();
    fails(&["run", p(&d), "hi"], "fit no .symb encoding");

    let d = copy("missing");
    std::fs::remove_file(d.join("layers/layer_00/mlp_down.symb")).unwrap();
    fails(&["run", p(&d), "hi"], "mlp_down.symb: cannot read");

    let d = copy("moe");
    edit_config(&d, |v| v["architecture"] = "moe".into());
    fails(&["run", p(&d), "hi"], "mixture-of-experts");

    let d = copy("linear");
    edit_config(&d, |v| v["layer_types"][1] = "linear_attention".into());
    fails(&["run", p(&d), "hi"], "full_attention");

    let d = copy("nohidden");
    edit_config(&d, |v| {
        v.as_object_mut().unwrap().remove("hidden_size");
    });
    fails(&["run", p(&d), "hi"], "missing hidden_size");

    let d = copy("escape");
    edit_config(&d, |v| {
        v["layer_dir_pattern"] = "../layers/layer_{:02d}".into()
    });
    fails(&["run", p(&d), "hi"], "leaves the model directory");

    let d = copy("wronghidden");
    edit_config(&d, |v| v["hidden_size"] = 64.into());
    fails(&["run", p(&d), "hi"], "fit no .symb encoding");

    let d = copy("badjson");
    std::fs::write(d.join("config.symb.json"), b"{ nope").unwrap();
    fails(&["run", p(&d), "hi"], "config.symb.json");

    // What a .symb directory cannot hold.
    let out = s.path("x");
    fails(
        &[
            "quantize",
            p(&fixtures("hf").join("qwen3-tiny")),
            &out,
            "--type",
            "symb-int4",
        ],
        "Llama- and Qwen2-style models",
    );
    fails(
        &[
            "quantize",
            p(&fixtures("hf").join("llama-tiny")),
            &out,
            "--type",
            "symb-int4",
        ],
        "scales RoPE",
    );
    fails(
        &[
            "quantize",
            p(&fixtures("hf").join("qwen2-tiny")),
            &out,
            "--type",
            "symb-int3",
        ],
        "symb-int4, symb-int8",
    );
    fails(
        &[
            "quantize",
            p(&fixtures("hf").join("qwen2-tiny")),
            &out,
            "--type",
            "symb-int4",
            "--pure",
        ],
        "do not apply to .symb output",
    );
    // An existing directory that is not a .symb one is left alone.
    let keep = s.0.join("keep");
    std::fs::create_dir_all(&keep).unwrap();
    std::fs::write(keep.join("notes.txt"), b"mine").unwrap();
    fails(
        &[
            "quantize",
            p(&fixtures("hf").join("qwen2-tiny")),
            p(&keep),
            "--type",
            "symb-int4",
        ],
        "not overwriting it",
    );
    assert!(keep.join("notes.txt").is_file());
}
