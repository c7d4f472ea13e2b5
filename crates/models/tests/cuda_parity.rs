//! The CUDA backend against the CPU backend on the same files: logits after the prompt and at
//! each of 64 greedy decode steps (the CPU's tokens feed both) within a normalised MSE of 1e-3
//! (1e-2 for the tiny fixtures, whose random low-bit blocks magnify any difference); decode
//! steps replayed from CUDA graphs against the same steps run eagerly; and the real Gemma 3
//! 270M's greedy tokens (decoded through graphs, as `synaptix run` does) against llama.cpp's
//! goldens. Skips with a visible message where no GPU is present. `SYNAPTIX_CUDA_PARITY_MODELS` (paths separated by `:`) adds
//! more files, such as `synth_gguf.py`'s random-weight Qwen2.5 models.

use std::path::PathBuf;
use std::sync::Arc;

use synaptix_bundle::{cache, GgufFile};
use synaptix_core::Device;
use synaptix_kernels_cuda::{cuda_status, CudaStatus};
use synaptix_models::{CausalLm, Logits, NoTap};

const MAX_NMSE: f64 = 1e-3;
const MAX_NMSE_TINY: f64 = 1e-2;
const DECODE_STEPS: usize = 64;

fn gpu() -> bool {
    match cuda_status() {
        CudaStatus::Unavailable(why) => {
            eprintln!("SKIPPED: no usable GPU ({why})");
            false
        }
        CudaStatus::Available { .. } => true,
    }
}

fn nmse(got: &[f32], want: &[f32]) -> f64 {
    if got.iter().any(|v| !v.is_finite()) {
        return f64::INFINITY;
    }
    let num: f64 = got
        .iter()
        .zip(want)
        .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
        .sum();
    let den: f64 = want.iter().map(|b| (*b as f64).powi(2)).sum();
    num / den.max(1e-30)
}

/// The tiny synthetic models, then those `SYNAPTIX_CUDA_PARITY_MODELS` names.
fn decode_models() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/synthetic");
    let mut paths: Vec<PathBuf> = ["llama-tiny.gguf", "qwen3-tiny.gguf"]
        .iter()
        .map(|f| dir.join(f))
        .collect();
    if let Some(extra) = std::env::var_os("SYNAPTIX_CUDA_PARITY_MODELS") {
        paths.extend(std::env::split_paths(&extra));
    }
    paths
}

fn load(path: &PathBuf, device: Device) -> Box<dyn CausalLm> {
    let file = Arc::new(GgufFile::open(path).expect("model opens"));
    synaptix_models::load_on(file, device).expect("model loads")
}

/// Worst logits NMSE over the prompt and `DECODE_STEPS` greedy steps driven by the CPU.
fn compare_logits(path: &PathBuf, prompt: &[u32]) -> f64 {
    let cpu = load(path, Device::Cpu);
    let gpu = load(path, Device::Cuda(0));
    let n_ctx = prompt.len() + DECODE_STEPS + 1;
    let (mut cc, mut gc) = (cpu.new_cache(n_ctx).unwrap(), gpu.new_cache(n_ctx).unwrap());
    let mut lc = cpu
        .forward(prompt, cc.as_mut(), Logits::Last, &mut NoTap)
        .unwrap();
    let mut lg = gpu
        .forward(prompt, gc.as_mut(), Logits::Last, &mut NoTap)
        .unwrap();
    let mut worst = nmse(&lg, &lc);
    for _ in 0..DECODE_STEPS {
        let t = synaptix_sample::argmax(&lc);
        lc = cpu
            .forward(&[t], cc.as_mut(), Logits::Last, &mut NoTap)
            .unwrap();
        lg = gpu
            .forward(&[t], gc.as_mut(), Logits::Last, &mut NoTap)
            .unwrap();
        worst = worst.max(nmse(&lg, &lc));
    }
    worst
}

#[test]
fn synthetic_models_cuda_matches_cpu() {
    if !gpu() {
        return;
    }
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/synthetic");
    let mut paths: Vec<(PathBuf, f64)> = ["llama-tiny.gguf", "qwen3-tiny.gguf"]
        .iter()
        .map(|f| (dir.join(f), MAX_NMSE_TINY))
        .collect();
    if let Some(extra) = std::env::var_os("SYNAPTIX_CUDA_PARITY_MODELS") {
        paths.extend(std::env::split_paths(&extra).map(|p| (p, MAX_NMSE)));
    }
    // A short prompt (the exact prefill kernels) and a long one (from 64 rows: the f16 GEMM
    // route and the tensor-core attention).
    let prompts: Vec<Vec<u32>> = [23u32, 150]
        .iter()
        .map(|&n| (0..n).map(|i| i * 37 % 250 + 3).collect())
        .collect();
    let mut failures = Vec::new();
    for (path, limit) in &paths {
        for prompt in &prompts {
            let worst = compare_logits(path, prompt);
            eprintln!(
                "{}: worst logits nmse over a {}-token prompt + {DECODE_STEPS} steps: {worst:.2e}",
                path.display(),
                prompt.len()
            );
            if worst > *limit {
                failures.push(format!(
                    "{} ({} tokens): {worst:e} > {limit:e}",
                    path.display(),
                    prompt.len()
                ));
            }
        }
    }
    assert!(failures.is_empty(), "CUDA vs CPU logits: {failures:?}");
}

