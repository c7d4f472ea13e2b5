//! `synaptix serve`: an OpenAI-compatible HTTP server for one model.
//!
//! Endpoints: `GET /health`, `GET /v1/models`, `POST /v1/chat/completions` (the model's chat
//! template) and `POST /v1/completions` (a raw prompt), with `"stream": true` as server-sent
//! events. Each connection is read on its own thread, which answers what needs no model at
//! once; generations run one at a time, in arrival order, over one KV cache: a request that
//! starts like the previous one (a conversation resent with a new turn) only evaluates what is
//! new (`usage.prompt_tokens_details.cached_tokens` says how much was reused).
//!
//! A sentence-transformers directory (what `synaptix embed` takes) is served instead with
//! `POST /v1/embeddings` (see [`embeddings`]), a Piper voice with `POST /v1/audio/speech` (see
//! [`speech`]) and a Whisper model with `POST /v1/audio/transcriptions` and `/translations` (see
//! [`transcription`]); each server answers the other kinds' endpoints with a clear 400.

mod embeddings;
mod speech;
mod transcription;

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use serde::Deserialize;
use serde_json::{json, Value};
use synaptix_infer::{ChatMessage, ChatTemplate, Engine, GenerateOptions, StopReason};
use synaptix_models::{Cache, NoTap};
use synaptix_sample::SamplerConfig;

use crate::http::{self, EventStream, HttpError, Request};

#[derive(Args)]
#[command(after_help = "Examples:\n  \
    synaptix serve qwen2.5-coder-0.5b --port 8080\n  \
    curl http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json' \\\n    \
    -d '{\"messages\": [{\"role\": \"user\", \"content\": \"Hi!\"}]}'\n\n  \
    synaptix serve all-minilm-l6-v2 --port 8080\n  \
    curl http://127.0.0.1:8080/v1/embeddings -H 'Content-Type: application/json' \\\n    \
    -d '{\"input\": [\"A man is playing a guitar.\", \"Someone plays the guitar.\"]}'\n  \
    curl http://127.0.0.1:8080/v1/embeddings -H 'Content-Type: application/json' \\\n    \
    -d '{\"input\": \"hello\", \"encoding_format\": \"base64\", \"dimensions\": 128}'\n\n\
    Text generation (a GGUF model): POST /v1/chat/completions and /v1/completions. Request\n\
    fields: messages (chat) or prompt (completions), max_tokens, temperature, top_p, top_k,\n\
    min_p, presence_penalty, frequency_penalty, repeat_penalty, seed, stop (a string or up to 4),\n\
    stream. Missing ones take the defaults of `synaptix run`.\n\n\
    Embeddings (a sentence-transformers directory, as `synaptix embed` takes): POST\n\
    /v1/embeddings. Request fields: input (a string, an array of up to 2048 strings, an array\n\
    of token ids or an array of such arrays), encoding_format (float, the default, or base64:\n\
    little-endian f32), dimensions (keep the first n values and L2-normalise them again), model\n\
    and user (ignored). Texts are embedded exactly as `synaptix embed` does (cut to the model's\n\
    max_seq_length); token ids are embedded as given (include [CLS] and [SEP] yourself), and\n\
    more of them than max_seq_length is an error.\n\n\
    Speech (a Piper voice, as `synaptix speak` takes): POST /v1/audio/speech. Request fields:\n\
    input (up to 4096 characters), response_format (wav, the default, or pcm: raw 16-bit\n\
    little-endian samples), speed (0.25 to 4), voice and model (ignored); synaptix's own:\n\
    noise_scale, noise_w, length_scale, seed (default 0), sentence_silence. The audio is what\n\
    `synaptix speak` writes for the same text and options.\n  \
    synaptix serve piper-en-us-joe-medium --port 8080\n  \
    curl http://127.0.0.1:8080/v1/audio/speech -H 'Content-Type: application/json' \\\n    \
    -d '{\"input\": \"Hello there.\", \"voice\": \"joe\"}' -o hello.wav\n\n\
    Speech to text (a Whisper directory, as `synaptix transcribe` takes): POST\n\
    /v1/audio/transcriptions and /v1/audio/translations, multipart/form-data. Fields: file (WAV,\n\
    FLAC, MP3 or Ogg Vorbis, up to 25 MiB), response_format (json, the default, text,\n\
    verbose_json, srt, vtt), language, timestamp_granularities[] (segment, word: with\n\
    verbose_json), prompt (text before the speech), vad_filter (true: only the speech Silero\n\
    VAD finds, when silero-vad is fetched), temperature (0 only), model (ignored). The decoding is `synaptix\n\
    transcribe`'s defaults.\n  \
    synaptix serve whisper-base --port 8080\n  \
    curl http://127.0.0.1:8080/v1/audio/transcriptions -F file=@speech.wav -F response_format=srt")]
