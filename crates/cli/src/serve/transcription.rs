//! `POST /v1/audio/transcriptions` and `/v1/audio/translations` for a Whisper model (what
//! `synaptix transcribe` loads), in the shape of OpenAI's audio API: a `multipart/form-data`
//! body with the audio `file` and optional fields.
//!
//! Fields:
//! - `response_format`: `json` (the default: `{"text"}`), `text`, `verbose_json` (language,
//!   duration, segments, and with `timestamp_granularities[]=word` the words), `srt` or `vtt`;
//! - `language` (a code such as `en`; detected when absent);
//! - `timestamp_granularities[]`: `segment` and/or `word` (with `verbose_json`);
//! - `model` (ignored: the server has one model);
//! - `temperature` (0 to 1, default 0): as in OpenAI's API and openai-whisper, the first of the
//!   temperatures a window is decoded at, stepping by 0.2 up to 1 while its result fails
//!   faster-whisper's thresholds (`transcribe --temperature`); so 0 is faster-whisper's default
//!   fallback, and a result is sampled only where the one at 0 fails;
//! - `prompt`: text before the speech (`transcribe --initial-prompt`);
//! - `vad_filter` (synaptix's own): `true` transcribes only the speech Silero VAD finds
//!   (`transcribe --vad-filter`; the server loads the fetched `silero-vad` when it is there).
//!
//! The decoding is otherwise `synaptix transcribe`'s defaults (beam 5, timestamps, the previous
//! text as prompt), so where no window falls back the text and segments are those it prints for
//! the same file.

use std::net::TcpStream;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use synaptix_infer::transcribe::{transcribe, Segment, TranscribeOptions};
use synaptix_infer::vad::{collect_chunks, speech_chunks, TimestampMap, VadOptions};
use synaptix_models::silero_vad::SileroVad;
use synaptix_models::whisper::{Whisper, WhisperFiles, WhisperTokens};
use synaptix_tokenizer::Tokenizer;

use super::{bind, serve_forever, served_name, ApiError, Info, ServeArgs, Task};
use crate::http::{self, Request};

/// Whether `path` is a Whisper model directory (CTranslate2's `model.bin` with its config).
pub(super) fn is_whisper(path: &Path) -> bool {
    path.is_dir() && path.join("model.bin").is_file()
}

pub(super) fn run(a: ServeArgs) -> Result<()> {
    crate::device::require_cpu(&a.device, "Whisper runs")?;
    if a.chat_template.is_some() {
        bail!("--chat-template: {} is a Whisper model", a.model.display());
    }
    crate::threads::init(a.threads)?;
    let files = WhisperFiles::in_dir(&a.model)?;
    let tokenizer = Tokenizer::from_tokenizer_json(&files.tokenizer)
        .with_context(|| format!("{}", files.tokenizer.display()))?;
    let tokens = WhisperTokens::from_config(&files.config, &|t| tokenizer.token_id(t), &|id| {
        tokenizer
            .piece(id)
            .map(|p| String::from_utf8_lossy(p).into_owned())
    })?;
    let model = Whisper::load(&files.model)?;
    let vad_path = synaptix_bundle::cache::resolve_model("silero-vad");
    let vad = if vad_path.exists() {
        Some(SileroVad::load(&vad_path)?)
    } else {
        None
    };
    let name = served_name(&a);
    let listener = bind(&a)?;
    eprintln!(
        "synaptix serve: {name} (speech to text) on cpu, listening on http://{}",
        listener.local_addr()?
    );
    let info = Info {
        name,
        task: Task::Transcription,
        n_ctx: synaptix_models::whisper::MAX_TEXT_POSITIONS,
        api_key: a.api_key.clone(),
    };
    let server = Transcriber {
        model,
        tokens,
        tokenizer,
        vad,
    };
    serve_forever(listener, info, |request, conn| server.answer(request, conn));
    Ok(())
}

struct Transcriber {
    model: Whisper,
    tokens: WhisperTokens,
    tokenizer: Tokenizer,
    vad: Option<SileroVad>,
}

