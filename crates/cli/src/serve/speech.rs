//! `POST /v1/audio/speech` for a Piper voice (what `synaptix speak` loads), in the shape of
//! OpenAI's speech API.
//!
//! Request fields: `input` (the text, at most 4096 characters, as OpenAI allows), `voice` and
//! `model` (ignored: the server has one voice), `response_format` (`wav`, the default here, or
//! `pcm`: raw 16-bit little-endian samples at the voice's rate; OpenAI's compressed formats are
//! refused with a 400), `speed` (0.25 to 4, default 1: divides the voice's length scale).
//! synaptix's own fields: `noise_scale`, `noise_w`, `length_scale` (instead of `speed`),
//! `seed` (default 0, so the same request gives the same audio), `sentence_silence`.
//!
//! The audio is what `synaptix speak` writes for the same text and options.

use std::net::TcpStream;
use std::path::Path;

use anyhow::{bail, Result};
use serde_json::Value;
use synaptix_infer::speak::{speak, SpeakOptions};
use synaptix_models::vits::{Scales, VitsVoice};
use synaptix_tokenizer::PiperPhonemizer;

use super::{bind, parse_json, serve_forever, served_name, ApiError, Info, ServeArgs, Task};
use crate::http::{self, Request};

/// Characters one request may give (OpenAI's limit).
const MAX_INPUT_CHARS: usize = 4096;

/// Whether `path` is a Piper voice: an `.onnx` file, or a directory holding one.
pub(super) fn is_voice(path: &Path) -> bool {
    let is_onnx = |p: &Path| p.extension().is_some_and(|e| e == "onnx");
    if path.is_dir() {
        std::fs::read_dir(path)
            .is_ok_and(|entries| entries.filter_map(|e| e.ok()).any(|e| is_onnx(&e.path())))
    } else {
        is_onnx(path)
    }
}

pub(super) fn run(a: ServeArgs) -> Result<()> {
    crate::device::require_cpu(&a.device, "voices run")?;
    if a.chat_template.is_some() {
        bail!("--chat-template: {} is a voice", a.model.display());
    }
    crate::threads::init(a.threads)?;
    let voice = VitsVoice::load(&a.model)?;
    let phonemizer = PiperPhonemizer::from_config_file(voice.config_path())?;
    let name = served_name(&a);
    let listener = bind(&a)?;
    eprintln!(
        "synaptix serve: {name} (speech, {} Hz) on cpu, listening on http://{}",
        voice.sample_rate(),
        listener.local_addr()?
    );
    let info = Info {
        name,
        task: Task::Speech,
        n_ctx: MAX_INPUT_CHARS,
        api_key: a.api_key.clone(),
    };
    let server = Speaker { voice, phonemizer };
    serve_forever(listener, info, |request, conn| server.answer(request, conn));
    Ok(())
}

struct Speaker {
    voice: VitsVoice,
    phonemizer: PiperPhonemizer,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Format {
    Wav,
    Pcm,
}

/// A request, checked.
#[derive(Debug)]
struct SpeechRequest {
    input: String,
    format: Format,
    options: SpeakOptions,
}

/// An optional number field within `[min, max]`.
fn number(body: &Value, key: &str, min: f64, max: f64) -> Result<Option<f64>, ApiError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_f64() {
            Some(x) if (min..=max).contains(&x) => Ok(Some(x)),
            _ => Err(ApiError::bad(format!(
                "{key} must be a number from {min} to {max}"
            ))),
        },
    }
}