pub struct ServeArgs {
    /// GGUF model file or .syn bundle, sentence-transformers directory (embeddings), Piper voice (.onnx or its
    /// directory: speech), Whisper directory (speech to text), or the name of a fetched model
    /// (gemma3-270m, qwen2.5-coder-0.5b, all-minilm-l6-v2, piper-en-us-joe-medium, whisper-base)
    pub model: PathBuf,
    /// Address to listen on
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port; the one taken is printed)
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Name the model is served under (default: the model file's name)
    #[arg(long)]
    pub alias: Option<String>,
    /// Jinja chat template to use instead of the model's own
    #[arg(long, value_name = "FILE")]
    pub chat_template: Option<PathBuf>,
    /// Context size in tokens (0: 4096, or the model's training context if smaller; not for
    /// embedding models)
    #[arg(short = 'c', long = "ctx-size", default_value_t = 0)]
    pub ctx_size: usize,
    /// CPU threads (0: all cores)
    #[arg(short = 't', long, default_value_t = 0)]
    pub threads: usize,
    /// Where to run: auto (a GPU if one is usable, else the CPU), cpu, cuda, cuda:N
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Require `Authorization: Bearer KEY` on every endpoint but /health
    #[arg(long, value_name = "KEY")]
    pub api_key: Option<String>,
}

/// Seconds a client may take to send its request (the server waits for nobody longer).
const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections read at once (each on its own thread, for at most READ_TIMEOUT).
const MAX_READERS: usize = 64;
/// Most stop strings a request may give (OpenAI's limit).
const MAX_STOPS: usize = 4;

pub fn run(mut a: ServeArgs) -> Result<()> {
    a.model = synaptix_bundle::cache::resolve_model(&a.model.to_string_lossy());
    if speech::is_voice(&a.model) {
        return speech::run(a);
    }
    if transcription::is_whisper(&a.model) {
        return transcription::run(a);
    }
    if embeddings::is_embedding_model(&a.model) {
        return embeddings::run(a);
    }
    crate::threads::init(a.threads)?;
    let custom = match &a.chat_template {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("cannot read chat template {}", path.display()))?,
        ),
        None => None,
    };
    let (device, notice) =
        crate::device::resolve_for_model(&a.device, std::path::Path::new(&a.model))?;
    let engine = Engine::load(&a.model, device)?;
    if let Some(n) = notice {
        eprintln!("{n}");
    }
    // A model without a chat template still serves completions.
    let template = ChatTemplate::for_engine(&engine, custom).map_err(|e| e.to_string());
    let n_ctx = engine.context_size(a.ctx_size)?;
    let name = served_name(&a);
    let listener = bind(&a)?;
    eprintln!(
        "synaptix serve: {name} on {}, context {n_ctx} tokens, listening on http://{}",
        engine.model.device(),
        listener.local_addr()?
    );
    let mut server = Server {
        cache: engine.new_cache(n_ctx)?,
        engine: &engine,
        template,
        name,
        n_ctx,
        cached: Vec::new(),
        served: 0,
    };
    let info = Info {
        name: server.name.clone(),
        task: Task::Generation,
        n_ctx,
        api_key: a.api_key.clone(),
    };
    serve_forever(listener, info, |request, conn| server.route(request, conn));
    Ok(())
}

/// The name the model is served under: `--alias`, else the model file's (or directory's) name.
fn served_name(a: &ServeArgs) -> String {
    a.alias.clone().unwrap_or_else(|| {
        a.model
            .file_stem()
            .map_or("model".into(), |s| s.to_string_lossy().into_owned())
    })
}

fn bind(a: &ServeArgs) -> Result<TcpListener> {
    TcpListener::bind((a.host.as_str(), a.port))
        .with_context(|| format!("cannot listen on {}:{}", a.host, a.port))
}

