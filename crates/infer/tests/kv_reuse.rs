//! Reusing a KV cache across turns gives exactly what evaluating the whole text afresh gives.

use synaptix_bundle::cache;
use synaptix_core::Device;
use synaptix_infer::{ChatSession, ChatTemplate, ContextOverflow, Engine, GenerateOptions};
use synaptix_models::NoTap;
use synaptix_sample::SamplerConfig;

fn engine() -> Engine {
    let path = cache::models_dir().join("gemma-3-270m-q4_k_m.gguf");
    assert!(
        path.exists(),
        "{} is missing: run scripts/fetch-models.sh",
        path.display()
    );
    Engine::load(&path, Device::Cpu).expect("model loads")
}

fn greedy(max_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        n_ctx: 512,
        sampler: SamplerConfig::default(),
        stop_at_eog: true,
    }
}

/// Logits after a continuation evaluated on top of a cached history equal, bit for bit, the
/// logits of the whole text evaluated at once.
#[test]
fn continuing_a_cache_gives_the_logits_of_a_fresh_evaluation() {
    let engine = engine();
    let history = engine
        .tokenize_prompt("<start_of_turn>user\nName three colors.<end_of_turn>\n<start_of_turn>model\nRed, green and blue.")
        .unwrap();
    let rest = engine
        .tokenizer
        .encode("<end_of_turn>\n<start_of_turn>user\nAnd three fruits?<end_of_turn>\n<start_of_turn>model\n", false, true)
        .unwrap();
    let whole: Vec<u32> = history.iter().chain(&rest).copied().collect();
    let fresh = engine
        .generate(&whole, &greedy(1), true, &mut NoTap, |_| true)
        .unwrap();

    let mut cache = engine.new_cache(512).unwrap();
    engine
        .generate_in(
            cache.as_mut(),
            &[],
            &history,
            &greedy(1),
            false,
            &mut NoTap,
            |_| true,
        )
        .unwrap();
    // max_tokens 1: the sampled token is not evaluated, the cache holds exactly the history.
    assert_eq!(cache.len(), history.len());
    let reused = engine
        .generate_in(
            cache.as_mut(),
            &history,
            &rest,
            &greedy(1),
            true,
            &mut NoTap,
            |_| true,
        )
        .unwrap();
    let (a, b) = (fresh.first_logits.unwrap(), reused.first_logits.unwrap());
    assert_eq!(a.len(), b.len());
    let differing = a
        .iter()
        .zip(&b)
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count();
    assert_eq!(
        differing,
        0,
        "logits differ at {differing} of {} positions",
        a.len()
    );
}

/// A chat's second turn reuses the first turn's cache and answers exactly as a session that
/// evaluates the same conversation from scratch; `reset` empties the cache.
#[test]
fn chat_session_reuses_its_cache_across_turns() {
    let engine = engine();
    let new_session = || {
        ChatSession::new(
            &engine,
            ChatTemplate::for_engine(&engine, None).unwrap(),
            Some("Be brief.".into()),
            greedy(24),
            ContextOverflow::Error,
        )
        .unwrap()
    };
    let mut chat = new_session();
    let first = chat.send("Name three colors.", |_| true).unwrap();
    assert_eq!(first.stats.reused_tokens, 0);
    let dir = std::env::temp_dir().join(format!("synaptix-kv-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let saved = dir.join("turn1.json");
    chat.save(&saved).unwrap();
    let second = chat.send("And three fruits?", |_| true).unwrap();
    assert!(
        second.stats.reused_tokens >= first.stats.context_tokens,
        "{:?}",
        second.stats
    );
    assert!(second.stats.evaluated_tokens < second.stats.context_tokens);

    // The same conversation from scratch: nothing cached, same greedy answer.
    let mut fresh = new_session();
    fresh.load(&saved).unwrap();
    let again = fresh.send("And three fruits?", |_| true).unwrap();
    assert_eq!(again.stats.reused_tokens, 0);
    assert_eq!(again.text, second.text);

    chat.reset();
    assert_eq!(chat.cached_tokens(), 0);
    assert!(chat.messages().is_empty());
    std::fs::remove_dir_all(&dir).ok();
}