/// Greedy decode steps on the GPU through `forward_greedy` (recorded once as a CUDA graph, then
/// replayed) pick the same tokens as eager steps that return logits, over `DECODE_STEPS` steps
/// and past several KV pages; then a second cache on the same model does too (its own graph).
#[test]
fn recorded_decode_steps_match_eager_steps() {
    if !gpu() {
        return;
    }
    let paths = decode_models();
    for path in &paths {
        let model = load(path, Device::Cuda(0));
        for (round, prompt_len) in [(0, 11usize), (1, 5)] {
            let prompt: Vec<u32> = (0..prompt_len)
                .map(|i| (i * 53 % 240 + 5 + round) as u32)
                .collect();
            let n_ctx = prompt.len() + DECODE_STEPS + 1;
            let mut eager_cache = model.new_cache(n_ctx).unwrap();
            let mut logits = model
                .forward(&prompt, eager_cache.as_mut(), Logits::Last, &mut NoTap)
                .unwrap();
            let mut eager = vec![synaptix_sample::argmax(&logits)];
            for _ in 0..DECODE_STEPS {
                logits = model
                    .forward(
                        &[*eager.last().unwrap()],
                        eager_cache.as_mut(),
                        Logits::Last,
                        &mut NoTap,
                    )
                    .unwrap();
                eager.push(synaptix_sample::argmax(&logits));
            }
            let mut cache = model.new_cache(n_ctx).unwrap();
            let mut replayed = vec![model.forward_greedy(&prompt, cache.as_mut()).unwrap()];
            for _ in 0..DECODE_STEPS {
                let last = *replayed.last().unwrap();
                replayed.push(model.forward_greedy(&[last], cache.as_mut()).unwrap());
            }
            assert_eq!(cache.len(), eager_cache.len());
            assert_eq!(
                replayed,
                eager,
                "{} (round {round}): replayed decode steps pick other tokens",
                path.display()
            );
        }
        eprintln!(
            "{}: replayed decode steps identical to eager ones",
            path.display()
        );
    }
}

/// Greedy decode steps launched ahead on the device's own pick (`forward_pick_more` with
/// `more` set: the next step runs before the host has read this one's pick) pick the same tokens
/// as steps run one at a time, also when the caller then feeds another token than the pick,
/// empties part of the cache, or runs the cache full (the last step may not launch one ahead).
#[test]
fn steps_launched_ahead_match_single_steps() {
    if !gpu() {
        return;
    }
    let paths = decode_models();
    let greedy = synaptix_sample::DevicePick::GREEDY;
    for path in &paths {
        let model = load(path, Device::Cuda(0));
        let prompt: Vec<u32> = (0..7).map(|i| (i * 37 % 240 + 3) as u32).collect();
        let n_ctx = prompt.len() + DECODE_STEPS;
        let run = |ahead: bool| -> Vec<u32> {
            let mut cache = model.new_cache(n_ctx).unwrap();
            let mut picks = vec![model.forward_greedy(&prompt, cache.as_mut()).unwrap()];
            while cache.len() < n_ctx {
                let mut token = *picks.last().unwrap();
                match picks.len() {
                    // Another token than the pick the step launched ahead ran on.
                    20 => token = (token + 1) % 200,
                    // Back five positions: the step launched ahead is not the one asked for.
                    40 => cache.truncate(cache.len() - 5),
                    _ => {}
                }
                let picked = model
                    .forward_pick_more(&[token], cache.as_mut(), &greedy, ahead)
                    .unwrap();
                picks.push(picked[0].0);
            }
            picks
        };
        let single = run(false);
        let ahead = run(true);
        assert_eq!(single.len(), 1 + DECODE_STEPS + 5);
        assert_eq!(
            ahead,
            single,
            "{}: steps launched ahead pick other tokens",
            path.display()
        );
        eprintln!(
            "{}: steps launched ahead identical to single steps",
            path.display()
        );
    }
}

