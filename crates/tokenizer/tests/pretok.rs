//! The pre-tokenizers against the original regular expressions, run by Python's `regex` module
//! on the corpus (tests/fixtures/tokenizer/pretok_regex.json). This is the check for Llama 3
//! (`llama-bpe`), which has no model file here; Qwen2 and GPT-2 are also compared end to end
//! against llama.cpp by the goldens.

mod common;

use synaptix_tokenizer::PreTokenizer;

fn check(pre: PreTokenizer, key: &str) {
    let golden = common::read_json("pretok_regex.json");
    let mut failures = Vec::new();
    let entries = golden["entries"].as_array().unwrap();
    for e in entries {
        let text = e["text"].as_str().unwrap();
        let want: Vec<&str> = e[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w.as_str().unwrap())
            .collect();
        let got: Vec<&str> = pre.split(text).into_iter().map(|r| &text[r]).collect();
        if got != want {
            failures.push(format!(
                "{}: {text:?}\n    ours:  {got:?}\n    regex: {want:?}",
                e["name"].as_str().unwrap()
            ));
        }
    }
    println!(
        "{key}: {}/{} corpus entries split as the regex does",
        entries.len() - failures.len(),
        entries.len()
    );
    assert!(failures.is_empty(), "{key}:\n{}", failures.join("\n"));
}

#[test]
fn llama3_matches_regex() {
    check(PreTokenizer::Llama3, "llama3");
}

#[test]
fn qwen2_matches_regex() {
    check(PreTokenizer::Qwen2, "qwen2");
}

#[test]
fn gpt2_matches_regex() {
    check(PreTokenizer::Gpt2, "gpt2");
}