/// Accepts connections forever: each is read on its own thread, which answers what needs no
/// model; the requests that do are passed to `handle`, one at a time in arrival order, on this
/// thread (the one that owns the model).
fn serve_forever(
    listener: TcpListener,
    info: Info,
    mut handle: impl FnMut(&Request, &mut TcpStream) -> std::result::Result<(), ApiError>,
) {
    let (jobs, queue) = std::sync::mpsc::channel::<(Request, TcpStream)>();
    // Past MAX_READERS connections being read, more are turned away by one thread that reads
    // their request briefly (so that the answer is not lost to a reset) and answers 503.
    let (turn_away, rejected) = std::sync::mpsc::channel::<TcpStream>();
    std::thread::spawn(move || {
        for mut conn in rejected {
            let _ = conn.set_read_timeout(Some(Duration::from_millis(500)));
            let _ = http::read_request(&mut conn);
            let e = ApiError {
                status: 503,
                message: "too many connections; retry later".into(),
            };
            let _ = e.send(&mut conn);
        }
    });
    std::thread::spawn(move || {
        let readers = Arc::new(AtomicUsize::new(0));
        for conn in listener.incoming() {
            match conn {
                Ok(conn) if readers.load(Ordering::Relaxed) >= MAX_READERS => {
                    let _ = turn_away.send(conn);
                }
                Ok(conn) => {
                    let (jobs, info, readers) = (jobs.clone(), info.clone(), readers.clone());
                    readers.fetch_add(1, Ordering::Relaxed);
                    std::thread::spawn(move || {
                        read_connection(conn, &info, &jobs);
                        readers.fetch_sub(1, Ordering::Relaxed);
                    });
                }
                Err(e) => eprintln!("synaptix serve: accept failed: {e}"),
            }
        }
    });
    for (request, mut conn) in queue {
        if let Err(e) = handle(&request, &mut conn) {
            // Nothing has been written when a handler fails.
            let _ = e.send(&mut conn);
        }
    }
}

/// What a server does with its model.
#[derive(Clone, Copy, PartialEq)]
enum Task {
    /// Chat and text completions.
    Generation,
    /// `/v1/embeddings`.
    Embedding,
    /// `/v1/audio/speech`.
    Speech,
    /// `/v1/audio/transcriptions` and `/v1/audio/translations`.
    Transcription,
}

impl Task {
    /// The endpoints a server for this task answers, for messages.
    fn endpoints(self) -> &'static str {
        match self {
            Task::Generation => "/v1/chat/completions and /v1/completions",
            Task::Embedding => "/v1/embeddings",
            Task::Speech => "/v1/audio/speech",
            Task::Transcription => "/v1/audio/transcriptions and /v1/audio/translations",
        }
    }

    fn answers(self, path: &str) -> bool {
        match self {
            Task::Generation => matches!(path, "/v1/chat/completions" | "/v1/completions"),
            Task::Embedding => path == "/v1/embeddings",
            Task::Speech => path == "/v1/audio/speech",
            Task::Transcription => {
                matches!(path, "/v1/audio/transcriptions" | "/v1/audio/translations")
            }
        }
    }

    fn kind(self) -> &'static str {
        match self {
            Task::Generation => "a text-generation model",
            Task::Embedding => "an embedding model",
            Task::Speech => "a voice",
            Task::Transcription => "a speech-to-text model",
        }
    }
}

/// What the connection threads know of the model.
#[derive(Clone)]
struct Info {
    name: String,
    task: Task,
    /// The context size (for an embedding model, its max_seq_length).
    n_ctx: usize,
    /// `--api-key`.
    api_key: Option<String>,
}

