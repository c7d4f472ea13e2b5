//! The Piper voice en_US-joe-medium against onnxruntime running the same ONNX file
//! (`scripts/reference/make_piper_goldens.py`): for piper's own phoneme ids of each case, the
//! same frames per phoneme and the same samples within a small tolerance, with the noise off
//! (the graph is deterministic) and on (the golden script feeds onnxruntime the Gaussian sequence
//! [`GaussianNoise`] draws from the case's seed).
//!
//! Needs the voice: `scripts/fetch-models.sh piper-en-us-joe-medium` (CI runs it first).

use std::path::PathBuf;

use synaptix_bundle::cache;
use synaptix_models::vits::{GaussianNoise, Scales, VitsVoice};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/piper")
}

fn voice() -> Option<VitsVoice> {
    let dir = cache::models_dir().join("piper-en-us-joe-medium");
    if !dir.is_dir() {
        eprintln!(
            "SKIPPED: piper-en-us-joe-medium not found in {} (run scripts/fetch-models.sh)",
            dir.display()
        );
        return None;
    }
    Some(VitsVoice::load(&dir).expect("the voice loads"))
}

fn read_f32(name: &str) -> Vec<f32> {
    std::fs::read(fixtures().join(name))
        .expect("golden audio")
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

#[test]
fn joe_medium_matches_onnxruntime() {
    let Some(voice) = voice() else { return };
    assert_eq!(voice.sample_rate(), 22050);
    assert_eq!(voice.hop_length(), 256);
    let text = std::fs::read_to_string(fixtures().join("vits_goldens.json")).expect("goldens");
    let golden: serde_json::Value = serde_json::from_str(&text).expect("valid json");
    for case in golden["cases"].as_array().expect("cases") {
        let name = case["name"].as_str().expect("name");
        let ids: Vec<i64> = case["ids"]
            .as_array()
            .expect("ids")
            .iter()
            .map(|v| v.as_i64().expect("id"))
            .collect();
        let s: Vec<f32> = case["scales"]
            .as_array()
            .expect("scales")
            .iter()
            .map(|v| v.as_f64().expect("scale") as f32)
            .collect();
        let scales = Scales {
            noise_scale: s[0],
            length_scale: s[1],
            noise_w: s[2],
        };
        let mut noise = GaussianNoise::new(case["seed"].as_u64().unwrap_or(0));
        let out = voice
            .synthesize(&ids, scales, &mut noise)
            .expect("synthesis");
        let want_durations: Vec<usize> = case["durations"]
            .as_array()
            .expect("durations")
            .iter()
            .map(|v| v.as_u64().expect("frames") as usize)
            .collect();
        assert_eq!(out.durations, want_durations, "{name}: frames per phoneme");
        let want = read_f32(case["audio_file"].as_str().expect("file"));
        assert_eq!(out.audio.len(), want.len(), "{name}: samples");
        let peak = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        let (mut max_err, mut sq_err, mut sq) = (0f32, 0f64, 0f64);
        for (a, b) in out.audio.iter().zip(&want) {
            max_err = max_err.max((a - b).abs());
            sq_err += ((a - b) as f64).powi(2);
            sq += (*b as f64).powi(2);
        }
        let rel_rms = (sq_err / sq).sqrt();
        eprintln!(
            "{name}: max |diff| {max_err:.2e} (peak {peak:.3}), relative RMS error {rel_rms:.2e}"
        );
        assert!(
            max_err <= 2.5e-4 * peak,
            "{name}: max |diff| {max_err} vs peak {peak}"
        );
        assert!(rel_rms <= 2e-4, "{name}: relative RMS error {rel_rms}");
    }
}
