//! Shared by the tests that run a model directory against a reference's golden file (written
//! by the scripts in scripts/reference/): each case's prompt ids, float32 logits after the
//! prompt and greedy continuation.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use synaptix_models::{Logits, NoTap};
use synaptix_tokenizer::Tokenizer;

/// `tests/fixtures/<kind>` of the workspace.
pub fn fixtures(kind: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(kind)
}

pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// Normalised squared error of `got` against `want`.
pub fn nmse(got: &[f32], want: &[f32]) -> f64 {
    let err: f64 = got
        .iter()
        .zip(want)
        .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
        .sum();
    let norm: f64 = want.iter().map(|b| (*b as f64).powi(2)).sum();
    err / norm
}

/// Opens `dir` (its format reported as `label`), checks the architecture, then for each case of
/// `golden`: the tokenizer's prompt ids, the logits within `max_nmse`, and the greedy tokens.
pub fn check_golden(dir: &Path, golden: &Path, label: &str, arch: &str, max_nmse: f64) {
    let name = dir.file_name().unwrap().to_string_lossy().into_owned();
    let golden: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(golden).unwrap()).unwrap();
    let file = Arc::new(synaptix_models::open_model_file(dir).unwrap());
    assert_eq!(file.format_label(), label);
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
        eprintln!("{name}: logits NMSE {e:.3e} against the reference");
        assert!(e < max_nmse, "{name}: logits NMSE {e:e} ≥ {max_nmse:e}");
        if let Some(steps) = case.get("step_logits").and_then(|s| s.as_array()) {
            teacher_forced(
                &name,
                &*model,
                cache.as_mut(),
                logits,
                case,
                steps,
                max_nmse,
            );
            continue;
        }
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
        assert_eq!(got, want, "{name}: greedy tokens against the reference");
    }
}

/// A reference top-two margin below which a float rounding may pick the other token.
const NEAR_TIE: f64 = 0.005;

/// Feeds the reference's own tokens after the prompt (already in `cache`, its logits
/// `prompt_logits`) and checks the logits of every step within `max_nmse`, and the greedy choice
/// wherever the reference's margin is not a near-tie.
fn teacher_forced(
    name: &str,
    model: &dyn synaptix_models::CausalLm,
    cache: &mut dyn synaptix_models::Cache,
    prompt_logits: Vec<f32>,
    case: &serde_json::Value,
    steps: &[serde_json::Value],
    max_nmse: f64,
) {
    let want = ids(&case["generated"]);
    let margins: Vec<f64> = case["margins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_f64().unwrap())
        .collect();
    assert_eq!(steps.len(), want.len());
    let mut logits = prompt_logits;
    let mut worst = 0f64;
    for (i, step) in steps.iter().enumerate() {
        if i > 0 {
            logits = model
                .forward(&[want[i - 1]], &mut *cache, Logits::Last, &mut NoTap)
                .unwrap();
        }
        let reference: Vec<f32> = step
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect();
        let e = nmse(&logits, &reference);
        worst = worst.max(e);
        assert!(
            e < max_nmse,
            "{name}: step {i}: logits NMSE {e:e} ≥ {max_nmse:e}"
        );
        let got = synaptix_sample::argmax(&logits);
        if margins[i] >= NEAR_TIE {
            assert_eq!(
                got, want[i],
                "{name}: step {i}: greedy token against the reference"
            );
        } else if got != want[i] {
            eprintln!(
                "{name}: step {i}: {got} for the reference's {} (margin {:.4}, a near-tie)",
                want[i], margins[i]
            );
        }
    }
    eprintln!(
        "{name}: worst teacher-forced step NMSE {worst:.3e} over {} steps",
        steps.len()
    );
}
