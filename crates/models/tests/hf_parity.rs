//! Hugging Face directories (safetensors) against transformers: tiny random-weight Llama, Qwen2,
//! Qwen3 and Gemma 3 checkpoints saved by `save_pretrained`
//! (`scripts/reference/make_hf_models.py`), with transformers' float32 logits after each prompt
//! and its greedy continuation. The tokenizer travels in the model's metadata and must give the
//! same prompt ids as transformers' tokenizer.

use std::path::PathBuf;
use std::sync::Arc;

use synaptix_models::{Logits, NoTap};
use synaptix_tokenizer::Tokenizer;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/hf")
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// Normalised squared error of `got` against `want`.
fn nmse(got: &[f32], want: &[f32]) -> f64 {
    let err: f64 = got
        .iter()
        .zip(want)
        .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
        .sum();
    let norm: f64 = want.iter().map(|b| (*b as f64).powi(2)).sum();
    err / norm
}

/// `max_nmse`: the weights are exact in f32 for every stored type; what differs from
/// transformers' float32 run is the KV cache (F16, as in llama.cpp), the order of sums and, for
/// F16/BF16 matrices, activations rounded to the weights' type in the half-precision dot
/// products. Measured: BF16 4e-5 to 2.2e-4, F16 1.2e-6, F32 1.0e-6. A wrong model is far off:
/// the Llama file read without its llama3 RoPE scaling gives 0.51.
fn check(name: &str, arch: &str, max_nmse: f64) {
    let dir = fixtures().join(name);
    let golden: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join(format!("{name}.json"))).unwrap(),
    )
    .unwrap();
    let file = Arc::new(synaptix_models::open_model_file(&dir).unwrap());
    assert_eq!(file.format_label(), "safetensors (Hugging Face)");
    let tokenizer = Tokenizer::from_gguf(&file).unwrap();
    let model = synaptix_models::load(file).unwrap();
    assert_eq!(model.info().architecture, arch);
    for case in golden["cases"].as_array().unwrap() {
        let prompt = ids(&case["prompt_ids"]);
        let text = case["prompt"].as_str().unwrap();
        assert_eq!(
            tokenizer.encode(text, true, true).unwrap(),
            prompt,
            "{name}: prompt ids"
        );
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
        let e = nmse(&logits, &reference);
        eprintln!("{name}: logits NMSE {e:.3e} against transformers");
        assert!(e < max_nmse, "{name}: logits NMSE {e:e} ≥ {max_nmse:e}");
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
        assert_eq!(got, want, "{name}: greedy tokens against transformers");
    }
}

#[test]
fn llama_from_safetensors_matches_transformers() {
    check("llama-tiny", "llama", 1e-3);
}

#[test]
fn qwen2_from_safetensors_matches_transformers() {
    check("qwen2-tiny", "qwen2", 1e-3);
}

#[test]
fn qwen3_from_safetensors_matches_transformers() {
    check("qwen3-tiny", "qwen3", 2e-5);
}

#[test]
fn gemma3_from_safetensors_matches_transformers() {
    check("gemma3-tiny", "gemma3", 2e-5);
}

/// The byte-level BPE tokenizers also become llama.cpp's `tokenizer.ggml.*` vocabulary, which
/// must split the tokenizer corpus exactly as the `tokenizer.json` it came from.
#[test]
fn gguf_vocabulary_from_tokenizer_json_tokenizes_alike() {
    let corpus: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("../tokenizer/corpus.json")).unwrap(),
    )
    .unwrap();
    let texts: Vec<&str> = corpus["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["text"].as_str().unwrap())
        .collect();
    assert!(texts.len() > 50);
    for name in ["llama-tiny", "qwen2-tiny"] {
        let file = synaptix_models::open_model_file(&fixtures().join(name)).unwrap();
        assert_eq!(file.get_str("tokenizer.ggml.pre").unwrap(), Some("gpt-2"));
        let hf = Tokenizer::from_gguf(&file).unwrap();
        let ggml = Tokenizer::from_gguf_vocab(&file).unwrap();
        assert_eq!(hf.kind(), synaptix_tokenizer::TokenizerKind::HuggingFace);
        assert!(matches!(
            ggml.kind(),
            synaptix_tokenizer::TokenizerKind::ByteLevelBpe(_)
        ));
        for text in &texts {
            assert_eq!(
                ggml.encode(text, true, false).unwrap(),
                hf.encode(text, true, false).unwrap(),
                "{name}: {text:?}"
            );
        }
    }
}
