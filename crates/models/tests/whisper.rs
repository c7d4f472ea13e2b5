//! Whisper base against CTranslate2's goldens (`scripts/reference/make_whisper_goldens.py`):
//! speech synthesized by espeak-ng, stored as a 16 kHz WAV, transcribed greedily by ctranslate2
//! in float32. The same language, the same tokens, and the first step's largest logits within
//! 1e-4 (relative) of the reference's.
//!
//! Needs the model: `scripts/fetch-models.sh whisper-base` (CI runs it first).

use std::path::PathBuf;

use synaptix_bundle::cache;
use synaptix_models::whisper::{Whisper, WhisperFiles, WhisperTokens, WINDOW_FRAMES};
use synaptix_tokenizer::Tokenizer;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/whisper")
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("id array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

#[test]
fn whisper_base_matches_ctranslate2() {
    let dir = cache::models_dir().join("whisper-base");
    let Ok(files) = WhisperFiles::in_dir(&dir) else {
        eprintln!(
            "SKIPPED: whisper-base not found in {} (run scripts/fetch-models.sh whisper-base)",
            dir.display()
        );
        return;
    };
    let text = std::fs::read_to_string(fixtures().join("goldens.json")).expect("goldens.json");
    let golden: serde_json::Value = serde_json::from_str(&text).expect("valid json");
    let tokenizer = Tokenizer::from_tokenizer_json(&files.tokenizer).expect("tokenizer.json");
    let tokens = WhisperTokens::from_config(&files.config, &|t| tokenizer.token_id(t), &|id| {
        tokenizer
            .piece(id)
            .map(|p| String::from_utf8_lossy(p).into_owned())
    })
    .expect("config.json");
    let model = Whisper::load(&files.model).expect("model.bin");
    assert_eq!(model.dims().n_mels, 80);

    for clip in golden["clips"].as_array().expect("clips") {
        let wav = fixtures().join(clip["wav"].as_str().expect("wav"));
        let audio = synaptix_audio::read_wav(&wav).expect("wav fixture");
        assert_eq!(audio.sample_rate, 16_000);
        let mel = synaptix_audio::whisper_log_mel(&audio.samples, 80).expect("mel");
        let len = (mel.frames - 1).min(WINDOW_FRAMES);
        let mut window = vec![0f32; 80 * WINDOW_FRAMES];
        for (c, row) in window.chunks_exact_mut(WINDOW_FRAMES).enumerate() {
            row[..len].copy_from_slice(&mel.values[c * mel.frames..c * mel.frames + len]);
        }
        let encoded = model.encode(&window).expect("encode");

        let (language, p) = model.detect_language(&encoded, &tokens).expect("language");
        assert_eq!(language, clip["language"].as_str().expect("language"));
        let p_ref = clip["language_probability"].as_f64().expect("probability") as f32;
        eprintln!("language {language}: p {p:.4} (ctranslate2 {p_ref:.4})");

        let prompt = ids(&clip["prompt"]);
        assert_eq!(
            prompt[1],
            tokens.language(&language).expect("language token")
        );
        let mut streamed = Vec::new();
        let (got, first) = model
            .generate(&encoded, &prompt, &tokens, &mut |id| streamed.push(id))
            .expect("generate");
        let text = String::from_utf8_lossy(&tokenizer.detokenize(&got, true, false)).to_string();
        eprintln!("transcript: {text}");
        assert_eq!(
            got,
            ids(&clip["tokens"]),
            "tokens differ from ctranslate2's: {text:?}"
        );
        assert_eq!(streamed, got);
        assert_eq!(text, clip["text"].as_str().expect("text"));

        let mut worst = 0f32;
        for pair in clip["first_step_top"].as_array().expect("first_step_top") {
            let id = pair[0].as_u64().expect("id") as usize;
            let want = pair[1].as_f64().expect("logit") as f32;
            worst = worst.max((first[id] - want).abs() / want.abs().max(1.0));
        }
        eprintln!("first step: largest relative logit difference {worst:.2e}");
        assert!(
            worst < 1e-4,
            "first-step logits differ from ctranslate2's by {worst}"
        );
    }
}