/// Sampling with the device's part on the GPU (penalties and top-k, recorded and replayed as
/// CUDA graphs) hands the host the same candidates as the CPU backend, step after step, so the
/// sampler draws the same tokens; greedy decoding with penalties likewise.
#[test]
fn device_picks_match_cpu_picks() {
    if !gpu() {
        return;
    }
    use synaptix_sample::{Sampler, SamplerConfig};
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/synthetic");
    let mut paths = vec![dir.join("qwen3-tiny.gguf"), dir.join("llama-tiny.gguf")];
    if let Some(extra) = std::env::var_os("SYNAPTIX_CUDA_PARITY_MODELS") {
        paths.extend(std::env::split_paths(&extra));
    }
    let configs = [
        SamplerConfig {
            temperature: 0.9,
            top_k: 40,
            top_p: 0.95,
            repeat_penalty: 1.3,
            frequency_penalty: 0.1,
            presence_penalty: 0.2,
            seed: 11,
            ..Default::default()
        },
        SamplerConfig {
            repeat_penalty: 1.5,
            ..Default::default()
        },
        SamplerConfig {
            temperature: 0.7,
            top_k: 256,
            seed: 5,
            ..Default::default()
        },
    ];
    for path in &paths {
        let (cpu, gpu) = (load(path, Device::Cpu), load(path, Device::Cuda(0)));
        for config in &configs {
            let prompt: Vec<u32> = (0..9).map(|i| (i * 29 % 200 + 7) as u32).collect();
            let mut sampler = Sampler::new(config.clone()).unwrap();
            for &t in &prompt {
                sampler.accept(t);
            }
            let n_ctx = prompt.len() + 40;
            let (mut cc, mut gc) = (cpu.new_cache(n_ctx).unwrap(), gpu.new_cache(n_ctx).unwrap());
            let mut tokens = prompt.clone();
            for step in 0..32 {
                let pick = sampler
                    .device_pick()
                    .expect("these settings run on the device");
                let feed = if step == 0 {
                    &prompt[..]
                } else {
                    &tokens[tokens.len() - 1..]
                };
                let want = cpu.forward_pick(feed, cc.as_mut(), &pick).unwrap();
                let got = gpu.forward_pick(feed, gc.as_mut(), &pick).unwrap();
                let bits = |c: &[(u32, f32)]| -> Vec<(u32, u32)> {
                    c.iter().map(|&(i, v)| (i, v.to_bits())).collect()
                };
                if pick.top_k == 0 {
                    assert_eq!(
                        got[0].0,
                        want[0].0,
                        "{} {config:?} step {step}",
                        path.display()
                    );
                } else {
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "{} {config:?} step {step}",
                        path.display()
                    );
                }
                let t = if pick.top_k == 0 {
                    want[0].0
                } else {
                    sampler.pick(want).unwrap()
                };
                sampler.accept(t);
                tokens.push(t);
            }
        }
        eprintln!("{}: device picks identical to the CPU's", path.display());
    }
}

#[test]
fn gemma_cuda_greedy_tokens_match_llama_cpp() {
    if !gpu() {
        return;
    }
    let path = cache::models_dir().join("gemma-3-270m-q4_k_m.gguf");
    if !path.exists() {
        eprintln!("SKIPPED: {} not present", path.display());
        return;
    }
    let golden_path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/goldens/gemma3-270m.json");
    let golden: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(golden_path).unwrap()).unwrap();
    let model = load(&path, Device::Cuda(0));
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    let mut identical = 0;
    let prompts = golden["prompts"].as_array().unwrap();
    for p in prompts {
        let (prompt, want) = (ids(&p["prompt_ids"]), ids(&p["generated"]));
        // Greedy decoding on the device, as generation does: steps after the first are
        // replayed from a recorded CUDA graph.
        let mut cache = model.new_cache(512).unwrap();
        let mut got = vec![model.forward_greedy(&prompt, cache.as_mut()).unwrap()];
        while got.len() < want.len() {
            let last = *got.last().unwrap();
            got.push(model.forward_greedy(&[last], cache.as_mut()).unwrap());
        }
        let same = got == want;
        identical += usize::from(same);
        let at = got.iter().zip(&want).position(|(a, b)| a != b);
        eprintln!(
            "{:?}: {}",
            p["prompt"].as_str().unwrap_or(""),
            if same {
                "identical".to_string()
            } else {
                format!("differs at step {at:?}")
            }
        );
    }
    eprintln!(
        "gemma3 on CUDA: {identical}/{} prompts give llama.cpp's 32 greedy tokens",
        prompts.len()
    );
    assert!(
        identical >= 8,
        "only {identical} of {} prompts identical",
        prompts.len()
    );
}
