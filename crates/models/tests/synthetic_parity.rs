//! Llama and Qwen3 have no real model in the test set: tiny random-weight files in every
//! executed weight format (`scripts/reference/make_synthetic_models.py`) stand in, checked
//! against llama.cpp's portable build: the same first-step logits, bit for bit, and the same 16
//! greedy tokens.

use std::path::PathBuf;
use std::sync::Arc;

use synaptix_bundle::GgufFile;
use synaptix_models::{Logits, NoTap};

fn check(arch: &str) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/synthetic");
    let golden: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join(format!("{arch}-tiny.json"))).unwrap(),
    )
    .unwrap();
    let file = Arc::new(GgufFile::open(dir.join(format!("{arch}-tiny.gguf"))).unwrap());
    let model = synaptix_models::load(file).unwrap();
    assert_eq!(model.info().architecture, arch);
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    for case in golden["cases"].as_array().unwrap() {
        let prompt = ids(&case["prompt_ids"]);
        let want = ids(&case["generated"]);
        let reference: Vec<f32> = case["logits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect();
        let mut cache = model.new_cache(256).unwrap();
        let mut logits = model
            .forward(&prompt, cache.as_mut(), Logits::Last, &mut NoTap)
            .unwrap();
        assert_eq!(logits.len(), reference.len());
        let differing = logits
            .iter()
            .zip(&reference)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        let max_diff = logits
            .iter()
            .zip(&reference)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert_eq!(
            differing, 0,
            "{arch}: {differing} logits differ from llama.cpp (max |diff| {max_diff:e})"
        );
        let mut got = Vec::new();
        loop {
            let t = synaptix_sample::argmax(&logits);
            got.push(t);
            if got.len() == want.len() {
                break;
            }
            logits = model
                .forward(&[t], cache.as_mut(), Logits::Last, &mut NoTap)
                .unwrap();
        }
        assert_eq!(got, want, "{arch}: greedy tokens");
    }
}

#[test]
fn llama_tiny_matches_llama_cpp_exactly() {
    check("llama");
}

#[test]
fn qwen3_tiny_matches_llama_cpp_exactly() {
    check("qwen3");
}
