//! Chat templates rendered by synaptix (minijinja) against the same templates rendered by
//! Python's `jinja2` the way Hugging Face renders them (`scripts/reference/make_template_goldens.py`
//! wrote tests/fixtures/chat_templates/goldens.json): byte for byte, for a ChatML template
//! (Qwen2.5's, from its GGUF), a Gemma 3-style and a Llama 3-style template (system handling,
//! `trim`, `raise_exception`, `strftime_now`, `tojson`, loop controls), over several conversations.

use std::path::PathBuf;

use synaptix_infer::{render_chat_at, ChatMessage};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/chat_templates")
}

#[test]
fn templates_render_like_jinja2() {
    let goldens: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("goldens.json")).expect("goldens present"),
    )
    .expect("goldens parse");
    let cases = goldens["cases"].as_array().expect("cases");
    assert!(cases.len() >= 24);
    for case in cases {
        let name = case["template"].as_str().unwrap();
        let template = std::fs::read_to_string(fixtures().join(format!("{name}.jinja"))).unwrap();
        let messages: Vec<ChatMessage> =
            serde_json::from_value(case["messages"].clone()).expect("messages");
        let got = render_chat_at(
            &template,
            &messages,
            case["add_generation_prompt"].as_bool().unwrap(),
            case["bos_token"].as_str().unwrap(),
            case["eos_token"].as_str().unwrap(),
            case["now"].as_i64().unwrap(),
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        let want = case["expected"].as_str().unwrap();
        assert_eq!(
            got, want,
            "{name}, conversation {}, add_generation_prompt {}",
            case["conversation"], case["add_generation_prompt"]
        );
    }
}

/// A template's `raise_exception` is an error naming the message, not a panic.
#[test]
fn raise_exception_is_an_error() {
    let template = std::fs::read_to_string(fixtures().join("gemma3.jinja")).unwrap();
    let messages = vec![
        ChatMessage {
            role: "assistant".into(),
            content: "out of turn".into(),
        },
        ChatMessage {
            role: "user".into(),
            content: "hi".into(),
        },
    ];
    let err = render_chat_at(&template, &messages, true, "<bos>", "<eos>", 0).unwrap_err();
    assert!(
        err.to_string()
            .contains("Conversation roles must alternate"),
        "{err}"
    );
}

/// `tojson` writes what Python's json.dumps writes (separators, key order, indent, non-ASCII).
#[test]
fn tojson_matches_python() {
    let t = "{{ {'b': 1, 'a': [true, none, 'é'], 'c': {}} | tojson }}|{{ [1, {'x': 2}] | tojson(indent=2) }}";
    let got = render_chat_at(t, &[], false, "", "", 0).unwrap();
    assert_eq!(
        got,
        "{\"b\": 1, \"a\": [true, null, \"é\"], \"c\": {}}|[\n  1,\n  {\n    \"x\": 2\n  }\n]"
    );
}