/// Reads one request from `conn`; answers it if it needs no model, else queues it for the
/// model's thread.
fn read_connection(
    mut conn: TcpStream,
    info: &Info,
    jobs: &std::sync::mpsc::Sender<(Request, TcpStream)>,
) {
    // A client that sends nothing holds only its own thread, and not for long.
    if conn.set_read_timeout(Some(READ_TIMEOUT)).is_err() {
        return;
    }
    let request = match http::read_request(&mut conn) {
        Ok(r) => r,
        Err(HttpError::Bad(status, message)) => {
            let _ = ApiError { status, message }.send(&mut conn);
            return;
        }
        Err(HttpError::Io(e)) => {
            // A client that connects and leaves (a port probe) is not worth a line.
            if e.kind() != std::io::ErrorKind::UnexpectedEof {
                eprintln!("synaptix serve: request not read: {e}");
            }
            return;
        }
    };
    let authorized = match &info.api_key {
        None => true,
        Some(key) => request
            .authorization
            .as_deref()
            .and_then(|h| h.strip_prefix("Bearer "))
            .is_some_and(|given| given.trim() == key),
    };
    if !authorized && request.path != "/health" {
        let _ = ApiError {
            status: 401,
            message: "missing or wrong API key (Authorization: Bearer KEY)".into(),
        }
        .send(&mut conn);
        return;
    }
    let reply = |conn: &mut TcpStream, v: Value| {
        let _ = http::respond(conn, 200, "application/json", v.to_string().as_bytes());
    };
    match (request.method.as_str(), request.path.as_str()) {
        ("GET", "/health") => reply(&mut conn, json!({"status": "ok"})),
        ("GET", "/v1/models") => reply(
            &mut conn,
            json!({"object": "list", "data": [{
                "id": info.name, "object": "model", "created": 0, "owned_by": "synaptix",
                "context_length": info.n_ctx,
            }]}),
        ),
        (
            "POST",
            "/v1/chat/completions"
            | "/v1/completions"
            | "/v1/embeddings"
            | "/v1/audio/speech"
            | "/v1/audio/transcriptions"
            | "/v1/audio/translations",
        ) if !info.task.answers(&request.path) => {
            let wanted = [
                Task::Generation,
                Task::Embedding,
                Task::Speech,
                Task::Transcription,
            ]
            .into_iter()
            .find(|t| t.answers(&request.path))
            .map_or("another model", |t| t.kind());
            let example = match wanted {
                "an embedding model" => ", e.g. `synaptix serve all-minilm-l6-v2`",
                "a voice" => ", e.g. `synaptix serve piper-en-us-joe-medium`",
                "a speech-to-text model" => ", e.g. `synaptix serve whisper-base`",
                _ => ", a GGUF model",
            };
            let _ = ApiError::bad(format!(
                "this server runs {} ({}): it answers {}, not {} (serve {wanted} for that{example})",
                info.task.kind(),
                info.name,
                info.task.endpoints(),
                request.path
            ))
            .send(&mut conn);
        }
        (
            "POST",
            "/v1/chat/completions"
            | "/v1/completions"
            | "/v1/embeddings"
            | "/v1/audio/speech"
            | "/v1/audio/transcriptions"
            | "/v1/audio/translations",
        ) => {
            // The model's thread answers it (it lives as long as the server).
            let _ = jobs.send((request, conn));
        }
        (
            _,
            "/health"
            | "/v1/models"
            | "/v1/chat/completions"
            | "/v1/completions"
            | "/v1/embeddings"
            | "/v1/audio/speech"
            | "/v1/audio/transcriptions"
            | "/v1/audio/translations",
        ) => {
            let _ = ApiError {
                status: 405,
                message: format!("{} is not allowed on {}", request.method, request.path),
            }
            .send(&mut conn);
        }
        _ => {
            let _ = ApiError {
                status: 404,
                message: format!("no endpoint {}", request.path),
            }
            .send(&mut conn);
        }
    }
}

struct Server<'e> {
    engine: &'e Engine,
    template: std::result::Result<ChatTemplate, String>,
    name: String,
    n_ctx: usize,
    cache: Box<dyn Cache>,
    /// The tokens whose keys and values `cache` holds, in order.
    cached: Vec<u32>,
    /// Requests answered so far (for response ids).
    served: u64,
}

/// An error answered as OpenAI does: a status and `{"error": {"message", "type"}}`.
struct ApiError {
    status: u16,
    message: String,
}

impl ApiError {
    fn bad(message: impl Into<String>) -> Self {
        ApiError {
            status: 400,
            message: message.into(),
        }
    }

    /// Answers with this error (the connection closes after it).
    fn send(&self, conn: &mut TcpStream) -> std::io::Result<()> {
        http::respond(conn, self.status, "application/json", &self.body())
    }

    fn body(&self) -> Vec<u8> {
        let kind = if self.status >= 500 {
            "server_error"
        } else {
            "invalid_request_error"
        };
        json!({"error": {"message": self.message, "type": kind}})
            .to_string()
            .into_bytes()
    }
}