/// One part of a `multipart/form-data` body.
#[derive(Debug, PartialEq)]
struct Part {
    name: String,
    filename: Option<String>,
    data: Vec<u8>,
}

/// The parts of a `multipart/form-data` body delimited by `boundary` (RFC 7578).
fn parse_multipart(body: &[u8], boundary: &str) -> std::result::Result<Vec<Part>, ApiError> {
    let bad = |m: &str| ApiError::bad(format!("bad multipart/form-data body: {m}"));
    let delimiter = format!("--{boundary}").into_bytes();
    let find = |hay: &[u8], from: usize, needle: &[u8]| {
        hay.get(from..)
            .and_then(|h| h.windows(needle.len()).position(|w| w == needle))
            .map(|p| p + from)
    };
    let mut at = find(body, 0, &delimiter).ok_or_else(|| bad("no boundary"))?;
    let mut parts = Vec::new();
    loop {
        at += delimiter.len();
        if body.get(at..at + 2) == Some(b"--") {
            return Ok(parts);
        }
        // Past the delimiter line's CRLF, the part's headers end at an empty line.
        let start = find(body, at, b"\r\n").ok_or_else(|| bad("truncated"))? + 2;
        let headers_end =
            find(body, start, b"\r\n\r\n").ok_or_else(|| bad("part without headers"))?;
        let headers = std::str::from_utf8(&body[start..headers_end])
            .map_err(|_| bad("part headers are not UTF-8"))?;
        let mut crlf_delimiter = b"\r\n".to_vec();
        crlf_delimiter.extend_from_slice(&delimiter);
        let data_start = headers_end + 4;
        let end =
            find(body, data_start, &crlf_delimiter).ok_or_else(|| bad("unterminated part"))?;
        let disposition = headers
            .split("\r\n")
            .find(|l| {
                l.split_once(':')
                    .is_some_and(|(n, _)| n.trim().eq_ignore_ascii_case("content-disposition"))
            })
            .ok_or_else(|| bad("part without Content-Disposition"))?;
        let param = |key: &str| {
            disposition.split(';').find_map(|p| {
                let (k, v) = p.trim().split_once('=')?;
                (k.trim().eq_ignore_ascii_case(key)).then(|| v.trim().trim_matches('"').to_string())
            })
        };
        parts.push(Part {
            name: param("name").ok_or_else(|| bad("part without a name"))?,
            filename: param("filename"),
            data: body[data_start..end].to_vec(),
        });
        at = end + 2;
    }
}

/// The `boundary` parameter of a `multipart/form-data` content type.
fn boundary(content_type: Option<&str>) -> std::result::Result<String, ApiError> {
    let ct = content_type.unwrap_or("");
    let mut params = ct.split(';');
    if !params
        .next()
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("multipart/form-data"))
    {
        return Err(ApiError::bad(format!(
            "the body must be multipart/form-data with the audio as `file` (got {:?})",
            ct
        )));
    }
    params
        .find_map(|p| {
            let (k, v) = p.trim().split_once('=')?;
            k.eq_ignore_ascii_case("boundary")
                .then(|| v.trim_matches('"').to_string())
        })
        .filter(|b| !b.is_empty() && b.len() <= 70)
        .ok_or_else(|| ApiError::bad("multipart/form-data without a boundary"))
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Format {
    Json,
    Text,
    VerboseJson,
    Srt,
    Vtt,
}

/// A request, checked.
#[derive(Debug)]
struct TranscriptionRequest {
    audio: Vec<u8>,
    filename: String,
    format: Format,
    language: Option<String>,
    words: bool,
    prompt: Option<String>,
    vad_filter: bool,
    /// The temperatures a window is decoded at in turn: `temperature`, + 0.2, ... up to 1.
    temperatures: Vec<f32>,
}

