//! Behaviour on the real vocabularies beyond the goldens: special ids, end of generation,
//! streaming, speed.

mod common;

use std::time::Instant;

use common::{corpus, load, GEMMA, QWEN};
use synaptix_tokenizer::{PreTokenizer, TokenizerKind};

#[test]
fn gemma3_special_tokens() {
    let tok = load(GEMMA);
    assert_eq!(tok.kind(), TokenizerKind::SentencePiece);
    assert_eq!(tok.vocab_size(), 262_144);
    assert_eq!(tok.bos(), Some(2));
    assert_eq!(tok.eos(), Some(1));
    assert!(tok.add_bos());
    assert!(!tok.add_eos());
    let eot = tok.token_id("<end_of_turn>").unwrap();
    assert_eq!(tok.eot(), Some(eot));
    // llama.cpp's set: <eos>, <end_of_turn>, and </s> (an ordinary token promoted by its text).
    assert_eq!(tok.eog_ids(), &[1, 106, 212]);
    assert!(tok.is_eog(eot) && tok.is_eog(1) && !tok.is_eog(2));
    assert_eq!(tok.chat_template(), None);
    let ids = tok
        .encode("<start_of_turn>user\nhi<end_of_turn>", true, true)
        .unwrap();
    assert_eq!(ids[0], 2);
    assert_eq!(ids[1], tok.token_id("<start_of_turn>").unwrap());
    assert_eq!(*ids.last().unwrap(), eot);
    // Without parse_special the markers are plain text.
    let plain = tok.encode("<start_of_turn>user", false, false).unwrap();
    assert!(!plain.contains(&tok.token_id("<start_of_turn>").unwrap()));
}

#[test]
fn qwen2_special_tokens() {
    let tok = load(QWEN);
    assert_eq!(tok.kind(), TokenizerKind::ByteLevelBpe(PreTokenizer::Qwen2));
    assert_eq!(tok.vocab_size(), 151_936);
    assert!(!tok.add_bos());
    let im_end = tok.token_id("<|im_end|>").unwrap();
    let endoftext = tok.token_id("<|endoftext|>").unwrap();
    assert_eq!(tok.eos(), Some(im_end));
    assert_eq!(tok.eot(), Some(im_end));
    assert!(tok.is_eog(im_end) && tok.is_eog(endoftext));
    // As llama.cpp prints them for this model.
    assert_eq!(
        tok.eog_ids(),
        &[128_247, 151_643, 151_645, 151_662, 151_663, 151_664]
    );
    assert!(tok.chat_template().unwrap().contains("<|im_start|>"));
    let ids = tok
        .encode("<|im_start|>user\nhi<|im_end|>", true, true)
        .unwrap();
    assert_eq!(ids, [151_644, 872, 198, 6023, 151_645]);
}

#[test]
fn decode_skips_ids_outside_the_vocabulary() {
    let tok = load(QWEN);
    let hi = tok.encode("hi", false, false).unwrap();
    let n = tok.vocab_size() as u32;
    let mut ids = vec![n, u32::MAX];
    ids.extend(&hi);
    ids.push(n + 7);
    assert_eq!(tok.decode(&ids), "hi");
    assert!(tok.token_to_piece(n).is_empty());
    assert!(!tok.is_valid(n) && tok.is_valid(n - 1));
    assert!(!tok.is_eog(u32::MAX));
}

/// Feeds ids one at a time; checks the chunks add up to the decoded text and that some token
/// did end inside a character (so the buffering was exercised).
fn stream_round_trip(model: (&str, &str), text: &str) {
    let tok = load(model);
    let ids = tok.encode(text, false, false).unwrap();
    let mut stream = tok.stream_decoder();
    let mut out = String::new();
    let mut held_back = 0;
    for &id in &ids {
        let chunk = stream.push(id);
        if chunk.is_empty() {
            held_back += 1;
        }
        out.push_str(&chunk);
        assert!(
            stream.pending().len() < 4,
            "pending holds at most a partial character"
        );
    }
    out.push_str(&stream.finish());
    assert_eq!(out, text, "{}", model.0);
    assert_eq!(tok.decode(&ids), text);
    let split = ids
        .iter()
        .filter(|&&id| std::str::from_utf8(&tok.token_to_piece(id)).is_err())
        .count();
    assert!(
        split > 0 && held_back > 0,
        "{}: no token split a character: {ids:?}",
        model.0
    );
}