/// What the two generation endpoints share of a request.
#[derive(Deserialize)]
struct Params {
    max_tokens: Option<usize>,
    max_completion_tokens: Option<usize>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<usize>,
    min_p: Option<f32>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    repeat_penalty: Option<f32>,
    seed: Option<u64>,
    stop: Option<Stop>,
    #[serde(default)]
    stream: bool,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
struct ChatRequest {
    messages: Vec<Message>,
    #[serde(flatten)]
    params: Params,
}

#[derive(Deserialize)]
struct Message {
    role: String,
    content: Content,
}

/// A message's content: a string, or parts of which the text ones are joined.
#[derive(Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Deserialize)]
struct Part {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

#[derive(Deserialize)]
struct CompletionRequest {
    prompt: String,
    #[serde(flatten)]
    params: Params,
}

/// Which endpoint a generation answers.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Chat,
    Completion,
}

impl Server<'_> {
    /// A generation request (the connection threads answer everything else).
    fn route(&mut self, r: &Request, conn: &mut TcpStream) -> std::result::Result<(), ApiError> {
        if r.path == "/v1/chat/completions" {
            let req: ChatRequest = parse_json(&r.body)?;
            let tokens = self.chat_tokens(&req.messages)?;
            self.generate(Kind::Chat, tokens, &req.params, conn)
        } else {
            let req: CompletionRequest = parse_json(&r.body)?;
            let tokens = self
                .engine
                .tokenize_prompt(&req.prompt)
                .map_err(|e| ApiError::bad(e.to_string()))?;
            self.generate(Kind::Completion, tokens, &req.params, conn)
        }
    }

    /// The conversation rendered with the model's template and tokenized.
    fn chat_tokens(&self, messages: &[Message]) -> std::result::Result<Vec<u32>, ApiError> {
        let template = self
            .template
            .as_ref()
            .map_err(|e| ApiError::bad(e.clone()))?;
        if messages.is_empty() {
            return Err(ApiError::bad("messages is empty"));
        }
        let mut system = None;
        let mut turns = Vec::with_capacity(messages.len());
        for (i, m) in messages.iter().enumerate() {
            let content = match &m.content {
                Content::Text(t) => t.clone(),
                Content::Parts(parts) => {
                    let mut text = String::new();
                    for p in parts {
                        match (p.kind.as_str(), &p.text) {
                            ("text", Some(t)) => text.push_str(t),
                            (kind, _) => {
                                return Err(ApiError::bad(format!(
                                    "message content of type {kind:?} is not supported"
                                )))
                            }
                        }
                    }
                    text
                }
            };
            match m.role.as_str() {
                "system" | "developer" if i == 0 => system = Some(content),
                "user" | "assistant" => turns.push(ChatMessage {
                    role: m.role.clone(),
                    content,
                }),
                role => {
                    return Err(ApiError::bad(format!(
                        "message {i}: role {role:?} is not supported here"
                    )))
                }
            }
        }
        let text = template
            .render(system.as_deref(), &turns, true)
            .map_err(|e| ApiError::bad(e.to_string()))?;
        self.engine
            .tokenizer
            .encode(&text, true, true)
            .map_err(|e| ApiError::bad(e.to_string()))
    }

