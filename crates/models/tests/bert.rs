//! all-MiniLM-L6-v2 against the goldens of `scripts/reference/make_embed_goldens.py` (token ids
//! from Python's `tokenizers`; embeddings from sentence-transformers on the CPU, cross-checked
//! there against a float64 numpy BertModel): the same ids, every embedding within 1e-5 of the
//! reference's, a batch giving each text's embedding alone, and a paraphrase pair closer than an
//! unrelated pair.
//!
//! Needs the model: `scripts/fetch-models.sh all-minilm-l6-v2` (CI runs it first).

use std::path::PathBuf;

use synaptix_bundle::cache;
use synaptix_models::bert::{cosine, BertEmbedder, BertPaths, Pooling};
use synaptix_tokenizer::Tokenizer;

fn goldens() -> serde_json::Value {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/embed/goldens.json");
    let text = std::fs::read_to_string(path).expect("goldens.json");
    serde_json::from_str(&text).expect("valid json")
}

fn model_paths() -> Option<BertPaths> {
    let dir = cache::models_dir().join("all-minilm-l6-v2");
    match BertPaths::resolve(&dir) {
        Ok(p) => Some(p),
        Err(_) => {
            eprintln!(
                "SKIPPED: all-minilm-l6-v2 not found in {} (run scripts/fetch-models.sh all-minilm-l6-v2)",
                dir.display()
            );
            None
        }
    }
}

#[test]
fn minilm_matches_reference() {
    let Some(paths) = model_paths() else { return };
    let golden = goldens();
    let tokenizer = Tokenizer::from_tokenizer_json(&paths.tokenizer).expect("tokenizer.json");
    let model = BertEmbedder::load(&paths.dir).expect("model");
    assert_eq!(model.dim(), 384);
    assert_eq!(model.pooling(), Pooling::Mean);
    assert!(model.normalize());
    assert_eq!(
        model.max_seq_length() as u64,
        golden["max_seq_length"].as_u64().unwrap()
    );

    let cases = golden["cases"].as_array().expect("cases");
    let mut batch = Vec::new();
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let ids = model.truncate(tokenizer.encode(text, true, false).expect("encode"));
        let want: Vec<u32> = case["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(ids, want, "token ids of {text:?}");
        batch.push(ids);
    }

    let t = std::time::Instant::now();
    let embs = model.embed(&batch).expect("embed");
    eprintln!(
        "{} texts embedded in {:.1} ms",
        batch.len(),
        t.elapsed().as_secs_f64() * 1e3
    );
    for (case, e) in cases.iter().zip(&embs) {
        let want: Vec<f32> = case["embedding"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        assert_eq!(e.len(), want.len());
        let worst = e
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        eprintln!(
            "max abs diff {worst:.2e}  {:?}",
            case["text"].as_str().unwrap()
        );
        assert!(worst <= 1e-5, "{:?}: max abs diff {worst}", case["text"]);
        let norm: f32 = e.iter().map(|v| v * v).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "norm {norm}");
    }

    // Each text alone gives its batched embedding (the batch packs, attention is per text).
    for (ids, e) in batch.iter().zip(&embs) {
        let alone = model.embed(std::slice::from_ref(ids)).expect("embed one");
        let worst = alone[0]
            .iter()
            .zip(e)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(worst <= 1e-6, "batched vs alone: {worst}");
    }

    // Paraphrases (0, 1) closer than unrelated texts (0, 2).
    let para = cosine(&embs[0], &embs[1]);
    let unrelated = cosine(&embs[0], &embs[2]);
    assert!(
        para > unrelated + 0.3,
        "paraphrase {para} vs unrelated {unrelated}"
    );
}

#[test]
fn minilm_truncates_and_rejects_overlong() {
    let Some(paths) = model_paths() else { return };
    let tokenizer = Tokenizer::from_tokenizer_json(&paths.tokenizer).expect("tokenizer.json");
    let model = BertEmbedder::load(&paths.dir).expect("model");
    let text = "word ".repeat(600);
    let ids = tokenizer.encode(&text, true, false).expect("encode");
    assert_eq!(ids.len(), 602);
    // Over max_position_embeddings without truncation: an error, not a panic.
    let e = model.embed(std::slice::from_ref(&ids)).unwrap_err();
    assert!(e.to_string().contains("602 tokens"), "{e}");
    let cut = model.truncate(ids.clone());
    assert_eq!(cut.len(), 256);
    assert_eq!(cut[0], 101);
    assert_eq!(cut[255], 102);
    assert_eq!(model.embed(&[cut]).expect("embed").len(), 1);
    // An empty batch gives nothing; an id beyond the vocabulary is an error.
    assert!(model.embed(&[]).expect("empty batch").is_empty());
    assert!(model.embed(&[vec![101, 40_000, 102]]).is_err());
}

/// CLS pooling (a copy of the directory whose `1_Pooling/config.json` asks for it) gives the
/// first token's last state, normalised; without `modules.json`, nothing is normalised.
#[test]
fn minilm_cls_pooling_and_no_normalize() {
    let Some(paths) = model_paths() else { return };
    let dir = std::env::temp_dir().join(format!("synaptix-bert-cls-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("1_Pooling")).unwrap();
    for f in ["config.json", "tokenizer.json", "modules.json"] {
        std::fs::copy(paths.dir.join(f), dir.join(f)).unwrap();
    }
    std::os::unix::fs::symlink(&paths.weights, dir.join("model.safetensors")).unwrap();
    std::fs::write(
        dir.join("1_Pooling/config.json"),
        r#"{"word_embedding_dimension": 384, "pooling_mode_cls_token": true, "pooling_mode_mean_tokens": false}"#,
    )
    .unwrap();
    let ids = vec![101u32, 7592, 2088, 102];
    let cls = BertEmbedder::load(&dir).expect("cls model");
    assert_eq!(cls.pooling(), Pooling::Cls);
    assert_eq!(
        cls.max_seq_length(),
        512,
        "no sentence_bert_config.json: max positions"
    );
    let states = cls.hidden_states(std::slice::from_ref(&ids)).unwrap();
    let first = &states[0][..384];
    let norm = first.iter().map(|v| v * v).sum::<f32>().sqrt();
    let e = cls.embed(std::slice::from_ref(&ids)).unwrap();
    for (a, b) in e[0].iter().zip(first) {
        assert!((a - b / norm).abs() < 1e-6);
    }

    std::fs::remove_file(dir.join("modules.json")).unwrap();
    let plain = BertEmbedder::load(&dir).expect("no modules.json");
    assert!(!plain.normalize());
    assert_eq!(plain.pooling(), Pooling::Cls);
    assert_eq!(plain.embed(std::slice::from_ref(&ids)).unwrap()[0], first);

    std::fs::write(
        dir.join("1_Pooling/config.json"),
        r#"{"pooling_mode_max_tokens": true}"#,
    )
    .unwrap();
    let e = BertEmbedder::load(&dir)
        .err()
        .expect("max pooling is refused");
    assert!(e.to_string().contains("not supported"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