#[test]
fn stream_decoder_gemma3_byte_fallback() {
    // Gemma 3 has no token for the newer emoji U+1FAE8 and U+1F6DC, nor for Gothic U+10348:
    // each falls back to four <0xXX> byte tokens.
    stream_round_trip(
        GEMMA,
        "emoji 🦀 zwj 👨\u{200d}👩\u{200d}👧 new 🫨🛜 gothic 𐍈 end",
    );
}

#[test]
fn stream_decoder_qwen2_byte_level() {
    stream_round_trip(QWEN, "emoji 🦀 zwj 👨\u{200d}👩\u{200d}👧 🧿 𐍈 end");
}

#[test]
fn stream_decoder_replaces_invalid_bytes_without_stalling() {
    let tok = load(QWEN);
    let mut stream = tok.stream_decoder();
    assert_eq!(stream.push_bytes(b"a\xF0\x9F"), "a");
    assert_eq!(stream.pending(), b"\xF0\x9F");
    // A byte that cannot continue the sequence: the partial character is invalid for good.
    assert_eq!(stream.push_bytes(b"b"), "\u{FFFD}b");
    assert_eq!(stream.push_bytes(b"\xE2\x82"), "");
    assert_eq!(stream.finish(), "\u{FFFD}");
    assert_eq!(stream.finish(), "");
}

/// A ~10 KB text drawn from the whole corpus (all scripts, code, whitespace runs).
fn long_text() -> String {
    let mut text = String::new();
    let corpus = corpus();
    while text.len() < 10_000 {
        // U+2581 is SentencePiece's space marker: it decodes as a space (in llama.cpp too), so
        // that entry would spoil the round-trip check below.
        for (_, t) in corpus.iter().filter(|(_, t)| !t.contains('\u{2581}')) {
            text.push_str(t);
            text.push(' ');
        }
    }
    text
}

fn time_encode(model: (&str, &str)) {
    let tok = load(model);
    let text = long_text();
    // Warm up (page faults of the vocabulary tables), then take the best of a few runs.
    let ids = tok.encode(&text, true, true).unwrap();
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        let again = tok.encode(&text, true, true).unwrap();
        best = best.min(t.elapsed().as_secs_f64());
        assert_eq!(again, ids);
    }
    println!(
        "{}: encoded {} bytes into {} tokens in {:.2} ms",
        model.0,
        text.len(),
        ids.len(),
        best * 1e3
    );
    assert_eq!(tok.decode(&ids), text);
    // Generous bound for slow shared CI machines; typical is a few milliseconds.
    assert!(best < 0.25, "{}: encoding 10 KB took {best:.3} s", model.0);
}

#[test]
fn encode_10kb_gemma3_is_fast() {
    time_encode(GEMMA);
}

#[test]
fn encode_10kb_qwen2_is_fast() {
    time_encode(QWEN);
}

/// A `tokenizer.json` rebuilt from the real Qwen2.5 GGUF's `tokenizer.ggml.*` keys (what a
/// `.symb` directory written from that GGUF carries) splits the whole corpus as the GGUF's own
/// tokenizer (llama.cpp's ids) does, and the chat markers. (Parsing special tokens in the
/// corpus would differ on `</s>`: an ordinary token in the file and in Qwen's own
/// tokenizer.json, which llama.cpp alone promotes to a control token by its text.)
#[test]
fn tokenizer_json_rebuilt_from_qwen2_gguf_vocabulary_tokenizes_alike() {
    let path = common::model_path(QWEN.1);
    let file = synaptix_bundle::GgufFile::open(&path).unwrap();
    let json = synaptix_tokenizer::tokenizer_json_from_vocab_keys(|k| file.get(k))
        .expect("a byte-level BPE vocabulary with a known pre-tokenizer");
    let dir = std::env::temp_dir().join(format!("synaptix-rebuilt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json_path = dir.join("tokenizer.json");
    std::fs::write(&json_path, json).unwrap();
    let rebuilt = synaptix_tokenizer::Tokenizer::from_tokenizer_json(&json_path).unwrap();
    let ggml = load(QWEN);
    let entries = corpus();
    assert!(entries.len() > 50);
    for (_, text) in &entries {
        assert_eq!(
            rebuilt.encode(text, false, false).unwrap(),
            ggml.encode(text, false, false).unwrap(),
            "{text:?}"
        );
    }
    let chat = "<|im_start|>user\nhi<|im_end|>";
    assert_eq!(
        rebuilt.encode(chat, false, true).unwrap(),
        [151_644, 872, 198, 6023, 151_645]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
