//! The Whisper base model against CTranslate2's goldens (`scripts/reference/make_whisper_goldens.py`):
//! speech synthesized by espeak-ng, stored as a 16 kHz WAV, run by ctranslate2 in float32. The
//! same detected language, and the first decoding step's largest logits within 1e-4 (relative)
//! of the reference's; a step of several sequences gives each one's logits of a step alone.
//! Decoding (greedy and beam search, timestamps, segments) is tested in synaptix-infer.
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
        let mut cache = model.new_cache();
        let first = model.decode(&encoded, &mut cache, &prompt).expect("decode");
        assert_eq!(cache.len(), prompt.len());
        let want = ids(&clip["tokens"]);

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

        // One step of two sequences (the prompt, and the prompt with the first reference token
        // after it) gives each sequence's logits of a step alone.
        let mut pair = [cache.clone(), cache.clone()];
        model
            .decode(&encoded, &mut pair[1], &want[..1])
            .expect("decode");
        let both = model
            .decode_step(&encoded, &mut pair, &[want[0], want[1]])
            .expect("decode_step");
        let vocab = model.dims().vocab;
        let alone = model
            .decode(&encoded, &mut cache, &[want[0]])
            .expect("decode");
        assert_eq!(&both[..vocab], &alone[..]);
        let alone = model
            .decode(&encoded, &mut cache, &[want[1]])
            .expect("decode");
        assert_eq!(&both[vocab..], &alone[..]);
        assert_eq!(
            (pair[0].len(), pair[1].len()),
            (prompt.len() + 1, prompt.len() + 2)
        );
    }
}
