//! `synaptix serve` end to end on a real model (`scripts/fetch-models.sh` fetches it): the
//! OpenAI endpoints over plain HTTP, their answers against `synaptix chat` and `synaptix run` on
//! the same conversation and prompt (greedy, so they must be equal), streaming, the KV cache
//! reused across requests, and errors.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};

use serde_json::{json, Value};
use synaptix_bundle::cache;

fn qwen() -> String {
    let path = cache::models_dir().join("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    assert!(
        path.exists(),
        "{} is missing: run scripts/fetch-models.sh",
        path.display()
    );
    path.display().to_string()
}

/// A server on a free port; killed when dropped.
struct Server {
    child: Child,
    addr: String,
}

impl Server {
    fn start(model: &str) -> Server {
        Server::start_with(model, &[])
    }

    fn start_with(model: &str, extra: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_synaptix"))
            .args(["serve", model, "--port", "0", "-t", "2", "--device", "cpu"])
            .args(extra)
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("synaptix serve starts");
        let stderr = child.stderr.take().unwrap();
        let mut lines = BufReader::new(stderr).lines();
        let addr = loop {
            let line = lines
                .next()
                .expect("the server prints its address")
                .unwrap();
            if let Some(at) = line.find("listening on http://") {
                break line[at + "listening on http://".len()..].trim().to_string();
            }
        };
        Server { child, addr }
    }

    /// One request; returns (status, body).
    fn request(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        self.request_with(method, path, body, "")
    }

