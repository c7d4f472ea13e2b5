//! Hugging Face LLM directories through the binary: `run` on the directory gives
//! transformers' greedy tokens (`tests/fixtures/hf`, see `scripts/reference/make_hf_models.py`),
//! `convert` writes `.syn` and GGUF files that give the same tokens, and broken directories are
//! one-line errors.

use std::path::{Path, PathBuf};

mod common;
use common::{fails, fixtures, greedy_run as greedy, ids as json_ids, p, synaptix, Scratch};

fn fixture(name: &str) -> PathBuf {
    fixtures("hf").join(name)
}

fn golden(name: &str) -> Vec<(String, Vec<u64>, Vec<u64>)> {
    let g: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture(&format!("{name}.json"))).unwrap())
            .unwrap();
    g["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["prompt"].as_str().unwrap().to_string(),
                json_ids(&c["prompt_ids"]),
                json_ids(&c["generated"]),
            )
        })
        .collect()
}

#[test]
fn run_and_convert_hf_directories() {
    let s = Scratch::new("hf-convert");
    for name in ["llama-tiny", "qwen2-tiny", "qwen3-tiny", "gemma3-tiny"] {
        let dir = fixture(name);
        let syn = s.path(&format!("{name}.syn"));
        let gguf = s.path(&format!("{name}.gguf"));
        for out in [&syn, &gguf] {
            let r = synaptix(&["convert", p(&dir), out]);
            assert!(
                r.status.success(),
                "convert {name} -> {out}: {}",
                String::from_utf8_lossy(&r.stderr)
            );
        }
        for (prompt, prompt_ids, generated) in golden(name) {
            for model in [p(&dir), syn.as_str(), gguf.as_str()] {
                let (ids, tokens) = greedy(model, &prompt, generated.len());
                assert_eq!(ids, prompt_ids, "{model}: prompt ids");
                assert_eq!(
                    tokens, generated,
                    "{model}: greedy tokens against transformers"
                );
            }
        }
        let out = synaptix(&["inspect", &syn, "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let text = v.to_string();
        assert!(
            text.contains("tokenizer.huggingface.json"),
            "{name}: {text:.400}"
        );
    }
    // The chat template travels from tokenizer_config.json.
    let out = synaptix(&["inspect", p(&fixture("qwen2-tiny")), "--json"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("<|im_start|>"));
}

/// Copies a fixture directory into `s` under `name` so that a test can break it.
fn copy_fixture(s: &Scratch, from: &str, name: &str) -> PathBuf {
    let dst = s.0.join(name);
    std::fs::create_dir_all(&dst).unwrap();
    for e in std::fs::read_dir(fixture(from)).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
    dst
}

fn edit_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&path, v.to_string()).unwrap();
}

#[test]
fn broken_hf_directories_are_one_line_errors() {
    let s = Scratch::new("hf-bad");

    let d = copy_fixture(&s, "qwen2-tiny", "neox");
    edit_config(&d, |v| v["model_type"] = "gpt_neox".into());
    fails(&["run", p(&d), "hi"], "unsupported architecture 'gpt_neox'");

    let d = copy_fixture(&s, "qwen2-tiny", "notok");
    std::fs::remove_file(d.join("tokenizer.json")).unwrap();
    fails(&["run", p(&d), "hi"], "tokenizer.json");

    let d = copy_fixture(&s, "qwen2-tiny", "nolayers");
    edit_config(&d, |v| {
        v.as_object_mut().unwrap().remove("num_hidden_layers");
    });
    fails(&["run", p(&d), "hi"], "missing num_hidden_layers");

    let d = copy_fixture(&s, "qwen2-tiny", "yarn");
    edit_config(&d, |v| {
        v["rope_parameters"] = serde_json::json!({"rope_type": "yarn", "factor": 4.0});
    });
    fails(
        &["run", p(&d), "hi"],
        "rope scaling 'yarn' is not supported",
    );

    let d = copy_fixture(&s, "qwen2-tiny", "gelu");
    edit_config(&d, |v| v["hidden_act"] = "gelu".into());
    fails(&["run", p(&d), "hi"], "hidden activation 'gelu'");

    let d = copy_fixture(&s, "gemma3-tiny", "gemma-extra");
    // Gemma's extra norms are not part of a Qwen2 block.
    edit_config(&d, |v| {
        v["model_type"] = "qwen2".into();
        v["hidden_activation"] = "silu".into();
    });
    fails(
        &["run", p(&d), "hi"],
        "feedforward_layernorm.weight is not part of a qwen2 model",
    );

    let d = copy_fixture(&s, "qwen2-tiny", "truncated");
    let st = d.join("model.safetensors");
    let bytes = std::fs::read(&st).unwrap();
    std::fs::write(&st, &bytes[..bytes.len() / 2]).unwrap();
    fails(&["run", p(&d), "hi"], "model.safetensors");

    let d = copy_fixture(&s, "qwen2-tiny-sharded", "lostshard");
    std::fs::remove_file(d.join("model-00002-of-00003.safetensors")).unwrap();
    fails(&["run", p(&d), "hi"], "model-00002-of-00003.safetensors");

    let d = copy_fixture(&s, "qwen2-tiny-sharded", "escaping-index");
    let index = d.join("model.safetensors.index.json");
    let text = std::fs::read_to_string(&index).unwrap();
    std::fs::write(
        &index,
        text.replacen("model-00001-of-00003.safetensors", "../x.safetensors", 1),
    )
    .unwrap();
    fails(&["run", p(&d), "hi"], "weight_map names an odd file");

    let d = copy_fixture(&s, "qwen2-tiny", "badjson");
    std::fs::write(d.join("config.json"), b"{ not json").unwrap();
    fails(&["run", p(&d), "hi"], "config.json");

    fails(
        &[
            "convert",
            p(&fixture("qwen2-tiny").join("model.safetensors")),
            &s.path("x.syn"),
        ],
        "whole Hugging Face model directory",
    );
}

/// Mixture-of-experts directories (Mixtral in the published per-expert layout, Qwen3-MoE
/// fused): `run` on the directory and on its GGUF conversion gives transformers' greedy tokens
/// for the first prompt (tests/fixtures/moe holds the goldens), and the GGUF carries llama.cpp's
/// expert keys.
#[test]
fn run_and_convert_moe_directories() {
    let s = Scratch::new("hf-moe");
    for (name, arch) in [
        ("mixtral-tiny", "llama"),
        ("qwen3moe-tiny", "qwen3moe"),
        ("qwen2moe-tiny", "qwen2moe"),
    ] {
        let dir = fixture(name);
        let g: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(fixture(&format!("../moe/{name}.json"))).unwrap(),
        )
        .unwrap();
        let case = &g["cases"][0];
        assert!(case["margins"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m.as_f64().unwrap() > 0.02));
        let want = json_ids(&case["generated"]);
        let prompt = case["prompt"].as_str().unwrap();
        let gguf = s.path(&format!("{name}.gguf"));
        let r = synaptix(&["convert", p(&dir), &gguf]);
        assert!(
            r.status.success(),
            "convert {name}: {}",
            String::from_utf8_lossy(&r.stderr)
        );
        for model in [p(&dir), gguf.as_str()] {
            let (ids, tokens) = greedy(model, prompt, want.len());
            assert_eq!(ids, json_ids(&case["prompt_ids"]), "{model}: prompt ids");
            assert_eq!(tokens, want, "{model}: greedy tokens against transformers");
        }
        let out = synaptix(&["inspect", &gguf, "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["metadata"]["general.architecture"], arch);
        assert!(
            v["metadata"][format!("{arch}.expert_count")]
                .as_u64()
                .unwrap()
                >= 4
        );
    }
}
