//! Bad input never panics: every case below exits non-zero with one line on stderr that starts
//! with `error:` and says what is wrong.

use std::path::Path;

use synaptix_bundle::gguf::{GgufWriter, Value};
use synaptix_core::DType;

mod common;
use common::{fails, Scratch};

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// A minimal, valid GGUF whose architecture is `arch`.
fn tiny_gguf(arch: &str) -> GgufWriter {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", Value::String(arch.into()));
    w.add_f32("token_embd.weight", &[4, 32], &[0.0; 128]);
    w
}

#[test]
fn missing_file_directory_and_empty_file() {
    let s = Scratch::new("paths");
    for cmd in ["run", "inspect", "bench", "tokenize", "serve"] {
        let extra: &[&str] = if cmd == "run" || cmd == "tokenize" {
            &["hi"]
        } else {
            &[]
        };
        let missing = s.0.join("missing.gguf");
        let mut args = vec![cmd, p(&missing)];
        args.extend_from_slice(extra);
        fails(&args, "missing.gguf");
        let mut args = vec![cmd, p(&s.0)];
        args.extend_from_slice(extra);
        fails(&args, "directory");
    }
    let empty = s.file("empty.gguf", b"");
    fails(&["inspect", p(&empty)], "empty");
    fails(&["run", p(&empty), "hi"], "empty");
}

#[test]
fn random_bytes_and_truncated_files() {
    let s = Scratch::new("junk");
    let mut state = 7u32;
    let noise: Vec<u8> = (0..10_000)
        .map(|_| {
            state = state.wrapping_mul(1664525).wrapping_add(1013904223);
            (state >> 24) as u8
        })
        .collect();
    let junk = s.file("junk.gguf", &noise);
    fails(&["inspect", p(&junk)], "not a GGUF or .syn file");
    fails(&["run", p(&junk), "hi"], "not a GGUF or .syn file");

    let bytes = tiny_gguf("llama").to_bytes();
    for cut in [3, 20, 40, bytes.len() / 2, bytes.len() - 1] {
        let t = s.file(&format!("cut{cut}.gguf"), &bytes[..cut]);
        fails(&["inspect", p(&t)], "");
    }
}

#[test]
fn hostile_tables() {
    let s = Scratch::new("hostile");
    let mut w = GgufWriter::new();
    w.add_tensor("huge", &[1 << 40, 1 << 40], DType::F32, vec![0; 16]);
    let f = s.file("dims.gguf", &w.to_bytes());
    fails(&["inspect", p(&f)], "huge");

    let mut w = GgufWriter::new();
    w.add_tensor("past_end", &[1024, 1024], DType::F32, vec![0; 16]);
    let f = s.file("oob.gguf", &w.to_bytes());
    fails(&["inspect", p(&f)], "outside the file");

    let mut w = GgufWriter::new();
    w.add_tensor("wrap", &[u64::MAX / 4, 8], DType::F32, vec![0; 16]);
    let f = s.file("overflow.gguf", &w.to_bytes());
    fails(&["inspect", p(&f)], "wrap");

    // An unknown tensor type id: patch the type field of the only tensor info.
    let mut bytes = tiny_gguf("llama").to_bytes();
    let name = b"token_embd.weight";
    let at = bytes.windows(name.len()).position(|w| w == name).unwrap() + name.len() + 4 + 16;
    bytes[at..at + 4].copy_from_slice(&77u32.to_le_bytes());
    let f = s.file("ttype.gguf", &bytes);
    fails(&["inspect", p(&f)], "unknown tensor type id 77");
}

#[test]
fn unsupported_architecture_lists_supported_ones() {
    let s = Scratch::new("arch");
    let f = s.file("mamba.gguf", &tiny_gguf("mamba9").to_bytes());
    let err = fails(&["run", p(&f), "hi"], "unsupported architecture 'mamba9'");
    for arch in ["llama", "qwen2", "qwen3", "gemma3"] {
        assert!(err.contains(arch), "{err}");
    }
}

#[test]
fn wrong_flags_are_one_line() {
    fails(&["run", "--no-such-flag"], "--no-such-flag");
    fails(&["frobnicate"], "frobnicate");
    fails(&["run", "model.gguf", "hi", "--temp", "warm"], "warm");
    fails(&["bench", "model.gguf", "-p", "-5"], "-5");
    fails(&["serve", "model.gguf", "--port", "70000"], "70000");
}