fn parse_request(body: &Value, defaults: Scales) -> Result<SpeechRequest, ApiError> {
    if !body.is_object() {
        return Err(ApiError::bad("the request body must be a JSON object"));
    }
    let input = match body.get("input") {
        Some(Value::String(s)) if !s.trim().is_empty() => s.clone(),
        Some(Value::String(_)) => return Err(ApiError::bad("input is empty")),
        _ => return Err(ApiError::bad("input (a string) is required")),
    };
    if input.chars().count() > MAX_INPUT_CHARS {
        return Err(ApiError::bad(format!(
            "input is longer than {MAX_INPUT_CHARS} characters"
        )));
    }
    let format = match body.get("response_format").and_then(Value::as_str) {
        None | Some("wav") => Format::Wav,
        Some("pcm") => Format::Pcm,
        Some(other) => {
            return Err(ApiError::bad(format!(
                "response_format {other} is not supported (wav or pcm)"
            )))
        }
    };
    let speed = number(body, "speed", 0.25, 4.0)?;
    let length_scale = number(body, "length_scale", 0.01, 100.0)?;
    if speed.is_some() && length_scale.is_some() {
        return Err(ApiError::bad("give speed or length_scale, not both"));
    }
    let length_scale = match (speed, length_scale) {
        (Some(s), _) => defaults.length_scale / s as f32,
        (_, Some(l)) => l as f32,
        _ => defaults.length_scale,
    };
    let scales = Scales {
        noise_scale: number(body, "noise_scale", 0.0, 10.0)?
            .map_or(defaults.noise_scale, |v| v as f32),
        length_scale,
        noise_w: number(body, "noise_w", 0.0, 10.0)?.map_or(defaults.noise_w, |v| v as f32),
    };
    let seed = match body.get("seed") {
        None | Some(Value::Null) => 0,
        Some(v) => v
            .as_u64()
            .ok_or_else(|| ApiError::bad("seed must be a non-negative integer"))?,
    };
    let sentence_silence = number(body, "sentence_silence", 0.0, 60.0)?.unwrap_or(0.0) as f32;
    Ok(SpeechRequest {
        input,
        format,
        options: SpeakOptions {
            scales,
            seed,
            normalize: true,
            volume: 1.0,
            sentence_silence,
        },
    })
}

impl Speaker {
    fn answer(&self, r: &Request, conn: &mut TcpStream) -> std::result::Result<(), ApiError> {
        let body: Value = parse_json(&r.body)?;
        let req = parse_request(&body, self.voice.default_scales())?;
        let sentences = self
            .phonemizer
            .sentences(&req.input)
            .map_err(|e| ApiError::bad(format!("input: {e}")))?;
        let ids: Vec<Vec<i64>> = sentences
            .iter()
            .map(|p| self.phonemizer.ids(p).ids)
            .collect();
        if ids.is_empty() {
            return Err(ApiError::bad("input: espeak-ng found no phonemes in it"));
        }
        let mut pcm: Vec<i16> = Vec::new();
        speak(&self.voice, &ids, &req.options, |s| {
            pcm.extend_from_slice(&s.pcm);
            Ok(())
        })
        .map_err(|e| ApiError {
            status: 500,
            message: format!("synthesis failed: {e}"),
        })?;
        let rate = self.voice.sample_rate();
        let (content_type, bytes) = match req.format {
            Format::Pcm => (
                "audio/pcm",
                pcm.iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect::<Vec<u8>>(),
            ),
            Format::Wav => {
                let mut out = std::io::Cursor::new(Vec::new());
                synaptix_audio::write_wav_i16(&mut out, "response", &pcm, rate).map_err(|e| {
                    ApiError {
                        status: 500,
                        message: e.to_string(),
                    }
                })?;
                ("audio/wav", out.into_inner())
            }
        };
        let _ = http::respond(conn, 200, content_type, &bytes);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const DEFAULTS: Scales = Scales {
        noise_scale: 0.667,
        length_scale: 1.0,
        noise_w: 0.8,
    };

    #[test]
    fn requests_are_checked() {
        let Ok(ok) = parse_request(&json!({"input": "Hi.", "voice": "alloy"}), DEFAULTS) else {
            panic!("a plain request is refused")
        };
        assert_eq!(ok.format, Format::Wav);
        assert_eq!(ok.options.seed, 0);
        assert_eq!(ok.options.scales, DEFAULTS);
        let Ok(fast) = parse_request(
            &json!({"input": "Hi.", "speed": 2.0, "response_format": "pcm", "seed": 5}),
            DEFAULTS,
        ) else {
            panic!("speed, pcm and seed are refused")
        };
        assert_eq!(fast.format, Format::Pcm);
        assert_eq!(fast.options.scales.length_scale, 0.5);
        assert_eq!(fast.options.seed, 5);
        for bad in [
            json!({}),
            json!({"input": "  "}),
            json!({"input": 3}),
            json!({"input": "Hi.", "response_format": "mp3"}),
            json!({"input": "Hi.", "speed": 9}),
            json!({"input": "Hi.", "speed": 1, "length_scale": 1}),
            json!({"input": "Hi.", "noise_w": -1}),
            json!({"input": "Hi.", "seed": -2}),
            json!({"input": "x".repeat(MAX_INPUT_CHARS + 1)}),
            json!(["Hi."]),
        ] {
            assert!(parse_request(&bad, DEFAULTS).is_err(), "{bad}");
        }
    }
}
