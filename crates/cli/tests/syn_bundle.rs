//! `synaptix convert` and the `.syn` bundle end to end on the real models
//! (`scripts/fetch-models.sh` fetches them): a bundle runs to llama.cpp's greedy tokens,
//! converts back to the original GGUF byte for byte, and damage gives one-line errors.

mod common;

use std::path::Path;

use common::{fails, golden, ids, json_ok, model, Scratch};

fn same_bytes(a: &Path, b: &Path) -> bool {
    std::fs::read(a).unwrap() == std::fs::read(b).unwrap()
}

#[test]
fn bundles_run_like_their_gguf_and_convert_back_byte_for_byte() {
    let dir = Scratch::new("syn");
    for (name, file) in [
        ("gemma3-270m", "gemma-3-270m-q4_k_m.gguf"),
        (
            "qwen2.5-coder-0.5b",
            "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        ),
    ] {
        let gguf = model(file);
        let syn = dir.path(&format!("{name}.syn"));
        let summary = json_ok(&["convert", &gguf, &syn, "--json"]);
        assert_eq!(summary["output_format"], ".syn v1", "{summary}");
        assert_eq!(summary["checksums_verified"], true, "{summary}");

        // The bundle's tokenizer, hyper-parameters and weights give llama.cpp's tokens.
        let (prompt, prompt_ids, want) = golden(name);
        let v = json_ok(&[
            "run", &syn, &prompt, "--temp", "0", "-n", "16", "--json", "-t", "2",
        ]);
        assert_eq!(ids(&v["prompt_tokens"]), prompt_ids, "{name}: prompt ids");
        let got = ids(&v["tokens"]);
        assert_eq!(got, want[..got.len()].to_vec(), "{name}: greedy tokens");

        let inspected = json_ok(&["inspect", &syn, "--verify", "--json", "--no-tensors"]);
        assert_eq!(inspected["format"], "syn");
        assert_eq!(inspected["checksums_verified"], true);
        assert_eq!(inspected["alignment"], 64);

        // Back to GGUF: the very file it came from.
        let back = dir.path(&format!("{name}.gguf"));
        json_ok(&["convert", &syn, &back, "--json"]);
        assert!(
            same_bytes(Path::new(&back), Path::new(&gguf)),
            "{name}: GGUF -> .syn -> GGUF changed the file"
        );
    }

    // `quantize` writes a bundle when asked for one: back in GGUF, the bytes of its GGUF output.
    let gguf = model("gemma-3-270m-q4_k_m.gguf");
    let quant = ["--type", "q8_0", "--pure", "--allow-requantize", "--json"];
    let (q_syn, q_gguf, q_back) = (
        dir.path("q8.syn"),
        dir.path("q8.gguf"),
        dir.path("q8b.gguf"),
    );
    json_ok(&[&["quantize", gguf.as_str(), q_syn.as_str()][..], &quant[..]].concat());
    json_ok(
        &[
            &["quantize", gguf.as_str(), q_gguf.as_str()][..],
            &quant[..],
        ]
        .concat(),
    );
    json_ok(&["convert", &q_syn, &q_back, "--json"]);
    assert!(same_bytes(Path::new(&q_back), Path::new(&q_gguf)));
    let inspected = json_ok(&["inspect", &q_syn, "--verify", "--json", "--no-tensors"]);
    assert_eq!(inspected["checksums_verified"], true);

    // Damage: a flipped weight byte is found by --verify; a flipped directory byte and a cut
    // file are refused at open, by every command.
    let syn = dir.path("gemma3-270m.syn");
    let bytes = std::fs::read(&syn).unwrap();
    let mut flipped = bytes.clone();
    flipped[64 + 1000] ^= 0x10;
    let flipped_path = dir.file("flipped.syn", &flipped);
    let flipped_path = flipped_path.to_str().unwrap();
    fails(
        &["inspect", flipped_path, "--verify"],
        "is damaged: checksum",
    );
    let dir_at = u64::from_le_bytes(bytes[32..40].try_into().unwrap()) as usize;
    let mut bad_dir = bytes.clone();
    bad_dir[dir_at + 100] ^= 0x01;
    let bad_dir_path = dir.file("bad_dir.syn", &bad_dir);
    fails(
        &["run", bad_dir_path.to_str().unwrap(), "hi"],
        "the directory is damaged",
    );
    let cut = dir.file("cut.syn", &bytes[..bytes.len() / 2]);
    fails(&["inspect", cut.to_str().unwrap()], "truncated");
    fails(&["run", cut.to_str().unwrap(), "hi"], "truncated");
}

#[test]
fn convert_bad_requests_are_one_line_errors() {
    let dir = Scratch::new("syn-bad");
    let gguf = model("gemma-3-270m-q4_k_m.gguf");
    fails(
        &["convert", &gguf, &dir.path("out.bin")],
        "cannot tell the container",
    );
    fails(
        &["convert", &gguf, &gguf, "--to", "gguf"],
        "would overwrite the input",
    );
    fails(&["inspect", &gguf, "--verify"], "has no checksums");
    fails(
        &["convert", &dir.path("missing.gguf"), &dir.path("o.syn")],
        "cannot open",
    );
    let st = dir.file("m.safetensors", b"");
    fails(
        &["convert", st.to_str().unwrap(), &dir.path("o.syn")],
        "whole Hugging Face model directory",
    );
    // A directory that is no model at all.
    fails(
        &["convert", dir.0.to_str().unwrap(), &dir.path("o.syn")],
        "directory",
    );
    fails(
        &["convert", &gguf, &dir.path("o.syn"), "--to", "onnx"],
        "invalid value",
    );
}
