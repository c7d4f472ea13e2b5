//! Encoding, pieces and decoding of every corpus entry, against llama.cpp's output recorded by
//! `scripts/reference/make_tokenizer_goldens.py`.
//!
//! Besides the two real models, the Qwen2.5 vocabulary is also checked relabelled with other
//! pre-tokenizers (`llama-bpe`, `default`, `gpt-2`, `starcoder`): llama.cpp was run on the same
//! relabelled files, so those pre-tokenizers are compared end to end with a real vocabulary.

mod common;

use common::{ids, load, model_path, piece_bytes, read_json, GEMMA, QWEN};
use synaptix_bundle::gguf::GgufWriter;
use synaptix_bundle::{GgufFile, Value};
use synaptix_tokenizer::Tokenizer;

/// Entries whose text does not survive encode + decode, in llama.cpp as in synaptix: Gemma 3
/// escapes spaces as U+2581 before encoding, so a U+2581 in the input comes back as a space.
const LOSSY: &[(&str, &str)] = &[("gemma3-270m", "sentencepiece_marker")];

fn check_model(model: (&str, &str)) {
    check(model.0, &load(model));
}

/// The Qwen2.5 model's metadata with `tokenizer.ggml.pre` replaced, as a tokenizer.
fn qwen_vocab_as(pre: &str) -> Tokenizer {
    let file = GgufFile::open(model_path(QWEN.1)).unwrap();
    let mut w = GgufWriter::new();
    for (key, value) in file.metadata() {
        let value = if key == "tokenizer.ggml.pre" {
            Value::String(pre.to_string())
        } else {
            value.clone()
        };
        w.add_metadata(key.clone(), value);
    }
    let path = std::env::temp_dir().join(format!(
        "synaptix-qwen-vocab-{pre}-{}.gguf",
        std::process::id()
    ));
    std::fs::write(&path, w.to_bytes()).unwrap();
    let tok = Tokenizer::from_gguf_path(&path);
    let _ = std::fs::remove_file(&path);
    tok.unwrap()
}

fn check(golden_name: &str, tok: &Tokenizer) {
    let golden = read_json(&format!("goldens_{golden_name}.json"));
    let add_special = golden["add_special"].as_bool().unwrap();
    assert_eq!(
        tok.add_bos(),
        add_special,
        "add_bos disagrees with llama-tokenize"
    );
    let entries = golden["entries"].as_array().unwrap();

    let mut failures = Vec::new();
    let mut matched = 0;
    for e in entries {
        let name = e["name"].as_str().unwrap();
        let text = e["text"].as_str().unwrap();
        let mut ok = true;
        for (parse_special, suffix) in [(true, ""), (false, "_no_parse_special")] {
            let want = ids(&e[format!("ids{suffix}")]);
            let got = match tok.encode(text, add_special, parse_special) {
                Ok(ids) => ids,
                Err(err) => {
                    failures.push(format!(
                        "{name} (parse_special={parse_special}): error {err}"
                    ));
                    ok = false;
                    continue;
                }
            };
            if got != want {
                failures.push(format!(
                    "{name} (parse_special={parse_special}) text {text:?}\n    ours:      {got:?}\n    llama.cpp: {want:?}"
                ));
                ok = false;
            }
            // Pieces of llama.cpp's ids (whatever we encoded).
            let pieces = e[format!("pieces{suffix}")].as_array().unwrap();
            for (id, p) in want.iter().zip(pieces) {
                let expected = piece_bytes(p);
                if tok.token_to_piece(*id) != expected {
                    failures.push(format!(
                        "{name}: piece of {id}: ours {:?}, llama.cpp {:?}",
                        String::from_utf8_lossy(&tok.token_to_piece(*id)),
                        String::from_utf8_lossy(&expected)
                    ));
                    ok = false;
                }
            }
            // Decoding llama.cpp's ids gives llama.cpp's text, which is the input text. (The
            // relabelled vocabularies have no detokenized text: see the golden's note.)
            let detok = &e[format!("detokenized{suffix}")];
            if detok.is_null() {
                continue;
            }
            let detok = piece_bytes(detok);
            let ours = tok.detokenize(&want, true, true);
            if ours != detok {
                failures.push(format!(
                    "{name} (parse_special={parse_special}): detokenize ours {:?}, llama.cpp {:?}",
                    String::from_utf8_lossy(&ours),
                    String::from_utf8_lossy(&detok)
                ));
                ok = false;
            }
            // And that is the input text, except where llama.cpp itself cannot round-trip.
            let expected = if LOSSY.contains(&(golden_name, name)) {
                String::from_utf8_lossy(&detok).into_owned()
            } else {
                text.to_string()
            };
            if tok.decode(&want) != expected {
                failures.push(format!(
                    "{name} (parse_special={parse_special}): decode gives {:?}, want {expected:?}",
                    tok.decode(&want)
                ));
                ok = false;
            }
        }
        matched += usize::from(ok);
    }
    println!(
        "{}: {matched}/{} corpus entries match llama.cpp",
        golden_name,
        entries.len()
    );
    assert!(
        failures.is_empty(),
        "{}: {} of {} entries differ from llama.cpp:\n{}",
        golden_name,
        entries.len() - matched,
        entries.len(),
        failures.join("\n")
    );
}

#[test]
fn gemma3_matches_llama_cpp() {
    check_model(GEMMA);
}

#[test]
fn qwen2_matches_llama_cpp() {
    check_model(QWEN);
}

#[test]
fn qwen_vocab_as_llama3_matches_llama_cpp() {
    check("qwen-vocab-llama-bpe", &qwen_vocab_as("llama-bpe"));
}

#[test]
fn qwen_vocab_as_default_matches_llama_cpp() {
    check("qwen-vocab-default", &qwen_vocab_as("default"));
}

#[test]
fn qwen_vocab_as_gpt2_matches_llama_cpp() {
    check("qwen-vocab-gpt-2", &qwen_vocab_as("gpt-2"));
}

#[test]
fn qwen_vocab_as_starcoder_matches_llama_cpp() {
    check("qwen-vocab-starcoder", &qwen_vocab_as("starcoder"));
}