/// openai-whisper's fallback from `first`: `first`, `first` + 0.2, ... while at most 1.
fn fallback_from(first: f32) -> Vec<f32> {
    (0..)
        .map(|i| first + 0.2 * i as f32)
        .take_while(|t| *t <= 1.0 + 1e-6)
        .collect()
}

fn parse_request(parts: Vec<Part>) -> std::result::Result<TranscriptionRequest, ApiError> {
    let text = |p: &Part| String::from_utf8_lossy(&p.data).trim().to_string();
    let mut audio = None;
    let mut format = Format::Json;
    let mut language = None;
    let mut words = false;
    let mut prompt = None;
    let mut vad_filter = false;
    let mut temperature = 0.0f32;
    for part in parts {
        match part.name.as_str() {
            "file" => {
                let filename = part.filename.clone().unwrap_or_else(|| "file".into());
                audio = Some((part.data, filename));
            }
            "response_format" => {
                format = match text(&part).as_str() {
                    "json" => Format::Json,
                    "text" => Format::Text,
                    "verbose_json" => Format::VerboseJson,
                    "srt" => Format::Srt,
                    "vtt" => Format::Vtt,
                    other => {
                        return Err(ApiError::bad(format!(
                    "response_format {other} is not supported (json, text, verbose_json, srt, vtt)"
                )))
                    }
                }
            }
            "language" => language = Some(text(&part)).filter(|l| !l.is_empty()),
            "timestamp_granularities[]" | "timestamp_granularities" => match text(&part).as_str() {
                "word" => words = true,
                "segment" => {}
                other => {
                    return Err(ApiError::bad(format!(
                        "timestamp_granularities {other} is not supported (segment, word)"
                    )))
                }
            },
            "temperature" => {
                temperature = text(&part)
                    .parse()
                    .ok()
                    .filter(|t: &f32| (0.0..=1.0).contains(t))
                    .ok_or_else(|| ApiError::bad("temperature must be a number from 0 to 1"))?;
            }
            "prompt" => prompt = Some(text(&part)).filter(|p| !p.is_empty()),
            "vad_filter" => {
                vad_filter = match text(&part).as_str() {
                    "true" | "1" => true,
                    "false" | "0" | "" => false,
                    other => {
                        return Err(ApiError::bad(format!(
                            "vad_filter {other}: expected true or false"
                        )))
                    }
                }
            }
            _ => {}
        }
    }
    let (audio, filename) = audio.ok_or_else(|| ApiError::bad("the audio `file` is missing"))?;
    if audio.is_empty() {
        return Err(ApiError::bad("the audio `file` is empty"));
    }
    if words && format != Format::VerboseJson {
        return Err(ApiError::bad(
            "timestamp_granularities word needs response_format verbose_json",
        ));
    }
    Ok(TranscriptionRequest {
        audio,
        filename,
        format,
        language,
        words,
        prompt,
        vad_filter,
        temperatures: fallback_from(temperature),
    })
}

/// `hh:mm:ss,mmm` (SRT) or `hh:mm:ss.mmm` (WebVTT).
fn subtitle_time(seconds: f64, separator: char) -> String {
    let ms = (seconds.max(0.0) * 1000.0).round() as u64;
    format!(
        "{:02}:{:02}:{:02}{separator}{:03}",
        ms / 3_600_000,
        ms / 60_000 % 60,
        ms / 1000 % 60,
        ms % 1000
    )
}

fn subtitles(segments: &[Segment], srt: bool) -> String {
    let mut out = String::new();
    if !srt {
        out.push_str("WEBVTT\n\n");
    }
    for (i, s) in segments.iter().enumerate() {
        let sep = if srt { ',' } else { '.' };
        if srt {
            out.push_str(&format!("{}\n", i + 1));
        }
        out.push_str(&format!(
            "{} --> {}\n{}\n\n",
            subtitle_time(s.start, sep),
            subtitle_time(s.end, sep),
            s.text.trim()
        ));
    }
    out
}

/// Uploads written to a scratch file for the audio readers, one name each.
static UPLOADS: AtomicU64 = AtomicU64::new(0);