#[test]
fn transcribe_bad_input() {
    let s = Scratch::new("transcribe");
    let nowhere = s.0.join("nowhere");
    fails(
        &["transcribe", p(&nowhere), "a.wav"],
        "not a Whisper model directory",
    );
    let empty_dir = s.0.join("empty");
    std::fs::create_dir_all(&empty_dir).unwrap();
    fails(
        &["transcribe", p(&empty_dir), "a.wav"],
        "model.bin: missing",
    );
    fails(
        &["transcribe", p(&empty_dir), "a.wav", "--device", "cuda"],
        "runs on the CPU only",
    );
    fails(
        &["transcribe", p(&empty_dir), "a.wav", "--device", "tpu"],
        "--device tpu",
    );

    // The rest needs the real model's tokenizer and config.
    let real = synaptix_bundle::cache::models_dir().join("whisper-base");
    if !real.join("model.bin").is_file() {
        eprintln!(
            "SKIPPED (partly): whisper-base not fetched (scripts/fetch-models.sh whisper-base)"
        );
        return;
    }
    let fake = s.0.join("fake");
    std::fs::create_dir_all(&fake).unwrap();
    for f in ["config.json", "tokenizer.json"] {
        std::fs::copy(real.join(f), fake.join(f)).unwrap();
    }
    std::fs::write(fake.join("model.bin"), b"\x06\0\0\0\x0c\0WhisperSpec\0").unwrap();
    fails(&["transcribe", p(&fake), "a.wav"], "truncated");
    std::fs::write(fake.join("model.bin"), b"").unwrap();
    fails(&["transcribe", p(&fake), "a.wav"], "model.bin");

    fails(
        &["transcribe", p(&real), "a.wav", "--language", "xx"],
        "--language xx: not a language of this model",
    );
    fails(&["transcribe", p(&real), p(&nowhere)], "nowhere");
    fails(
        &["transcribe", p(&real), "a.wav", "--temperature", "0,3"],
        "--temperature 3: each temperature must be between 0 and 2",
    );
    fails(
        &["transcribe", p(&real), "a.wav", "--temperature", "hot"],
        "invalid value 'hot'",
    );
    let text = s.file("text.wav", b"hello, this is not audio at all\n");
    fails(
        &["transcribe", p(&real), p(&text)],
        "unsupported audio format",
    );
    let wav = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/whisper/speech16k.wav"),
    )
    .unwrap();
    let cut = s.file("cut.wav", &wav[..wav.len() / 3]);
    fails(&["transcribe", p(&real), p(&cut)], "truncated");
}

#[test]
fn embed_bad_input() {
    let s = Scratch::new("embed");
    let nowhere = s.0.join("nowhere");
    fails(&["embed", p(&nowhere), "a text"], "not a model directory");
    let empty_dir = s.0.join("empty");
    std::fs::create_dir_all(&empty_dir).unwrap();
    fails(
        &["embed", p(&empty_dir), "a text"],
        "model.safetensors: missing",
    );
    fails(
        &["embed", p(&empty_dir), "x", "--device", "cuda"],
        "runs on the CPU only",
    );
    fails(
        &["embed", p(&empty_dir), "x", "--device", "tpu"],
        "--device tpu",
    );
    fails(&["embed", p(&empty_dir)], "no texts to embed");
    fails(
        &["embed", p(&empty_dir), "--file", p(&nowhere)],
        "cannot read texts",
    );

    // A directory with the real small files and a broken or hostile safetensors file.
    let real = synaptix_bundle::cache::models_dir().join("all-minilm-l6-v2");
    if !real.join("model.safetensors").is_file() {
        eprintln!(
            "SKIPPED (partly): all-minilm-l6-v2 not fetched (scripts/fetch-models.sh all-minilm-l6-v2)"
        );
        return;
    }
    let fake = s.0.join("fake");
    std::fs::create_dir_all(fake.join("1_Pooling")).unwrap();
    for f in [
        "config.json",
        "tokenizer.json",
        "modules.json",
        "sentence_bert_config.json",
        "1_Pooling/config.json",
    ] {
        std::fs::copy(real.join(f), fake.join(f)).unwrap();
    }
    let st = fake.join("model.safetensors");
    std::fs::write(&st, b"\x05\0\0").unwrap();
    fails(&["embed", p(&fake), "x"], "model.safetensors: truncated");
    std::fs::write(&st, b"\xff\xff\xff\xff\xff\xff\xff\xff{}").unwrap();
    fails(&["embed", p(&fake), "x"], "header length");
    fails(&["inspect", p(&fake)], "header length");
    fails(&["inspect", p(&st), "--json"], "header length");
    let mut hostile = 60u64.to_le_bytes().to_vec();
    hostile.extend_from_slice(br#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,400000]}} "#);
    hostile.truncate(68);
    std::fs::write(&st, &hostile).unwrap();
    fails(&["embed", p(&fake), "x"], "model.safetensors");
    // A valid file without BERT's tensors.
    let mut other = 2u64.to_le_bytes().to_vec();
    other.extend_from_slice(b"{}");
    std::fs::write(&st, &other).unwrap();
    fails(&["embed", p(&fake), "x"], "no tensor named");
    // A config that is not BERT.
    std::fs::copy(real.join("model.safetensors"), &st).unwrap();
    std::fs::write(fake.join("config.json"), br#"{"model_type": "gpt2"}"#).unwrap();
    fails(&["embed", p(&fake), "x"], "model_type 'gpt2' is not 'bert'");
    std::fs::write(fake.join("config.json"), b"{not json").unwrap();
    fails(&["embed", p(&fake), "x"], "invalid JSON");
}

#[test]
fn inspect_bad_onnx() {
    let s = Scratch::new("onnx");
    // An empty file, random bytes, a length past the end, a model without a graph.
    fails(
        &["inspect", p(&s.file("empty.onnx", b""))],
        "model has no graph",
    );
    fails(
        &["inspect", p(&s.file("noise.onnx", &[0xff; 64]))],
        "noise.onnx: byte 0",
    );
    fails(
        &[
            "inspect",
            p(&s.file("len.onnx", &[0x08, 0x08, 0x3a, 0xff, 0x7f])),
        ],
        "len.onnx: byte 3: truncated",
    );
    // A directory holding two .onnx files: name one.
    let two = s.0.join("two");
    std::fs::create_dir_all(&two).unwrap();
    std::fs::write(two.join("a.onnx"), b"").unwrap();
    std::fs::write(two.join("b.onnx"), b"").unwrap();
    fails(&["inspect", p(&two)], "2 .onnx files; name one");
}
