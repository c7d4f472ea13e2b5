//! The binary end to end on the real models (`scripts/fetch-models.sh` fetches them).

mod common;

use std::process::Command;

use common::{golden, ids, json_ok, model, synaptix, Scratch};

fn gemma() -> String {
    model("gemma-3-270m-q4_k_m.gguf")
}

fn qwen() -> String {
    model("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
}

#[test]
fn run_json_greedy_matches_llama_cpp_end_to_end() {
    for (name, path) in [("gemma3-270m", gemma()), ("qwen2.5-coder-0.5b", qwen())] {
        let (prompt, prompt_ids, want) = golden(name);
        let v = json_ok(&[
            "run", &path, &prompt, "--temp", "0", "-n", "16", "--json", "-t", "2",
        ]);
        assert_eq!(
            ids(&v["prompt_tokens"]),
            prompt_ids,
            "{name}: prompt tokenization"
        );
        let got = ids(&v["tokens"]);
        assert_eq!(got, want[..got.len()].to_vec(), "{name}: greedy tokens");
        assert!(!v["text"].as_str().unwrap().is_empty());
        assert!(v["timings"]["gen_tps"].as_f64().unwrap() > 0.0);
    }
}

#[test]
fn run_streams_text_and_stats() {
    let out = synaptix(&[
        "run",
        &gemma(),
        "The capital of France is",
        "--temp",
        "0",
        "-n",
        "8",
    ]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("France"), "{text}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("prompt") && err.contains("t/s"), "{err}");
}

#[test]
fn chat_template_wraps_the_prompt() {
    let v = json_ok(&[
        "run",
        &qwen(),
        "hi",
        "--chat",
        "--temp",
        "0",
        "-n",
        "4",
        "--json",
    ]);
    let ids: Vec<u64> = v["prompt_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    // <|im_start|> is 151644 in Qwen2.5's vocabulary; the template opens with it.
    assert_eq!(ids[0], 151644, "{ids:?}");
    assert!(
        ids.contains(&151645),
        "the user turn is closed with <|im_end|>: {ids:?}"
    );
    let v = json_ok(&[
        "run",
        &gemma(),
        "hi",
        "--chat",
        "--temp",
        "0",
        "-n",
        "4",
        "--json",
    ]);
    let ids: Vec<u64> = v["prompt_tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    assert_eq!(ids[0], 2, "one BOS: {ids:?}");
    assert_ne!(ids[1], 2, "not two BOS: {ids:?}");
}

#[test]
fn prompt_longer_than_context_is_an_error() {
    let long = "word ".repeat(100);
    let out = synaptix(&["run", &gemma(), &long, "-c", "16", "--device", "cpu"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("error:") && err.contains("context"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

#[test]
fn seeded_sampling_is_reproducible() {
    let args = [
        "run",
        &gemma(),
        "Once upon a time",
        "--temp",
        "0.9",
        "--seed",
        "7",
        "-n",
        "12",
        "--json",
    ];
    let a = json_ok(&args);
    let b = json_ok(&args);
    assert_eq!(a["tokens"], b["tokens"]);
    let c = json_ok(&[
        "run",
        &gemma(),
        "Once upon a time",
        "--temp",
        "0.9",
        "--seed",
        "8",
        "-n",
        "12",
        "--json",
    ]);
    assert_ne!(
        a["tokens"], c["tokens"],
        "another seed gives another sample"
    );
}

#[test]
fn inspect_reports_the_file() {
    let v = json_ok(&["inspect", &gemma(), "--json"]);
    assert_eq!(v["version"], 3);
    assert_eq!(v["metadata"]["general.architecture"], "gemma3");
    assert_eq!(v["tensors"].as_array().unwrap().len(), 236);
    let tokens = &v["metadata"]["tokenizer.ggml.tokens"];
    assert_eq!(
        tokens["len"], 262144,
        "long arrays are summarised: {tokens}"
    );
    let total: u64 = v["totals"]
        .as_object()
        .unwrap()
        .values()
        .map(|t| t["tensors"].as_u64().unwrap())
        .sum();
    assert_eq!(total, 236);
    assert!(v["n_params"].as_u64().unwrap() > 260_000_000);
    let out = synaptix(&["inspect", &qwen()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("qwen2.block_count") && text.contains("blk.0.attn_q.bias"),
        "{text}"
    );
}

#[test]
fn tokenize_shows_ids_and_pieces() {
    let v = json_ok(&["tokenize", &qwen(), "Hello world", "--json"]);
    assert_eq!(v["pieces"], serde_json::json!(["Hello", " world"]));
    assert_eq!(v["ids"].as_array().unwrap().len(), 2);
}

#[test]
fn bench_prints_llama_bench_rows() {
    let v = json_ok(&[
        "bench",
        &gemma(),
        "-p",
        "16",
        "-n",
        "4",
        "-r",
        "1",
        "-t",
        "2",
        "-o",
        "json",
    ]);
    let rows = v.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["test"], "pp16");
    assert_eq!(rows[1]["test"], "tg4");
    for r in rows {
        assert!(r["avg_ts"].as_f64().unwrap() > 0.0);
        assert_eq!(r["n_threads"], 2);
    }
    let out = synaptix(&["bench", &gemma(), "-p", "8", "-n", "2", "-r", "1"]);
    let md = String::from_utf8_lossy(&out.stdout);
    assert!(
        md.contains("| model") && md.contains("gemma3 270M Q4_K - Medium") && md.contains("tg2"),
        "{md}"
    );
}

/// `synaptix perplexity` gives llama-perplexity's figures (its portable build, whose logits
/// synaptix reproduces bit for bit; tests/fixtures/perplexity, made by
/// scripts/reference/make_perplexity_fixture.sh) on both models over the imatrix corpus in chunks
/// of 256: every chunk's running perplexity, the final estimate and its error, as llama.cpp
/// prints them (4 and 5 decimals). Gemma replaces each chunk's first token by BOS, Qwen adds none.
/// Too little text, or a chunk shorter than 16 tokens, is a one-line error.
#[test]
fn perplexity_matches_llama_perplexity() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
    let corpus = root.join("imatrix/corpus.txt");
    let corpus = corpus.to_str().unwrap();
    let want: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("perplexity/llama_perplexity.json")).unwrap(),
    )
    .unwrap();
    let close = |got: &serde_json::Value, want: &serde_json::Value, decimals: i32| {
        let (g, w) = (got.as_f64().unwrap(), want.as_f64().unwrap());
        (g - w).abs() <= 0.51 * 10f64.powi(-decimals)
    };
    for (file, path) in [
        ("gemma-3-270m-q4_k_m.gguf", gemma()),
        ("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", qwen()),
    ] {
        let v = json_ok(&[
            "perplexity",
            &path,
            "-f",
            corpus,
            "-c",
            "256",
            "--chunks",
            "6",
            "--device",
            "cpu",
            "--json",
        ]);
        let w = &want[file];
        assert_eq!(v["scored_tokens"], 6 * 127, "{file}");
        let (got, expected) = (
            v["chunk_perplexity"].as_array().unwrap(),
            w["chunk_perplexity"].as_array().unwrap(),
        );
        assert_eq!(got.len(), expected.len(), "{file}");
        for (i, (g, e)) in got.iter().zip(expected).enumerate() {
            assert!(close(g, e, 4), "{file} chunk {}: {g} against {e}", i + 1);
        }
        assert!(close(&v["perplexity"], &w["perplexity"], 4), "{file}: {v}");
        assert!(close(&v["error"], &w["error"], 5), "{file}: {v}");
    }
    let short = Scratch::new("perplexity");
    let text = short.file("short.txt", b"Only a few words here.");
    let out = synaptix(&[
        "perplexity",
        &gemma(),
        "-f",
        text.to_str().unwrap(),
        "-c",
        "64",
        "--device",
        "cpu",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("needs at least 128"), "{stderr}");
    let out = synaptix(&["perplexity", &gemma(), "-f", corpus, "-c", "8"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("at least 16 tokens"));
    assert!(!out.status.success());
}

#[test]
fn devices_lists_the_cpu() {
    let v = json_ok(&["devices", "--json"]);
    assert_eq!(v["devices"][0]["kind"], "cpu");
    assert!(v["devices"][0]["kernel_path"].is_string());
}

#[test]
fn device_flag_is_checked() {
    let out = synaptix(&["run", &gemma(), "hi", "-n", "1", "--device", "tpu"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown device 'tpu'"), "{err}");
    if matches!(
        synaptix_kernels_cuda::cuda_status(),
        synaptix_kernels_cuda::CudaStatus::Unavailable(_)
    ) {
        let out = synaptix(&["run", &gemma(), "hi", "-n", "1", "--device", "cuda"]);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.starts_with("error: --device cuda: CUDA is not available"),
            "{err}"
        );
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        // auto falls back to the CPU with a one-line notice.
        let out = synaptix(&["run", &gemma(), "hi", "-n", "1"]);
        assert!(out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("note: no usable GPU") && err.contains("running on the CPU"),
            "{err}"
        );
    }
}

/// `synaptix chat` driven through a pipe: two turns, commands in between, a transcript saved;
/// the second turn reuses the first turn's KV cache (as `/stats` reports), and the answers are
/// the greedy ones.
#[test]
fn chat_runs_a_piped_multi_turn_session() {
    use std::io::Write;
    let dir = std::env::temp_dir().join(format!("synaptix-chat-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let transcript = dir.join("conversation.json");
    let script = format!(
        "What is the capital of France?\n/stats\nAnd of Italy?\n/stats\n/save {}\n/bogus\n",
        transcript.display()
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_synaptix"))
        .args([
            "chat",
            &qwen(),
            "--temp",
            "0",
            "-n",
            "24",
            "-t",
            "2",
            "--device",
            "cpu",
            "-s",
            "Answer in one short sentence.",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("synaptix chat starts");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("Paris"), "first answer: {stdout}");
    let answers = stdout.lines().filter(|l| !l.trim().is_empty()).count();
    assert!(answers >= 2, "two answers expected: {stdout}");
    // Turn 2 reuses every cached position the conversation still shares.
    let turn2 = stderr
        .lines()
        .find(|l| l.starts_with("turn 2:"))
        .unwrap_or_else(|| panic!("no stats for turn 2: {stderr}"));
    let reused: usize = turn2
        .split(" reused")
        .next()
        .and_then(|s| s.rsplit('(').next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("{turn2}"));
    assert!(reused > 20, "{turn2}");
    assert!(stderr.contains("unknown command /bogus"), "{stderr}");
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&transcript).unwrap()).unwrap();
    assert_eq!(saved["messages"].as_array().unwrap().len(), 4);
    assert_eq!(saved["system"], "Answer in one short sentence.");
    std::fs::remove_dir_all(&dir).ok();
}

/// A conversation that outgrows the context is refused with a clear error under
/// `--context-overflow error`, and shifted (oldest turns dropped, said on stderr) under `shift`.
#[test]
fn chat_context_overflow_policies() {
    use std::io::Write;
    let script =
        "Count from one to ten in words.\nNow from eleven to twenty.\nAnd twenty-one to thirty.\nAnd thirty-one to forty.\n";
    let run = |policy: &str| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_synaptix"))
            .args([
                "chat",
                &qwen(),
                "--temp",
                "0",
                "-n",
                "40",
                "-t",
                "2",
                "--device",
                "cpu",
                "-c",
                "160",
                "--context-overflow",
                policy,
            ])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(script.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, stderr) = run("error");
    assert!(!ok, "{stderr}");
    assert!(stderr.contains("--context-overflow error"), "{stderr}");
    let (ok, stderr) = run("shift");
    assert!(ok, "{stderr}");
    assert!(stderr.contains("dropped the"), "{stderr}");
}

/// Ctrl-C (SIGINT) while an answer streams stops that answer and keeps the chat going: the next
/// piped message is answered, and `/stats` shows the cut first turn.
#[test]
fn chat_ctrl_c_stops_the_answer_not_the_chat() {
    use std::io::{Read, Write};
    let mut child = Command::new(env!("CARGO_BIN_EXE_synaptix"))
        .args([
            "chat",
            &gemma(),
            "--temp",
            "0",
            "-n",
            "400",
            "-t",
            "2",
            "--device",
            "cpu",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("synaptix chat starts");
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(b"Write a very long essay about the history of Rome.\nSay hello.\n/stats\n")
        .unwrap();
    // Wait for the first streamed bytes (the handler is installed before generation starts).
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 16];
    let n = stdout.read(&mut first).unwrap();
    assert!(n > 0, "no output before the interrupt");
    let kill = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(kill.success());
    drop(stdin);
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("[stopped]"), "{stderr}");
    let turn = |k: usize| -> usize {
        let line = stderr
            .lines()
            .find(|l| l.starts_with(&format!("turn {k}:")))
            .unwrap_or_else(|| panic!("no stats for turn {k}: {stderr}"));
        line.split(" tokens at ")
            .next()
            .and_then(|s| s.rsplit(", ").next())
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("{line}"))
    };
    assert!(turn(1) < 400, "the first answer was not cut");
    assert!(turn(2) > 0, "the second message was not answered");
}

/// A chat template that does not parse, or a missing one, is a one-line error before any turn.
#[test]
fn chat_rejects_a_broken_template() {
    let dir = std::env::temp_dir().join(format!("synaptix-tmpl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.jinja");
    std::fs::write(&bad, "{% for x in %}").unwrap();
    for template in [
        bad.display().to_string(),
        dir.join("missing.jinja").display().to_string(),
    ] {
        let out = synaptix(&[
            "chat",
            &qwen(),
            "--device",
            "cpu",
            "--chat-template",
            &template,
        ]);
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
        assert!(stderr.starts_with("error: "), "{stderr}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// `transcribe` on the Whisper fixture (tests/fixtures/whisper/goldens.json): by default (beam
/// 5, conditioning on previous text) one streamed line per segment and JSON segments, all
/// faster-whisper's (`timestamped_beam5`); with `--beam-size 1 --no-condition-on-previous-text`
/// faster-whisper's greedy segments (`timestamped`); with `--no-timestamps` the streamed text and
/// the JSON's text and tokens are CTranslate2's beam-5 decoding without timestamps (`beam5`), and
/// with `--beam-size 1` its greedy decoding (`clips`). The language is detected.
#[test]
fn transcribe_streams_and_reports_json() {
    let dir = model("whisper-base");
    let fixtures = format!(
        "{}/../../tests/fixtures/whisper",
        env!("CARGO_MANIFEST_DIR")
    );
    let g: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{fixtures}/goldens.json")).unwrap())
            .unwrap();
    let clip = &g["clips"][0];
    let wav = format!("{fixtures}/{}", clip["wav"].as_str().unwrap());
    let clock = |s: &serde_json::Value| {
        let ms = (s.as_f64().unwrap() * 1000.0).round() as u64;
        format!("{:02}:{:02}.{:03}", ms / 60_000, ms / 1000 % 60, ms % 1000)
    };
    for (key, extra) in [
        ("timestamped_beam5", &[][..]),
        (
            "timestamped",
            &["--beam-size", "1", "--no-condition-on-previous-text"][..],
        ),
    ] {
        let timed = &g[key][0];
        assert_eq!(timed["name"], "speech16k");
        let segments = timed["segments"].as_array().unwrap();
        let lines: Vec<String> = segments
            .iter()
            .map(|s| {
                format!(
                    "[{} --> {}]  {}",
                    clock(&s["start"]),
                    clock(&s["end"]),
                    s["text"].as_str().unwrap().trim()
                )
            })
            .collect();

        let mut args = vec!["transcribe", &dir, &wav, "-t", "2"];
        args.extend(extra);
        let out = synaptix(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        assert!(stderr.contains("language: en"), "{stderr}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(stdout.lines().collect::<Vec<_>>(), lines, "{key}: {stdout}");
        assert!(stdout.starts_with("[00:00.000 --> 00:0"), "{stdout}");

        // With faster-whisper's fallback temperatures: this clean clip never falls back.
        let mut args = vec![
            "transcribe",
            &dir,
            &wav,
            "--language",
            "en",
            "--json",
            "--temperature",
            "0,0.2,0.4,0.6,0.8,1",
        ];
        args.extend(extra);
        let j = json_ok(&args);
        let text: String = segments
            .iter()
            .map(|s| s["text"].as_str().unwrap())
            .collect();
        assert_eq!(j["text"].as_str().unwrap(), text.trim());
        let tokens: Vec<serde_json::Value> = segments
            .iter()
            .flat_map(|s| s["tokens"].as_array().unwrap().clone())
            .collect();
        assert_eq!(j["tokens"].as_array().unwrap(), &tokens);
        assert_eq!(j["language"], "en");
        assert_eq!(j["windows"], 1);
        assert_eq!(j["beam_size"], if extra.is_empty() { 5 } else { 1 });
        assert_eq!(j["condition_on_previous_text"], extra.is_empty());
        let got = j["segments"].as_array().unwrap();
        assert_eq!(got.len(), segments.len());
        for (s, w) in got.iter().zip(segments) {
            assert_eq!(s["tokens"], w["tokens"]);
            assert_eq!(s["text"], w["text"]);
            assert_eq!(s["temperature"], 0.0);
            assert!(s["compression_ratio"].as_f64().unwrap() > 1.0);
            for key in ["start", "end"] {
                let (a, b) = (s[key].as_f64().unwrap(), w[key].as_f64().unwrap());
                assert!((a - b).abs() < 1e-9, "{key}: {a} vs {b}");
            }
        }
    }

    // Without timestamps: blind windows, streamed (greedy: token by token).
    for (want, extra) in [(&g["beam5"], &[][..]), (clip, &["--beam-size", "1"][..])] {
        let mut args = vec!["transcribe", &dir, &wav, "-t", "2", "--no-timestamps"];
        args.extend(extra);
        let out = synaptix(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        assert!(stderr.contains("language: en"), "{stderr}");
        let text = want["text"].as_str().unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim_end(), text);
        let mut args = vec![
            "transcribe",
            &dir,
            &wav,
            "--language",
            "en",
            "--json",
            "--no-timestamps",
        ];
        args.extend(extra);
        let j = json_ok(&args);
        assert_eq!(j["text"].as_str().unwrap(), text.trim());
        assert_eq!(j["tokens"], want["tokens"]);
        assert_eq!(j["language"], "en");
        assert_eq!(j["windows"], 1);
        assert!(j.get("segments").is_none(), "{j}");
    }
}

/// `transcribe --word-timestamps` on the Whisper fixture: the JSON segments carry faster-whisper's
/// words (tests/fixtures/whisper/words.json, the clip alone), and the text output puts a line
/// per word under each segment.
#[test]
fn transcribe_word_timestamps_end_to_end() {
    let dir = model("whisper-base");
    let fixtures = format!(
        "{}/../../tests/fixtures/whisper",
        env!("CARGO_MANIFEST_DIR")
    );
    let g: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{fixtures}/words.json")).unwrap())
            .unwrap();
    let clip = &g["clips"][0];
    assert_eq!(clip["name"], "speech16k");
    let wav = format!("{fixtures}/speech16k.wav");
    let j = json_ok(&[
        "transcribe",
        &dir,
        &wav,
        "--word-timestamps",
        "--json",
        "-t",
        "2",
    ]);
    let got = j["segments"].as_array().unwrap();
    let want = clip["segments"].as_array().unwrap();
    assert_eq!(got.len(), want.len());
    for (s, w) in got.iter().zip(want) {
        assert_eq!(s["text"], w["text"]);
        let (gw, ww) = (
            s["words"].as_array().unwrap(),
            w["words"].as_array().unwrap(),
        );
        assert_eq!(gw.len(), ww.len());
        for (a, b) in gw.iter().zip(ww) {
            assert_eq!(a["word"], b["word"]);
            assert_eq!(a["start"], b["start"]);
            assert_eq!(a["end"], b["end"]);
        }
    }
    let out = synaptix(&["transcribe", &dir, &wav, "--word-timestamps", "-t", "2"]);
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(
        lines[0].starts_with("[00:00.000 --> 00:02.960]  The quick"),
        "{stdout}"
    );
    assert!(
        lines[1].starts_with("  [00:00.000 --> 00:00.140] The ("),
        "{stdout}"
    );
    let words: usize = want
        .iter()
        .map(|s| s["words"].as_array().unwrap().len())
        .sum();
    assert_eq!(lines.len(), want.len() + words, "{stdout}");
}

/// `transcribe --vad-filter` on the Whisper fixture: faster-whisper's `vad_filter=True` speech
/// chunk and segments (tests/fixtures/whisper/vad.json, the clip alone); a missing VAD model is
/// a one-line error.
#[test]
fn transcribe_vad_filter_end_to_end() {
    let dir = model("whisper-base");
    let fixtures = format!(
        "{}/../../tests/fixtures/whisper",
        env!("CARGO_MANIFEST_DIR")
    );
    let g: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{fixtures}/vad.json")).unwrap())
            .unwrap();
    let clip = &g["clips"][0];
    assert_eq!(clip["name"], "speech16k");
    let wav = format!("{fixtures}/speech16k.wav");
    let j = json_ok(&[
        "transcribe",
        &dir,
        &wav,
        "--vad-filter",
        "--json",
        "-t",
        "2",
    ]);
    let chunks: Vec<serde_json::Value> = clip["speech_chunks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| serde_json::json!([c["start"], c["end"]]))
        .collect();
    assert_eq!(j["vad_chunks"].as_array().unwrap(), &chunks);
    let (got, want) = (
        j["segments"].as_array().unwrap(),
        clip["segments"].as_array().unwrap(),
    );
    assert_eq!(got.len(), want.len());
    for (s, w) in got.iter().zip(want) {
        for key in ["start", "end", "text", "tokens"] {
            assert_eq!(s[key], w[key], "{key}");
        }
    }
    let out = synaptix(&[
        "transcribe",
        &dir,
        &wav,
        "--vad-filter",
        "--vad-model",
        "/nowhere/vad.onnx",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.starts_with("error: --vad-filter: /nowhere/vad.onnx not found"),
        "{stderr}"
    );
}

/// `embed` end to end on all-MiniLM-L6-v2 against the goldens of
/// `scripts/reference/make_embed_goldens.py`: token ids, embeddings within 1e-5, the default
/// output's lines and similarity matrix, and `--file` giving the arguments' result.
#[test]
fn embed_matches_goldens_end_to_end() {
    let dir = model("all-minilm-l6-v2");
    let path = format!(
        "{}/../../tests/fixtures/embed/goldens.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let g: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let cases = g["cases"].as_array().unwrap();
    let texts: Vec<&str> = cases.iter().map(|c| c["text"].as_str().unwrap()).collect();
    let mut args = vec!["embed", &dir, "--json", "-t", "2"];
    args.extend(&texts);
    let v = json_ok(&args);
    assert_eq!(v["dim"], 384);
    for (i, case) in cases.iter().enumerate() {
        assert_eq!(v["tokens"][i], case["ids"], "ids of {:?}", texts[i]);
        let got = v["embeddings"][i].as_array().unwrap();
        let want = case["embedding"].as_array().unwrap();
        assert_eq!(got.len(), 384);
        for (a, b) in got.iter().zip(want) {
            let d = (a.as_f64().unwrap() - b.as_f64().unwrap()).abs();
            assert!(d <= 1e-5, "{:?}: {a} vs {b}", texts[i]);
        }
    }

    // --file (one text per line) gives the same vectors; the default output has one line per
    // text and the similarity matrix.
    let file = std::env::temp_dir().join(format!("synaptix-embed-{}.txt", std::process::id()));
    std::fs::write(&file, format!("{}\n\n{}\n", texts[0], texts[1])).unwrap();
    let f = json_ok(&["embed", &dir, "--file", file.to_str().unwrap(), "--json"]);
    assert_eq!(f["embeddings"][0], v["embeddings"][0]);
    assert_eq!(f["embeddings"][1], v["embeddings"][1]);
    let out = synaptix(&["embed", &dir, "--file", file.to_str().unwrap()]);
    let _ = std::fs::remove_file(&file);
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.starts_with("[1]   9 tokens  norm 1.0000  [+0.0217, -0.0049,"),
        "{stdout}"
    );
    assert!(stdout.contains("cosine similarity:"), "{stdout}");
    assert!(stdout.contains("   1   1.000  0.640"), "{stdout}");
}

#[test]
fn inspect_reads_the_piper_voice() {
    let dir = model("piper-en-us-joe-medium");
    let want: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(format!(
            "{}/../../tests/fixtures/onnx/piper_joe_summary.json",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap(),
    )
    .unwrap();
    // By short name, by directory and by file: the same listing.
    let v = json_ok(&["inspect", "piper-en-us-joe-medium", "--json"]);
    assert_eq!(v["format"], "onnx");
    assert!(v["file"]
        .as_str()
        .unwrap()
        .ends_with("en_US-joe-medium.onnx"));
    assert_eq!(v["file_bytes"], 63_201_294);
    assert_eq!(v["ir_version"], want["ir_version"]);
    assert_eq!(v["opsets"], want["opsets"]);
    assert_eq!(v["producer_name"], "pytorch");
    assert_eq!(v["graph_name"], want["graph_name"]);
    assert_eq!(v["n_nodes"], want["n_nodes"]);
    assert_eq!(v["op_types"], want["op_types"]);
    assert_eq!(v["n_initializers"], want["n_initializers"]);
    assert_eq!(v["initializer_bytes"], want["initializer_raw_bytes"]);
    assert_eq!(v["inputs"][0]["name"], "input");
    assert_eq!(v["inputs"][0]["type"], "INT64");
    assert_eq!(
        v["inputs"][0]["shape"],
        serde_json::json!(["batch_size", "phonemes"])
    );
    assert_eq!(v["inputs"][2]["shape"], serde_json::json!([3]));
    assert_eq!(v["outputs"][0]["name"], "output");
    let inits = v["initializers"].as_array().unwrap();
    assert_eq!(inits.len(), 401);
    assert_eq!(inits[0]["name"], "sid");
    assert_eq!(inits[0]["type"], "FLOAT");
    assert_eq!(inits[0]["shape"], serde_json::json!([256, 192]));
    assert_eq!(inits[0]["bytes"], 256 * 192 * 4);
    assert_eq!(v["totals"]["FLOAT"]["initializers"], 366);
    let by_dir = json_ok(&["inspect", &dir, "--json"]);
    assert_eq!(by_dir, v);
    let text = synaptix(&["inspect", &format!("{dir}/en_US-joe-medium.onnx")]);
    assert!(text.status.success());
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("ONNX IR v8, opsets ai.onnx 15, producer pytorch 2.0.0")
            && text.contains("op types (2755 nodes):")
            && text.contains("dec.ups.0.weight"),
        "{text}"
    );
}

/// The real Qwen2.5 GGUF (Q4_K_M, llama.cpp's vocabulary only) written as a `.symb` INT4
/// directory: the tokenizer.json rebuilt from the vocabulary, the matrices requantized to INT4
/// groups. The directory reads back and still knows the capital of France.
#[test]
fn qwen_gguf_to_symb_int4_runs() {
    let s = Scratch::new("real-symb");
    let out = s.path("qwen-symb");
    let v = json_ok(&["quantize", &qwen(), &out, "--type", "symb-int4", "--json"]);
    assert_eq!(v["architecture"], "qwen2");
    assert_eq!(v["files"], 294);
    let tok = std::fs::read_to_string(format!("{out}/tokenizer/tokenizer_config.json")).unwrap();
    assert!(tok.contains("<|im_end|>") && tok.contains("<|im_start|>"));
    let v = json_ok(&[
        "run",
        &out,
        "The capital of France is",
        "-n",
        "4",
        "--temp",
        "0",
        "--json",
        "--device",
        "cpu",
    ]);
    let text = v["text"].as_str().unwrap();
    assert!(text.starts_with(" Paris"), "{text:?}");
    assert_eq!(v["prompt_tokens"].as_array().unwrap().len(), 5);
}