    /// Samples an answer to `tokens` with the request's parameters and writes the response,
    /// whole or as events.
    fn generate(
        &mut self,
        kind: Kind,
        tokens: Vec<u32>,
        p: &Params,
        conn: &mut TcpStream,
    ) -> std::result::Result<(), ApiError> {
        if tokens.is_empty() {
            return Err(ApiError::bad("the prompt is empty"));
        }
        if tokens.len() >= self.n_ctx {
            return Err(ApiError::bad(format!(
                "the prompt has {} tokens; the context holds {}",
                tokens.len(),
                self.n_ctx
            )));
        }
        let room = self.n_ctx - tokens.len();
        let max_tokens = p
            .max_completion_tokens
            .or(p.max_tokens)
            .unwrap_or(room)
            .min(room);
        let seed = p.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        });
        let sampler = SamplerConfig {
            temperature: p.temperature.unwrap_or(0.8),
            top_k: p.top_k.unwrap_or(40),
            top_p: p.top_p.unwrap_or(0.95),
            min_p: p.min_p.unwrap_or(0.05),
            repeat_penalty: p.repeat_penalty.unwrap_or(1.0),
            presence_penalty: p.presence_penalty.unwrap_or(0.0),
            frequency_penalty: p.frequency_penalty.unwrap_or(0.0),
            penalty_last_n: 64,
            seed,
        };
        // OpenAI's range (the CLI also takes negative temperatures, as greedy).
        if !(0.0..=2.0).contains(&sampler.temperature) {
            return Err(ApiError::bad("temperature must be in [0, 2]"));
        }
        sampler
            .validate()
            .map_err(|e| ApiError::bad(e.to_string()))?;
        let stops: Vec<String> = match &p.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        if stops.len() > MAX_STOPS || stops.iter().any(String::is_empty) {
            return Err(ApiError::bad(format!(
                "stop takes up to {MAX_STOPS} non-empty strings"
            )));
        }
        let opts = GenerateOptions {
            max_tokens,
            n_ctx: self.n_ctx,
            sampler,
            stop_at_eog: true,
        };

        // Keep the cached prefix this prompt shares; evaluate at least one token for logits.
        let keep = self
            .cached
            .iter()
            .zip(&tokens)
            .take_while(|(a, b)| a == b)
            .count()
            .min(tokens.len() - 1);
        self.cache.truncate(keep);
        self.cached.truncate(keep);

        self.served += 1;
        let id = format!(
            "{}-{}",
            if kind == Kind::Chat {
                "chatcmpl"
            } else {
                "cmpl"
            },
            self.served
        );
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let chunk = |delta: Value, finish: Value| -> Value {
            match kind {
                Kind::Chat => json!({
                    "id": id, "object": "chat.completion.chunk", "created": created,
                    "model": self.name,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                }),
                Kind::Completion => json!({
                    "id": id, "object": "text_completion", "created": created,
                    "model": self.name,
                    "choices": [{"index": 0, "text": delta.get("content").cloned()
                        .unwrap_or(json!("")), "finish_reason": finish}],
                }),
            }
        };

        let mut events = if p.stream {
            let mut events = EventStream::start(conn).map_err(|e| ApiError::bad(e.to_string()))?;
            if kind == Kind::Chat {
                let _ = events.send(&chunk(json!({"role": "assistant"}), Value::Null).to_string());
            }
            Some(events)
        } else {
            None
        };
        let mut stopper = StopMatcher::new(stops);
        let mut client_gone = false;
        let gen = self.engine.generate_in(
            self.cache.as_mut(),
            &self.cached,
            &tokens[keep..],
            &opts,
            false,
            &mut NoTap,
            |piece| {
                let (text, stopped) = stopper.push(piece);
                if let (Some(ev), false) = (events.as_mut(), text.is_empty()) {
                    let c = chunk(json!({"content": text}), Value::Null);
                    client_gone = ev.send(&c.to_string()).is_err();
                }
                !stopped && !client_gone
            },
        );
        let gen = match gen {
            Ok(g) => g,
            Err(e) => {
                // The cache may hold part of this prompt: forget it all.
                self.cache.truncate(0);
                self.cached.clear();
                let e = ApiError {
                    status: 500,
                    message: e.to_string(),
                };
                return match events.as_mut() {
                    // The head is out: the error goes as an event.
                    Some(ev) => {
                        let _ = ev.send(&String::from_utf8_lossy(&e.body()));
                        Ok(())
                    }
                    None => Err(e),
                };
            }
        };
        // The cache holds the prompt and every generated token but the last one.
        self.cached.extend_from_slice(&tokens[keep..]);
        if let Some((_, evaluated)) = gen.tokens.split_last() {
            self.cached.extend_from_slice(evaluated);
        }
        let finish = match (stopper.stopped, gen.stop) {
            (true, _) | (_, StopReason::EndOfGeneration) => "stop",
            _ => "length",
        };
        let usage = json!({
            "prompt_tokens": tokens.len(),
            "completion_tokens": gen.tokens.len(),
            "total_tokens": tokens.len() + gen.tokens.len(),
            "prompt_tokens_details": {"cached_tokens": keep},
        });
        match events.as_mut() {
            Some(ev) => {
                let tail = stopper.finish();
                if !tail.is_empty() {
                    let _ = ev.send(&chunk(json!({"content": tail}), Value::Null).to_string());
                }
                let mut last = chunk(json!({}), json!(finish));
                last["usage"] = usage;
                let _ = ev.send(&last.to_string());
                let _ = ev.send("[DONE]");
            }
            None => {
                let text = stopper.finish_whole();
                let body = match kind {
                    Kind::Chat => json!({
                        "id": id, "object": "chat.completion", "created": created,
                        "model": self.name,
                        "choices": [{"index": 0, "finish_reason": finish,
                            "message": {"role": "assistant", "content": text}}],
                        "usage": usage,
                    }),
                    Kind::Completion => json!({
                        "id": id, "object": "text_completion", "created": created,
                        "model": self.name,
                        "choices": [{"index": 0, "text": text, "finish_reason": finish}],
                        "usage": usage,
                    }),
                };
                let _ = http::respond(conn, 200, "application/json", body.to_string().as_bytes());
            }
        }
        Ok(())
    }
}

