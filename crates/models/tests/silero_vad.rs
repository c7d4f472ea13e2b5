//! Silero VAD v6 (faster-whisper's `silero_vad_v6.onnx`) against onnxruntime running the same
//! file as faster-whisper 1.2.1 calls it (`scripts/reference/make_whisper_vad_goldens.py`): every
//! 32 ms chunk's speech probability on the three Whisper test inputs (12.1, 51.5 and 65.1 s, with
//! speech and long silences).
//!
//! Needs the model: `scripts/fetch-models.sh silero-vad` (CI runs it first).

use std::path::PathBuf;

use synaptix_bundle::cache;
use synaptix_models::silero_vad::SileroVad;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/whisper")
}

/// The clip's samples assembled as the goldens' `parts` say.
fn assemble(clip: &[f32], parts: &serde_json::Value) -> Vec<f32> {
    let mut out = Vec::new();
    for part in parts.as_array().expect("parts") {
        if let Some(n) = part.get("zeros") {
            out.resize(out.len() + n.as_u64().expect("zeros") as usize, 0.0);
        } else {
            let range = &part["clip"];
            let from = range[0].as_u64().expect("from") as usize;
            let to = range[1].as_u64().map_or(clip.len(), |t| t as usize);
            out.extend_from_slice(&clip[from..to]);
        }
    }
    out
}

#[test]
fn speech_probabilities_match_onnxruntime() {
    let path = cache::models_dir().join("silero_vad_v6.onnx");
    if !path.exists() {
        eprintln!(
            "SKIPPED: {} not found (run scripts/fetch-models.sh silero-vad)",
            path.display()
        );
        return;
    }
    let vad = SileroVad::load(&path).expect("the VAD loads");
    let text = std::fs::read_to_string(fixtures().join("vad.json")).expect("vad.json");
    let golden: serde_json::Value = serde_json::from_str(&text).expect("valid json");
    let clip = synaptix_audio::read_wav(&fixtures().join("speech16k.wav")).expect("wav fixture");
    for case in golden["clips"].as_array().expect("clips") {
        let name = case["name"].as_str().expect("name");
        let audio = assemble(&clip.samples, &case["parts"]);
        let got = vad.speech_probs(&audio).expect("probabilities");
        let want: Vec<f64> = case["speech_probs"]
            .as_array()
            .expect("probs")
            .iter()
            .map(|v| v.as_f64().expect("prob"))
            .collect();
        assert_eq!(got.len(), want.len(), "{name}: chunks");
        let worst = got
            .iter()
            .zip(&want)
            .map(|(&a, &b)| (a as f64 - b).abs())
            .fold(0.0, f64::max);
        eprintln!(
            "{name}: {} chunks, largest difference {worst:.2e}",
            got.len()
        );
        assert!(worst < 1e-4, "{name}: largest difference {worst}");
    }
}
