//! A Hugging Face tokenizer.json (tests/fixtures/tokenizer/hf_tiny: a hand-made byte-level BPE
//! with nine merges and three added tokens) through the `tokenizers` crate.

mod common;

use synaptix_tokenizer::{Tokenizer, TokenizerError, TokenizerKind};

fn tiny() -> Tokenizer {
    let path = common::fixtures_dir().join("hf_tiny/tokenizer.json");
    Tokenizer::from_tokenizer_json(&path).unwrap()
}

#[test]
fn encodes_with_merges_by_rank() {
    let tok = tiny();
    assert_eq!(tok.kind(), TokenizerKind::HuggingFace);
    assert_eq!(tok.vocab_size(), 23);
    // "hello" merges fully (h e, l l, ll o, he llo); " world" via Ġ w, o r, Ġw or, l d, Ġwor ld.
    assert_eq!(
        tok.encode("hello world!", false, false).unwrap(),
        [14, 19, 0]
    );
    assert_eq!(tok.decode(&[14, 19, 0]), "hello world!");
}

#[test]
fn special_and_added_tokens() {
    let tok = tiny();
    // "é" is two bytes, each its own token here.
    assert_eq!(
        tok.encode("hé<|im_end|>", false, true).unwrap(),
        [3, 9, 10, 21]
    );
    assert!(!tok
        .encode("hé<|im_end|>", false, false)
        .unwrap()
        .contains(&21));
    // A non-special added token is recognised either way.
    assert_eq!(tok.encode("<tool>hello", false, false).unwrap(), [22, 14]);
    assert_eq!(tok.token_to_piece(9), [0xC3]);
    assert_eq!(tok.token_to_piece(10), [0xA9]);
    assert_eq!(tok.token_to_piece(21), b"<|im_end|>");
    assert_eq!(tok.decode(&[3, 9, 10, 21]), "hé<|im_end|>");
    assert_eq!(
        tok.detokenize(&[3, 9, 10, 21], true, false),
        "hé".as_bytes()
    );
}

#[test]
fn config_gives_eos_eog_and_template() {
    let tok = tiny();
    assert_eq!(tok.eos(), Some(21));
    assert_eq!(tok.bos(), None);
    assert!(!tok.add_bos());
    assert_eq!(tok.eog_ids(), &[20, 21]);
    assert!(tok.is_eog(21) && !tok.is_eog(14));
    assert!(tok.chat_template().unwrap().contains("<|im_end|>"));
    assert_eq!(tok.token_id("<tool>"), Some(22));
}

#[test]
fn stream_decoder_joins_split_character() {
    let tok = tiny();
    let mut stream = tok.stream_decoder();
    assert_eq!(stream.push(3), "h");
    assert_eq!(stream.push(9), "");
    assert_eq!(stream.push(10), "é");
    assert_eq!(stream.push(999), "", "an unknown id adds nothing");
    assert_eq!(stream.finish(), "");
}

#[test]
fn missing_or_bad_file_is_an_error() {
    let err = Tokenizer::from_tokenizer_json("/nonexistent/tokenizer.json").unwrap_err();
    assert!(matches!(err, TokenizerError::Io { .. }), "{err}");
    let bad = common::fixtures_dir().join("corpus.json");
    let err = Tokenizer::from_tokenizer_json(&bad).unwrap_err();
    assert!(matches!(err, TokenizerError::TokenizerJson { .. }), "{err}");
}