impl Transcriber {
    fn answer(&self, r: &Request, conn: &mut TcpStream) -> std::result::Result<(), ApiError> {
        let boundary = boundary(r.content_type.as_deref())?;
        let req = parse_request(parse_multipart(&r.body, &boundary)?)?;
        let task = if r.path.ends_with("/translations") {
            self.tokens.translate
        } else {
            self.tokens.transcribe
        };
        let language = match &req.language {
            None => None,
            Some(code) => Some(self.tokens.language(code).ok_or_else(|| {
                ApiError::bad(format!("language {code} is not a language of this model"))
            })?),
        };
        // The audio readers take a path: the upload goes to a scratch file for the call.
        let scratch = std::env::temp_dir().join(format!(
            "synaptix-upload-{}-{}",
            std::process::id(),
            UPLOADS.fetch_add(1, Ordering::Relaxed)
        ));
        let internal = |m: String| ApiError {
            status: 500,
            message: m,
        };
        std::fs::write(&scratch, &req.audio)
            .map_err(|e| internal(format!("cannot store the upload: {e}")))?;
        let samples = synaptix_audio::load_whisper_audio(&scratch);
        let _ = std::fs::remove_file(&scratch);
        let samples = samples.map_err(|e| {
            ApiError::bad(
                e.to_string()
                    .replace(&scratch.display().to_string(), &req.filename),
            )
        })?;
        let vad = match (req.vad_filter, &self.vad) {
            (false, _) => None,
            (true, None) => {
                return Err(ApiError::bad(
                    "vad_filter: this server has no VAD model (scripts/fetch-models.sh silero-vad, then restart it)",
                ))
            }
            (true, Some(vad)) => {
                let probs = vad
                    .speech_probs(&samples)
                    .map_err(|e| internal(format!("VAD failed: {e}")))?;
                let chunks = speech_chunks(&probs, samples.len(), &VadOptions::default());
                Some((collect_chunks(&samples, &chunks), TimestampMap::new(&chunks)))
            }
        };
        let speech = vad.as_ref().map_or(&samples[..], |(s, _)| &s[..]);
        let mel = synaptix_audio::whisper_log_mel(speech, self.model.dims().n_mels)
            .map_err(|e| ApiError::bad(e.to_string()))?;
        let mut options = TranscribeOptions::new(task, language);
        options.word_timestamps = req.words;
        options.temperatures = req.temperatures.clone();
        if let Some(prompt) = &req.prompt {
            options.initial_prompt = self
                .tokenizer
                .encode(&format!(" {}", prompt.trim()), false, false)
                .map_err(|e| ApiError::bad(format!("prompt: {e}")))?;
        }
        let decode = |ids: &[u32]| {
            String::from_utf8_lossy(&self.tokenizer.detokenize(ids, true, false)).into_owned()
        };
        let mut result = transcribe(
            &self.model,
            &mel.values,
            mel.frames,
            &self.tokens,
            &options,
            &decode,
            &mut |_| {},
        )
        .map_err(|e| internal(format!("transcription failed: {e}")))?;
        if let Some((_, map)) = &vad {
            map.restore(&mut result.segments);
        }
        let text: String = result.segments.iter().map(|s| s.text.as_str()).collect();
        let text = text.trim().to_string();
        let (kind, body) = match req.format {
            Format::Json => ("application/json", json!({ "text": text }).to_string()),
            Format::Text => ("text/plain; charset=utf-8", format!("{text}\n")),
            Format::Srt => (
                "text/plain; charset=utf-8",
                subtitles(&result.segments, true),
            ),
            Format::Vtt => (
                "text/vtt; charset=utf-8",
                subtitles(&result.segments, false),
            ),
            Format::VerboseJson => {
                let language = result
                    .language
                    .as_ref()
                    .map(|(c, _)| c.clone())
                    .or(req.language.clone())
                    .unwrap_or_default();
                let segments: Vec<Value> = result
                    .segments
                    .iter()
                    .enumerate()
                    .map(|(id, s)| {
                        json!({
                            "id": id, "seek": s.seek, "start": s.start, "end": s.end,
                            "text": s.text, "tokens": s.tokens, "temperature": s.temperature,
                            "avg_logprob": s.avg_logprob,
                            "compression_ratio": s.compression_ratio,
                            "no_speech_prob": s.no_speech_prob,
                        })
                    })
                    .collect();
                let mut v = json!({
                    "task": if task == self.tokens.translate { "translate" } else { "transcribe" },
                    "language": language,
                    "duration": samples.len() as f64 / synaptix_audio::WHISPER_SAMPLE_RATE as f64,
                    "text": text,
                    "segments": segments,
                });
                if req.words {
                    v["words"] = result
                        .segments
                        .iter()
                        .flat_map(|s| &s.words)
                        .map(|w| json!({"word": w.word, "start": w.start, "end": w.end}))
                        .collect();
                }
                ("application/json", v.to_string())
            }
        };
        let _ = http::respond(conn, 200, kind, body.as_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(parts: &[(&str, Option<&str>, &[u8])]) -> Vec<u8> {
        let mut b = Vec::new();
        for (name, filename, data) in parts {
            b.extend_from_slice(b"--XyZ\r\n");
            let file = filename.map_or(String::new(), |f| format!("; filename=\"{f}\""));
            b.extend_from_slice(
                format!("Content-Disposition: form-data; name=\"{name}\"{file}\r\n\r\n").as_bytes(),
            );
            b.extend_from_slice(data);
            b.extend_from_slice(b"\r\n");
        }
        b.extend_from_slice(b"--XyZ--\r\n");
        b
    }

    #[test]
    fn multipart_bodies_are_parsed_and_checked() {
        let audio: &[u8] = b"RIFF\r\n--X\x00\xff binary";
        let b = body(&[
            ("file", Some("a.wav"), audio),
            ("response_format", None, b"verbose_json"),
            ("timestamp_granularities[]", None, b"word"),
        ]);
        let ct = "multipart/form-data; boundary=XyZ";
        let parts = parse_multipart(&b, &boundary(Some(ct)).ok().unwrap())
            .ok()
            .unwrap();
        assert_eq!(parts.len(), 3);
        assert_eq!(parts[0].data, audio);
        assert_eq!(parts[0].filename.as_deref(), Some("a.wav"));
        let req = parse_request(parts).ok().unwrap();
        assert!(req.words && req.format == Format::VerboseJson);
        assert_eq!(req.temperatures, [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]);
        let warm = body(&[("file", None, b"x"), ("temperature", None, b"0.5")]);
        let req = parse_request(parse_multipart(&warm, "XyZ").ok().unwrap())
            .ok()
            .unwrap();
        assert_eq!(req.temperatures, [0.5, 0.7, 0.9]);

        assert!(boundary(Some("application/json")).is_err());
        assert!(boundary(None).is_err());
        assert!(boundary(Some("multipart/form-data")).is_err());
        assert!(parse_multipart(&b[..b.len() - 12], "XyZ").is_err());
        assert!(parse_multipart(b"junk", "XyZ").is_err());
        for bad in [
            body(&[("response_format", None, b"json")]),
            body(&[("file", None, b"")]),
            body(&[("file", None, b"x"), ("response_format", None, b"mp3")]),
            body(&[("file", None, b"x"), ("temperature", None, b"1.5")]),
            body(&[("file", None, b"x"), ("temperature", None, b"warm")]),
            body(&[
                ("file", None, b"x"),
                ("timestamp_granularities[]", None, b"word"),
            ]),
        ] {
            let parts = parse_multipart(&bad, "XyZ").ok().unwrap();
            assert!(parse_request(parts).is_err());
        }
    }

    #[test]
    fn subtitle_times() {
        assert_eq!(subtitle_time(3723.4567, ','), "01:02:03,457");
        assert_eq!(subtitle_time(0.0, '.'), "00:00:00.000");
    }
}
