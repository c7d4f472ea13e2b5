//! Hugging Face directories (safetensors) against transformers: tiny random-weight Llama, Qwen2,
//! Qwen3 and Gemma 3 checkpoints saved by `save_pretrained`
//! (`scripts/reference/make_hf_models.py`; Mistral by `make_symb_models.py`), with transformers' float32 logits after each prompt
//! and its greedy continuation. The tokenizer travels in the model's metadata and must give the
//! same prompt ids as transformers' tokenizer.

mod common;

use common::{check_golden, fixtures};
use synaptix_tokenizer::Tokenizer;

/// `max_nmse`: the weights are exact in f32 for every stored type; what differs from
/// transformers' float32 run is the KV cache (F16, as in llama.cpp), the order of sums and, for
/// F16/BF16 matrices, activations rounded to the weights' type in the half-precision dot
/// products. Measured: BF16 4e-5 to 2.2e-4, F16 1.2e-6, F32 1.0e-6. A wrong model is far off:
/// the Llama file read without its llama3 RoPE scaling gives 0.51.
fn check(name: &str, arch: &str, max_nmse: f64) {
    let dir = fixtures("hf").join(name);
    let golden = fixtures("hf").join(format!("{name}.json"));
    check_golden(&dir, &golden, "safetensors (Hugging Face)", arch, max_nmse);
}

#[test]
fn llama_from_safetensors_matches_transformers() {
    check("llama-tiny", "llama", 1e-3);
}

/// `mistral` is read as `llama` (no RoPE scaling here; hidden size 128; F16). Measured 1.1e-5:
/// its tied embeddings make small logits, on which the F16 KV cache weighs more.
#[test]
fn mistral_from_safetensors_matches_transformers() {
    check("mistral-tiny", "llama", 1e-4);
}

#[test]
fn qwen2_from_safetensors_matches_transformers() {
    check("qwen2-tiny", "qwen2", 1e-3);
}

/// The same checkpoint in three shards listed by `model.safetensors.index.json`
/// (`scripts/reference/make_sharded_model.py`): the same goldens.
#[test]
fn sharded_safetensors_read_as_one() {
    let dir = fixtures("hf").join("qwen2-tiny-sharded");
    let golden = fixtures("hf").join("qwen2-tiny.json");
    check_golden(&dir, &golden, "safetensors (Hugging Face)", "qwen2", 1e-3);
    let whole = synaptix_models::open_model_file(&fixtures("hf").join("qwen2-tiny")).unwrap();
    let shards = synaptix_models::open_model_file(&dir).unwrap();
    assert_eq!(whole.tensors().len(), shards.tensors().len());
    for t in whole.tensors() {
        let s = shards.tensor_info(&t.name).unwrap();
        assert_eq!(whole.tensor_bytes(t), shards.tensor_bytes(s), "{}", t.name);
    }
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
        &std::fs::read_to_string(fixtures("tokenizer").join("corpus.json")).unwrap(),
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
        let file = synaptix_models::open_model_file(&fixtures("hf").join(name)).unwrap();
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

/// Mixture-of-experts directories (`scripts/reference/make_moe_models.py`): the same F16 values
/// as the GGUF files of tests/fixtures/moe, whose goldens they share. Mixtral's in the
/// published checkpoints' layout (one tensor per expert, `block_sparse_moe`), Qwen3-MoE's as
/// transformers 5 saves it (each layer's experts fused).
#[test]
fn moe_directories_match_transformers() {
    for (name, arch) in [
        ("mixtral-tiny", "llama"),
        ("qwen3moe-tiny", "qwen3moe"),
        ("qwen2moe-tiny", "qwen2moe"),
    ] {
        let dir = fixtures("hf").join(name);
        let golden = fixtures("moe").join(format!("{name}.json"));
        check_golden(&dir, &golden, "safetensors (Hugging Face)", arch, 1e-4);
    }
}