fn parse_json<T: for<'de> Deserialize<'de>>(body: &[u8]) -> std::result::Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::bad(format!("bad request body: {e}")))
}

/// Finds stop strings in streamed text. Text that could still become a stop string is held
/// back until it can no longer match; the text before a match is released, the match and what
/// follows are dropped.
struct StopMatcher {
    stops: Vec<String>,
    /// Everything released so far plus what is held back.
    text: String,
    /// Bytes of `text` released.
    released: usize,
    stopped: bool,
}

impl StopMatcher {
    fn new(stops: Vec<String>) -> Self {
        StopMatcher {
            stops,
            text: String::new(),
            released: 0,
            stopped: false,
        }
    }

    /// Adds a piece; returns the text that can be released now and whether a stop string was
    /// found (generation should end).
    fn push(&mut self, piece: &str) -> (String, bool) {
        if self.stopped {
            return (String::new(), true);
        }
        self.text.push_str(piece);
        // A stop string anywhere in what is not released yet (it may straddle the boundary).
        let search_from = self
            .stops
            .iter()
            .map(|s| self.released.saturating_sub(s.len() - 1))
            .min()
            .unwrap_or(self.released);
        let found = self
            .stops
            .iter()
            .filter_map(|s| self.text[floor_char(&self.text, search_from)..].find(s.as_str()))
            .min()
            .map(|at| floor_char(&self.text, search_from) + at);
        if let Some(at) = found {
            self.stopped = true;
            let out = self.text[self.released.min(at)..at].to_string();
            self.text.truncate(at);
            self.released = at;
            return (out, true);
        }
        // Hold back the longest tail that is a prefix of some stop string.
        let hold = self
            .stops
            .iter()
            .map(|s| {
                (1..s.len())
                    .rev()
                    .find(|&n| {
                        self.text.len() >= n
                            && self.text.is_char_boundary(self.text.len() - n)
                            && s.is_char_boundary(n)
                            && self.text.ends_with(&s[..n])
                    })
                    .unwrap_or(0)
            })
            .max()
            .unwrap_or(0);
        let upto = (self.text.len() - hold).max(self.released);
        let out = self.text[self.released..upto].to_string();
        self.released = upto;
        (out, false)
    }

    /// What is still held back, released at the end of generation.
    fn finish(&mut self) -> String {
        let out = self.text[self.released..].to_string();
        self.released = self.text.len();
        out
    }

    /// The whole answer (without the stop string).
    fn finish_whole(&mut self) -> String {
        self.finish();
        self.text.clone()
    }
}

/// The largest char boundary of `s` at or below `i`.
fn floor_char(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::StopMatcher;

    /// Feeds `pieces`; returns the released text and whether it stopped.
    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            let (t, stop) = m.push(p);
            out.push_str(&t);
            if stop {
                return (out, true);
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn stop_strings_end_the_text_even_across_pieces() {
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
        assert_eq!(run(&["\n\n"], &["one\n", "\ntwo"]), ("one".into(), true));
        assert_eq!(run(&["END"], &["xE", "N", "Dy"]), ("x".into(), true));
        // A held-back prefix that does not complete is released.
        assert_eq!(run(&["END"], &["xEN", "o"]), ("xENo".into(), false));
        assert_eq!(run(&["END"], &["xEN"]), ("xEN".into(), false));
        // The earliest of several stops wins; multi-byte text is cut on char boundaries.
        assert_eq!(run(&["é!", "b"], &["aé", "!b"]), ("a".into(), true));
        assert_eq!(run(&["zz"], &["ééé", "z"]), ("éééz".into(), false));
    }

    #[test]
    fn the_whole_answer_drops_the_stop_string() {
        let mut m = StopMatcher::new(vec!["STOP".into()]);
        let _ = m.push("keep this STOP and not this");
        assert_eq!(m.finish_whole(), "keep this ");
    }
}