    /// One request with `headers` (each ending in \r\n) added; returns (status, body).
    fn request_with(&self, method: &str, path: &str, body: &str, headers: &str) -> (u16, String) {
        let mut conn = TcpStream::connect(&self.addr).unwrap();
        write!(
            conn,
            "{method} {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n\
             {headers}Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut raw = String::new();
        conn.read_to_string(&mut raw).unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").expect("a response head");
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .expect("a status");
        (status, body.to_string())
    }

    /// One POST of a JSON body; returns (status, content type, body bytes).
    fn post_bytes(&self, path: &str, body: &str) -> (u16, String, Vec<u8>) {
        self.post_raw(path, "application/json", body.as_bytes())
    }

    /// One POST of `body` as `content_type`; returns (status, content type, body bytes).
    fn post_raw(&self, path: &str, content_type: &str, body: &[u8]) -> (u16, String, Vec<u8>) {
        let mut conn = TcpStream::connect(&self.addr).unwrap();
        write!(
            conn,
            "POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: {content_type}\r\n\
             Content-Length: {}\r\n\r\n",
            body.len()
        )
        .unwrap();
        conn.write_all(body).unwrap();
        let mut raw = Vec::new();
        conn.read_to_end(&mut raw).unwrap();
        let split = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("a response head");
        let head = String::from_utf8_lossy(&raw[..split]).to_string();
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .expect("a status");
        let content_type = head
            .lines()
            .find_map(|l| l.strip_prefix("Content-Type: "))
            .unwrap_or("")
            .to_string();
        (status, content_type, raw[split + 4..].to_vec())
    }

    fn json(&self, path: &str, body: Value) -> Value {
        let (status, text) = self.request("POST", path, &body.to_string());
        assert_eq!(status, 200, "{path}: {text}");
        serde_json::from_str(&text).expect("a JSON response")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The conversation `synaptix chat` holds after two greedy turns: (system, [user, assistant]
/// pairs).
fn chat_transcript(model: &str, system: &str, users: &[&str]) -> Vec<(String, String)> {
    let dir = std::env::temp_dir().join(format!("synaptix-serve-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("transcript.json");
    let mut script: String = users.iter().map(|u| format!("{u}\n")).collect();
    script.push_str(&format!("/save {}\n", path.display()));
    let mut child = Command::new(env!("CARGO_BIN_EXE_synaptix"))
        .args([
            "chat", model, "--temp", "0", "-n", "24", "-t", "2", "--device", "cpu", "-s", system,
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let saved: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let messages = saved["messages"].as_array().expect("saved messages");
    let text = |v: &Value| v["content"].as_str().unwrap().to_string();
    messages
        .chunks(2)
        .map(|pair| (text(&pair[0]), text(&pair[1])))
        .collect()
}

/// The text of a server-sent event stream's chunks, in order, and whether it ended with [DONE].
fn streamed_text(body: &str) -> (String, Value, bool) {
    let mut text = String::new();
    let mut last = Value::Null;
    let mut done = false;
    for event in body.split("\n\n").filter(|e| !e.trim().is_empty()) {
        let data = event.strip_prefix("data: ").expect("a data event");
        if data == "[DONE]" {
            done = true;
            continue;
        }
        let v: Value = serde_json::from_str(data).unwrap();
        if let Some(t) = v["choices"][0]["delta"]["content"].as_str() {
            text.push_str(t);
        }
        last = v;
    }
    (text, last, done)
}

#[test]
fn chat_completions_answer_like_synaptix_chat_and_reuse_the_cache() {
    let model = qwen();
    let system = "Answer in one short sentence.";
    let turns = chat_transcript(
        &model,
        system,
        &["What is the capital of France?", "And of Italy?"],
    );
    assert_eq!(turns.len(), 2, "two turns saved: {turns:?}");
    let server = Server::start(&model);

    let mut messages = vec![json!({"role": "system", "content": system})];
    messages.push(json!({"role": "user", "content": turns[0].0}));
    let first = server.json(
        "/v1/chat/completions",
        json!({"messages": messages, "temperature": 0, "max_tokens": 24}),
    );
    assert_eq!(first["object"], "chat.completion");
    assert_eq!(first["choices"][0]["message"]["role"], "assistant");
    assert_eq!(
        first["choices"][0]["message"]["content"].as_str().unwrap(),
        turns[0].1,
        "first answer differs from synaptix chat's"
    );

    // The conversation resent with a new turn: same answer as chat's second turn, streamed,
    // and the cache keeps the prefix the two renderings share.
    messages.push(json!({"role": "assistant", "content": turns[0].1}));
    messages.push(json!({"role": "user", "content": turns[1].0}));
    let (status, body) = server.request(
        "POST",
        "/v1/chat/completions",
        &json!({"messages": messages, "temperature": 0, "max_tokens": 24, "stream": true})
            .to_string(),
    );
    assert_eq!(status, 200, "{body}");
    let (text, last, done) = streamed_text(&body);
    assert!(done, "the stream ends with [DONE]: {body}");
    assert_eq!(
        text, turns[1].1,
        "second answer differs from synaptix chat's"
    );
    assert_eq!(last["choices"][0]["finish_reason"], "stop");
    let cached = last["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    let prompt = last["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(
        cached >= first["usage"]["prompt_tokens"].as_u64().unwrap() && cached < prompt,
        "cached {cached} of {prompt} prompt tokens"
    );

    // The same request without streaming gives the same text.
    let whole = server.json(
        "/v1/chat/completions",
        json!({"messages": messages, "temperature": 0, "max_tokens": 24}),
    );
    assert_eq!(whole["choices"][0]["message"]["content"], text);
}

#[test]
fn completions_match_synaptix_run_and_stop_strings_cut_them() {
    let model = qwen();
    let prompt = "The capital of France is";
    let out = Command::new(env!("CARGO_BIN_EXE_synaptix"))
        .args([
            "run", &model, prompt, "--temp", "0", "-n", "12", "-t", "2", "--device", "cpu",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run: Value = serde_json::from_slice(&out.stdout).unwrap();
    let want = run["text"].as_str().unwrap().to_string();

    let server = Server::start(&model);
    let got = server.json(
        "/v1/completions",
        json!({"prompt": prompt, "temperature": 0, "max_tokens": 12}),
    );
    assert_eq!(got["object"], "text_completion");
    assert_eq!(got["choices"][0]["text"].as_str().unwrap(), want);
    assert_eq!(got["usage"]["completion_tokens"], 12);
    assert_eq!(got["choices"][0]["finish_reason"], "length");

    // A stop string ends the text before it (here the first period).
    let cut = want.find('.').expect("a period in the greedy continuation");
    let stopped = server.json(
        "/v1/completions",
        json!({"prompt": prompt, "temperature": 0, "max_tokens": 12, "stop": ["."]}),
    );
    assert_eq!(
        stopped["choices"][0]["text"].as_str().unwrap(),
        &want[..cut]
    );
    assert_eq!(stopped["choices"][0]["finish_reason"], "stop");
}

#[test]
fn bad_requests_get_errors_and_the_server_keeps_serving() {
    let server = Server::start(&qwen());
    let error = |method: &str, path: &str, body: &str, status: u16| {
        let (got, text) = server.request(method, path, body);
        assert_eq!(got, status, "{method} {path} {body}: {text}");
        let v: Value = serde_json::from_str(&text).expect("a JSON error");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{text}"
        );
    };
    error("GET", "/nowhere", "", 404);
    error("GET", "/v1/chat/completions", "", 405);
    error("POST", "/v1/chat/completions", "{not json", 400);
    error("POST", "/v1/chat/completions", r#"{"messages": []}"#, 400);
    error(
        "POST",
        "/v1/chat/completions",
        r#"{"messages": [{"role": "wizard", "content": "hi"}]}"#,
        400,
    );
    error(
        "POST",
        "/v1/completions",
        r#"{"prompt": "hi", "temperature": -1}"#,
        400,
    );
    error(
        "POST",
        "/v1/completions",
        r#"{"prompt": "hi", "top_p": 2}"#,
        400,
    );
    error(
        "POST",
        "/v1/completions",
        r#"{"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}"#,
        400,
    );
    // A prompt longer than the context.
    let long = "word ".repeat(6000);
    error(
        "POST",
        "/v1/completions",
        &json!({"prompt": long}).to_string(),
        400,
    );
    // Garbage instead of HTTP, then a connection that says nothing and leaves.
    let mut conn = TcpStream::connect(&server.addr).unwrap();
    conn.write_all(b"HELLO\r\n\r\n").unwrap();
    let mut raw = String::new();
    conn.read_to_string(&mut raw).unwrap();
    assert!(raw.starts_with("HTTP/1.1 400"), "{raw}");
    drop(TcpStream::connect(&server.addr).unwrap());

    let (status, text) = server.request("GET", "/health", "");
    assert_eq!((status, text.as_str()), (200, r#"{"status":"ok"}"#));
    let models: Value = serde_json::from_str(&server.request("GET", "/v1/models", "").1).unwrap();
    assert_eq!(
        models["data"][0]["id"],
        "qwen2.5-coder-0.5b-instruct-q4_k_m"
    );
}

/// A port already taken is a one-line error, not a panic.
#[test]
fn a_taken_port_is_a_clear_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let model = format!(
        "{}/../../tests/fixtures/synthetic/llama-tiny.gguf",
        env!("CARGO_MANIFEST_DIR")
    );
    let out = Command::new(env!("CARGO_BIN_EXE_synaptix"))
        .args(["serve", &model, "--port", &port, "--device", "cpu"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert_ne!(out.status.code(), Some(101), "{stderr}");
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("error: "))
        .collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(errors[0].contains("cannot listen"), "{stderr}");
}

/// A generation does not hold up what needs no model: `/health` and `/v1/models` answer while a
/// long answer is still streaming (its events keep coming after theirs).
#[test]
fn health_answers_while_a_generation_streams() {
    let server = Server::start(&qwen());
    let mut stream = TcpStream::connect(&server.addr).unwrap();
    let body = json!({"prompt": "def fibonacci(n):", "temperature": 0, "max_tokens": 200,
                      "stream": true})
    .to_string();
    write!(
        stream,
        "POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reader = BufReader::new(stream);
    // The head and the first event: the generation is running.
    let mut line = String::new();
    while !line.starts_with("data: ") {
        line.clear();
        assert!(
            reader.read_line(&mut line).unwrap() > 0,
            "the stream ended early"
        );
    }
    let (status, text) = server.request("GET", "/health", "");
    assert_eq!((status, text.as_str()), (200, r#"{"status":"ok"}"#));
    let (status, _) = server.request("GET", "/v1/models", "");
    assert_eq!(status, 200);
    // The stream goes on after those answers, and ends properly.
    let mut rest = String::new();
    reader.read_to_string(&mut rest).unwrap();
    let events = rest.matches("data: {").count();
    assert!(events > 10, "only {events} events after /health: {rest}");
    assert!(rest.trim_end().ends_with("data: [DONE]"), "{rest}");
}

/// Connections that send nothing hold a bounded number of reader threads: past 64 the server
/// answers 503 at once, and serves again when they go.
#[test]
fn idle_connections_are_bounded() {
    let server = Server::start(&qwen());
    let idle: Vec<TcpStream> = (0..64)
        .map(|_| TcpStream::connect(&server.addr).unwrap())
        .collect();
    // The acceptor counts a reader as soon as it hands the connection over; give it the moment
    // it needs to take all 64.
    let mut status = 0;
    for _ in 0..50 {
        status = server.request("GET", "/health", "").0;
        if status == 503 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(status, 503, "the 65th connection is turned away");
    drop(idle);
    for _ in 0..100 {
        status = server.request("GET", "/health", "").0;
        if status == 200 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(status, 200, "served again once the idle connections closed");
}

/// With `--api-key`, every endpoint but /health wants `Authorization: Bearer KEY`.
#[test]
fn api_key_is_required_where_asked() {
    let server = Server::start_with(&qwen(), &["--api-key", "s3cret"]);
    let body = json!({"prompt": "Hi", "max_tokens": 2, "temperature": 0}).to_string();
    for (headers, want) in [
        ("", 401),
        ("Authorization: Bearer wrong\r\n", 401),
        ("Authorization: s3cret\r\n", 401),
        ("Authorization: Bearer s3cret\r\n", 200),
    ] {
        let (status, text) = server.request_with("GET", "/v1/models", "", headers);
        assert_eq!(status, want, "{headers:?}: {text}");
        let (status, text) = server.request_with("POST", "/v1/completions", &body, headers);
        assert_eq!(status, want, "{headers:?}: {text}");
        if want == 401 {
            let v: Value = serde_json::from_str(&text).unwrap();
            assert!(v["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("API key")));
        }
    }
    assert_eq!(server.request("GET", "/health", "").0, 200);
}

/// The fetched all-MiniLM-L6-v2 directory, or None (with a note) when it is not fetched.
fn minilm() -> Option<String> {
    let path = cache::models_dir().join("all-minilm-l6-v2");
    if path.join("model.safetensors").exists() {
        Some(path.display().to_string())
    } else {
        eprintln!(
            "skipped: {} is missing (scripts/fetch-models.sh all-minilm-l6-v2)",
            path.display()
        );
        None
    }
}

/// Little-endian f32 values from standard base64 (what the server sends for "base64").
fn decode_base64_f32(s: &str) -> Vec<f32> {
    let value = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => (c - b'A') as u32,
            b'a'..=b'z' => (c - b'a') as u32 + 26,
            b'0'..=b'9' => (c - b'0') as u32 + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        }
    };
    let mut bytes = Vec::new();
    for quad in s.as_bytes().chunks(4) {
        let data: Vec<u8> = quad.iter().copied().filter(|&c| c != b'=').collect();
        let n = data
            .iter()
            .enumerate()
            .fold(0u32, |n, (k, &c)| n | value(c) << (18 - 6 * k));
        bytes.extend_from_slice(&n.to_be_bytes()[1..data.len()]);
    }
    assert_eq!(bytes.len() % 4, 0);
    bytes
        .chunks(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .expect("an array of numbers")
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let worst = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(worst <= 1e-6, "{what}: differs by {worst}");
}

/// `/v1/embeddings` gives `synaptix embed --json`'s vectors exactly, as floats and as base64,
/// with the token counts as usage; token-id inputs and `dimensions` work; errors are OpenAI's.
#[test]
fn embeddings_match_synaptix_embed() {
    let Some(model) = minilm() else { return };
    let texts = ["A man is playing a guitar.", "Someone plays the guitar."];
    let out = Command::new(env!("CARGO_BIN_EXE_synaptix"))
        .args(["embed", &model, texts[0], texts[1], "--json", "-t", "2"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let embed: Value = serde_json::from_slice(&out.stdout).unwrap();
    let want: Vec<Vec<f32>> = embed["embeddings"]
        .as_array()
        .unwrap()
        .iter()
        .map(floats)
        .collect();
    let tokens: Vec<Vec<u64>> = embed["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            t.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap())
                .collect()
        })
        .collect();
    let n_tokens: usize = tokens.iter().map(Vec::len).sum();

    let server = Server::start(&model);
    let models: Value = serde_json::from_str(&server.request("GET", "/v1/models", "").1).unwrap();
    assert_eq!(models["data"][0]["id"], "all-minilm-l6-v2");
    assert_eq!(models["data"][0]["object"], "model");
    assert_eq!(server.request("GET", "/health", "").0, 200);

    for format in ["float", "base64"] {
        let got = server.json(
            "/v1/embeddings",
            json!({"input": texts, "model": "all-minilm-l6-v2", "encoding_format": format}),
        );
        assert_eq!(got["object"], "list");
        assert_eq!(got["model"], "all-minilm-l6-v2");
        assert_eq!(got["usage"]["prompt_tokens"], n_tokens);
        assert_eq!(got["usage"]["total_tokens"], n_tokens);
        let data = got["data"].as_array().unwrap();
        assert_eq!(data.len(), 2);
        for (i, item) in data.iter().enumerate() {
            assert_eq!(item["object"], "embedding");
            assert_eq!(item["index"], i);
            let v = match format {
                "float" => floats(&item["embedding"]),
                _ => decode_base64_f32(item["embedding"].as_str().expect("a base64 string")),
            };
            // The same forward pass in the same batch: the same f32 values, bit for bit.
            assert_eq!(v, want[i], "{format} embedding {i}");
        }
    }

    // One text as a string; the same text as its token ids.
    let one = server.json("/v1/embeddings", json!({"input": texts[1]}));
    assert_close(&floats(&one["data"][0]["embedding"]), &want[1], "one text");
    assert_eq!(one["usage"]["prompt_tokens"], tokens[1].len());
    let ids = server.json("/v1/embeddings", json!({"input": tokens[1]}));
    assert_close(&floats(&ids["data"][0]["embedding"]), &want[1], "token ids");
    let both = server.json("/v1/embeddings", json!({"input": tokens}));
    assert_close(&floats(&both["data"][0]["embedding"]), &want[0], "ids 0");
    assert_close(&floats(&both["data"][1]["embedding"]), &want[1], "ids 1");

    // dimensions: the first values, L2-normalised again.
    let short = server.json(
        "/v1/embeddings",
        json!({"input": texts[0], "dimensions": 64}),
    );
    let v = floats(&short["data"][0]["embedding"]);
    let norm = want[0][..64].iter().map(|x| x * x).sum::<f32>().sqrt();
    let expect: Vec<f32> = want[0][..64].iter().map(|x| x / norm).collect();
    assert_close(&v, &expect, "dimensions 64");

    let error = |method: &str, path: &str, body: &str, status: u16| {
        let (got, text) = server.request(method, path, body);
        assert_eq!(got, status, "{method} {path} {body}: {text}");
        let v: Value = serde_json::from_str(&text).expect("a JSON error");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{text}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{text}"
        );
        v["error"]["message"].as_str().unwrap().to_string()
    };
    error("GET", "/nowhere", "", 404);
    error("GET", "/v1/embeddings", "", 405);
    error("POST", "/v1/embeddings", "{not json", 400);
    for body in [
        json!({}),
        json!({"input": ""}),
        json!({"input": []}),
        json!({"input": ["a", ""]}),
        json!({"input": 42}),
        json!({"input": [{"text": "a"}]}),
        json!({"input": [1, "a"]}),
        json!({"input": [999999999]}),
        json!({"input": vec!["a"; 2049]}),
        json!({"input": vec![101; 300]}),
        json!({"input": "a", "encoding_format": "int8"}),
        json!({"input": "a", "dimensions": 0}),
        json!({"input": "a", "dimensions": 385}),
    ] {
        error("POST", "/v1/embeddings", &body.to_string(), 400);
    }
    // The text-generation endpoints say what this server runs.
    let message = error(
        "POST",
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Hi"}]}).to_string(),
        400,
    );
    assert!(message.contains("embedding model"), "{message}");
    error(
        "POST",
        "/v1/completions",
        &json!({"prompt": "Hi"}).to_string(),
        400,
    );
    // Still serving.
    let again = server.json("/v1/embeddings", json!({"input": texts[0]}));
    assert_close(
        &floats(&again["data"][0]["embedding"]),
        &want[0],
        "after errors",
    );
}

/// A text-generation server answers `/v1/embeddings` with a 400 that says why.
#[test]
fn a_text_generation_server_refuses_embeddings() {
    let model = format!(
        "{}/../../tests/fixtures/synthetic/llama-tiny.gguf",
        env!("CARGO_MANIFEST_DIR")
    );
    let server = Server::start(&model);
    let (status, text) = server.request(
        "POST",
        "/v1/embeddings",
        &json!({"input": "hello"}).to_string(),
    );
    assert_eq!(status, 400, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("text-generation model")),
        "{text}"
    );
}

/// `/v1/audio/speech` on the Piper voice gives the bytes `synaptix speak` writes for the same text
/// and options (WAV and raw PCM, `speed` as the length scale's divisor), and refuses what it
/// cannot do; the other endpoints say this server runs a voice.
#[test]
fn speech_matches_synaptix_speak() {
    let voice = cache::models_dir().join("piper-en-us-joe-medium");
    assert!(
        voice.exists(),
        "the voice is missing: run scripts/fetch-models.sh"
    );
    let voice = voice.display().to_string();
    let server = Server::start(&voice);
    let text = "Good morning. The server speaks too.";
    let dir = std::env::temp_dir().join(format!("synaptix-serve-speech-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let wav = dir.join("speak.wav").display().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_synaptix"))
        .args(["speak", &voice, text, "-o", &wav, "--seed", "3", "-t", "2"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (status, kind, body) = server.post_bytes(
        "/v1/audio/speech",
        &json!({"model": "tts-1", "voice": "alloy", "input": text, "seed": 3}).to_string(),
    );
    assert_eq!((status, kind.as_str()), (200, "audio/wav"));
    assert_eq!(body, std::fs::read(&wav).unwrap());

    let raw = Command::new(env!("CARGO_BIN_EXE_synaptix"))
        .args(["speak", &voice, text, "-o", "-", "--length-scale", "0.5"])
        .args(["--noise-scale", "0", "--noise-w", "0", "-t", "2"])
        .output()
        .unwrap();
    assert!(raw.status.success());
    let (status, kind, body) = server.post_bytes(
        "/v1/audio/speech",
        &json!({"input": text, "response_format": "pcm", "speed": 2.0,
                "noise_scale": 0, "noise_w": 0})
        .to_string(),
    );
    assert_eq!((status, kind.as_str()), (200, "audio/pcm"));
    assert_eq!(body, raw.stdout);
    std::fs::remove_dir_all(&dir).ok();

    for (path, body, expect) in [
        (
            "/v1/audio/speech",
            json!({"input": "Hi.", "response_format": "mp3"}),
            "wav or pcm",
        ),
        ("/v1/audio/speech", json!({"input": ""}), "empty"),
        (
            "/v1/audio/speech",
            json!({"input": "Hi.", "speed": 10}),
            "speed",
        ),
        ("/v1/embeddings", json!({"input": "Hi."}), "a voice"),
        (
            "/v1/chat/completions",
            json!({"messages": []}),
            "/v1/audio/speech",
        ),
    ] {
        let (status, text) = server.request("POST", path, &body.to_string());
        assert_eq!(status, 400, "{path}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        let message = v["error"]["message"].as_str().unwrap_or("");
        assert!(message.contains(expect), "{path}: {message}");
    }
    let models = server.request("GET", "/v1/models", "").1;
    assert!(models.contains("piper-en-us-joe-medium"), "{models}");
}

/// A `multipart/form-data` body of `(name, filename, data)` parts, boundary `synaptixTEST`.
fn multipart(parts: &[(&str, Option<&str>, &[u8])]) -> Vec<u8> {
    let mut b = Vec::new();
    for (name, filename, data) in parts {
        b.extend_from_slice(b"--synaptixTEST\r\n");
        let file = filename.map_or(String::new(), |f| format!("; filename=\"{f}\""));
        b.extend_from_slice(
            format!("Content-Disposition: form-data; name=\"{name}\"{file}\r\n\r\n").as_bytes(),
        );
        b.extend_from_slice(data);
        b.extend_from_slice(b"\r\n");
    }
    b.extend_from_slice(b"--synaptixTEST--\r\n");
    b
}

/// `/v1/audio/transcriptions` on whisper-base gives what `synaptix transcribe` gives for the same
/// file: the text (json), the segments and, with word granularity, the words (verbose_json),
/// subtitles (srt); bad uploads and the other endpoints get 400s that say why.
#[test]
fn transcriptions_match_synaptix_transcribe() {
    let whisper = cache::models_dir().join("whisper-base");
    assert!(
        whisper.exists(),
        "whisper-base is missing: run scripts/fetch-models.sh"
    );
    let whisper = whisper.display().to_string();
    let wav_path = format!(
        "{}/../../tests/fixtures/whisper/speech16k.wav",
        env!("CARGO_MANIFEST_DIR")
    );
    let wav = std::fs::read(&wav_path).unwrap();
    let cli = Command::new(env!("CARGO_BIN_EXE_synaptix"))
        .args([
            "transcribe",
            &whisper,
            &wav_path,
            "--word-timestamps",
            "--json",
            "-t",
            "2",
        ])
        .output()
        .unwrap();
    assert!(cli.status.success());
    let want: Value = serde_json::from_slice(&cli.stdout).unwrap();

    let server = Server::start(&whisper);
    let ct = "multipart/form-data; boundary=synaptixTEST";
    let post = |parts: &[(&str, Option<&str>, &[u8])]| {
        server.post_raw("/v1/audio/transcriptions", ct, &multipart(parts))
    };
    let (status, kind, body) = post(&[
        ("file", Some("speech.wav"), &wav),
        ("model", None, b"whisper-1"),
    ]);
    assert_eq!((status, kind.as_str()), (200, "application/json"));
    let j: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(j["text"], want["text"]);

    let (status, _, body) = post(&[
        ("file", Some("speech.wav"), &wav),
        ("response_format", None, b"verbose_json"),
        ("timestamp_granularities[]", None, b"word"),
        ("language", None, b"en"),
    ]);
    assert_eq!(status, 200);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["language"], "en");
    let (got, exp) = (
        v["segments"].as_array().unwrap(),
        want["segments"].as_array().unwrap(),
    );
    assert_eq!(got.len(), exp.len());
    for (g, e) in got.iter().zip(exp) {
        for key in ["start", "end", "text", "tokens"] {
            assert_eq!(g[key], e[key], "{key}");
        }
    }
    let words: Vec<Value> = exp
        .iter()
        .flat_map(|s| s["words"].as_array().unwrap().clone())
        .map(|w| json!({"word": w["word"], "start": w["start"], "end": w["end"]}))
        .collect();
    assert_eq!(v["words"].as_array().unwrap(), &words);

    let (status, _, body) = post(&[
        ("file", Some("speech.wav"), &wav),
        ("response_format", None, b"srt"),
    ]);
    assert_eq!(status, 200);
    let srt = String::from_utf8(body).unwrap();
    assert!(
        srt.starts_with("1\n00:00:00,000 --> 00:00:03,360\nThe quick"),
        "{srt}"
    );
    assert_eq!(srt.matches(" --> ").count(), 3, "{srt}");

    // A prompt is faster-whisper's initial_prompt: it spells the fox "brown" (prompt.json).
    let (status, _, body) = post(&[
        ("file", Some("speech.wav"), &wav),
        (
            "prompt",
            None,
            b"Speech recognition, and the quick brown fox.",
        ),
    ]);
    assert_eq!(status, 200);
    let text = String::from_utf8_lossy(&body);
    assert!(
        text.contains("The quick brown fox") && text.contains("Speech recognition"),
        "{text}"
    );

    // vad_filter: faster-whisper's vad_filter=True segments for the clip (vad.json).
    let vad_golden: Value = serde_json::from_str(
        &std::fs::read_to_string(format!(
            "{}/../../tests/fixtures/whisper/vad.json",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap(),
    )
    .unwrap();
    let (status, _, body) = post(&[
        ("file", Some("speech.wav"), &wav),
        ("response_format", None, b"verbose_json"),
        ("vad_filter", None, b"true"),
    ]);
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let v: Value = serde_json::from_slice(&body).unwrap();
    let want = vad_golden["clips"][0]["segments"].as_array().unwrap();
    let got = v["segments"].as_array().unwrap();
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        for key in ["start", "end", "text", "tokens"] {
            assert_eq!(g[key], w[key], "{key}");
        }
    }

    let readme = std::fs::read(format!("{}/../../README.md", env!("CARGO_MANIFEST_DIR"))).unwrap();
    for (parts, expect) in [
        (
            vec![("file", Some("notes.md"), &readme[..])],
            "notes.md: unsupported audio format",
        ),
        (
            vec![("model", None, &b"whisper-1"[..])],
            "`file` is missing",
        ),
        (
            vec![
                ("file", Some("a.wav"), &wav[..]),
                ("response_format", None, b"mp3"),
            ],
            "mp3",
        ),
        (
            vec![("file", Some("a.wav"), &wav[..]), ("language", None, b"xx")],
            "xx",
        ),
    ] {
        let (status, _, body) = post(&parts);
        let text = String::from_utf8_lossy(&body);
        assert_eq!(status, 400, "{text}");
        assert!(text.contains(expect), "{expect}: {text}");
    }
    let (status, _, body) = server.post_raw("/v1/audio/transcriptions", "application/json", b"{}");
    assert_eq!(status, 400);
    assert!(String::from_utf8_lossy(&body).contains("multipart/form-data"));
    let (status, text) = server.request(
        "POST",
        "/v1/embeddings",
        &json!({"input": "hi"}).to_string(),
    );
    assert_eq!(status, 400);
    assert!(text.contains("speech-to-text model"), "{text}");
}
