//! The real models against llama.cpp's goldens (`scripts/reference/make_model_goldens.py`,
//! llama.cpp's portable build): for every prompt, the first-step logits bit-identical (so far
//! inside the required normalised MSE of 1e-4) and the same 32 greedy tokens. Token ids come from the goldens, so this checks the model alone (the
//! tokenizer has its own golden test).
//!
//! Needs the models: `scripts/fetch-models.sh` (CI runs it first).

use std::path::PathBuf;
use std::sync::Arc;

use synaptix_bundle::{cache, GgufFile};
use synaptix_models::{Logits, NoTap};

const MAX_NMSE: f64 = 1e-4;

struct Golden {
    prompts: Vec<(String, Vec<u32>, Vec<u32>)>,
    file: String,
    logits: Vec<(Vec<u32>, Vec<f32>)>,
}

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/goldens")
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("id array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

fn load_golden(name: &str) -> Golden {
    let text =
        std::fs::read_to_string(fixtures().join(format!("{name}.json"))).expect("golden json");
    let g: serde_json::Value = serde_json::from_str(&text).expect("valid json");
    let prompts = g["prompts"]
        .as_array()
        .expect("prompts")
        .iter()
        .map(|p| {
            (
                p["prompt"].as_str().expect("prompt").to_string(),
                ids(&p["prompt_ids"]),
                ids(&p["generated"]),
            )
        })
        .collect::<Vec<_>>();
    let blob =
        std::fs::read(fixtures().join(g["logits"].as_str().expect("logits"))).expect("logits bin");
    let mut logits = Vec::new();
    let mut at = 0;
    let u32_at = |i: usize| u32::from_le_bytes(blob[i..i + 4].try_into().unwrap());
    while at < blob.len() {
        let n = u32_at(at) as usize;
        at += 4;
        let idx: Vec<u32> = (0..n).map(|i| u32_at(at + 4 * i)).collect();
        at += 4 * n;
        let val: Vec<f32> = (0..n).map(|i| f32::from_bits(u32_at(at + 4 * i))).collect();
        at += 4 * n;
        logits.push((idx, val));
    }
    assert_eq!(logits.len(), prompts.len());
    Golden {
        prompts,
        file: g["file"].as_str().expect("file").to_string(),
        logits,
    }
}

fn open_model(file: &str) -> Arc<GgufFile> {
    let path = cache::models_dir().join(file);
    match GgufFile::open(&path) {
        Ok(f) => Arc::new(f),
        Err(e) => panic!("{e}\nrun scripts/fetch-models.sh to fetch the real models"),
    }
}

fn check_model(name: &str) {
    let golden = load_golden(name);
    let model = synaptix_models::load(open_model(&golden.file)).expect("model loads");
    let mut failures = Vec::new();
    let mut worst = 0f64;
    for ((prompt, prompt_ids, want), (idx, ref_vals)) in golden.prompts.iter().zip(&golden.logits) {
        let mut cache = model.new_cache(512).unwrap();
        let mut logits = model
            .forward(prompt_ids, cache.as_mut(), Logits::Last, &mut NoTap)
            .expect("forward");
        let (mut num, mut den, mut differing) = (0f64, 0f64, 0usize);
        for (&i, &r) in idx.iter().zip(ref_vals) {
            differing += usize::from(logits[i as usize].to_bits() != r.to_bits());
            let d = logits[i as usize] as f64 - r as f64;
            num += d * d;
            den += (r as f64) * (r as f64);
        }
        let nmse = num / den;
        worst = worst.max(nmse);
        let mut got = Vec::new();
        for _ in 0..want.len() {
            let t = synaptix_sample::argmax(&logits);
            got.push(t);
            if got.len() == want.len() {
                break;
            }
            logits = model
                .forward(&[t], cache.as_mut(), Logits::Last, &mut NoTap)
                .expect("forward");
        }
        eprintln!(
            "{name} {prompt:?}: nmse {nmse:.2e}, tokens {}",
            if &got == want { "identical" } else { "DIFFER" }
        );
        if nmse > MAX_NMSE {
            failures.push(format!(
                "{prompt:?}: first-step logits nmse {nmse:.3e} > {MAX_NMSE:e}"
            ));
        }
        if differing > 0 {
            failures.push(format!(
                "{prompt:?}: {differing} of {} sampled logits are not bit-identical (nmse {nmse:.3e})",
                idx.len()
            ));
        }
        if &got != want {
            let at = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
            failures.push(format!(
                "{prompt:?}: greedy tokens differ from llama.cpp at step {at}\n  ours:      {got:?}\n  llama.cpp: {want:?}"
            ));
        }
    }
    eprintln!(
        "{name}: worst nmse {worst:.2e} over {} prompts",
        golden.prompts.len()
    );
    assert!(failures.is_empty(), "{name}:\n{}", failures.join("\n"));
}

#[test]
fn gemma3_270m_matches_llama_cpp() {
    check_model("gemma3-270m");
}

#[test]
fn qwen25_coder_05b_matches_llama_cpp() {
    check_model("qwen2.5-coder-0.5b");
}
