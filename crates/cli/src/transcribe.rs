//! `synaptix transcribe`: speech to text with a Whisper model (CTranslate2 directory).

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use synaptix_infer::transcribe::{transcribe, TranscribeEvent, TranscribeOptions};
use synaptix_infer::vad::{collect_chunks, speech_chunks, TimestampMap, VadOptions};
use synaptix_models::silero_vad::SileroVad;
use synaptix_models::whisper::{Whisper, WhisperFiles, WhisperTokens};
use synaptix_tokenizer::Tokenizer;

#[derive(Args)]
#[command(
    after_help = "Prints one line per segment, `[mm:ss.mmm --> mm:ss.mmm]  text`, as the \
    windows are decoded. Decoding follows faster-whisper's transcribe defaults at temperature 0: \
    beam search of 5, timestamp tokens splitting each 30-second window into segments, the next \
    window starting at the last complete segment's end, windows likely silent (no-speech \
    probability above 0.6 and average log-probability at most -1) skipped, and the text so far \
    (up to 223 tokens) fed back as the prompt of the next window. By default at temperature 0 \
    only; --temperature 0,0.2,0.4,0.6,0.8,1 (faster-whisper's default) decodes a window again, \
    sampling at each higher temperature, while its text compresses too well (a repetition \
    loop) or its log-probability is too low. --word-timestamps times every word as faster-whisper's \
    word_timestamps=True does, --vad-filter transcribes only the speech Silero VAD finds (its \
    vad_filter=True).\n\n\
    Examples:\n  \
    scripts/fetch-models.sh whisper-base\n  \
    synaptix transcribe whisper-base speech.wav\n  \
    synaptix transcribe whisper-base interview.wav --language de --translate\n  \
    synaptix transcribe ~/models/whisper-base speech.wav --json\n  \
    synaptix transcribe whisper-base speech.wav --beam-size 1 --no-condition-on-previous-text\n  \
    synaptix transcribe whisper-base speech.wav --no-timestamps\n  \
    synaptix transcribe whisper-base noisy.wav --temperature 0,0.2,0.4,0.6,0.8,1 --seed 7\n  \
    synaptix transcribe whisper-base speech.wav --word-timestamps --json\n  \
    synaptix transcribe whisper-base talk.wav --initial-prompt \"Glossary: Kubernetes, Rust.\"\n  \
    scripts/fetch-models.sh silero-vad && synaptix transcribe whisper-base meeting.wav --vad-filter"
)]
pub struct TranscribeArgs {
    /// Whisper model directory in CTranslate2's layout (model.bin, config.json, tokenizer.json,
    /// as faster-whisper uses), or the name of a fetched model (whisper-base)
    pub model: PathBuf,
    /// Audio file: WAV (PCM 8/16/24/32-bit or float), FLAC, MP3 or Ogg Vorbis (found from the
    /// content), any sample rate, mono or several channels
    pub audio: PathBuf,
    /// Language of the speech as a code (en, de, fr, ...); auto detects it from the first 30 s
    #[arg(short = 'l', long, default_value = "auto")]
    pub language: String,
    /// Translate the speech into English instead of transcribing it
    #[arg(long)]
    pub translate: bool,
    /// CPU threads (0: all cores)
    #[arg(short = 't', long, default_value_t = 0)]
    pub threads: usize,
    /// Where to run: auto or cpu (Whisper runs on the CPU for now; cuda is an error)
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Print one JSON object (language, text, token ids, segments with start and end seconds,
    /// timings) instead of streaming segments
    #[arg(long)]
    pub json: bool,
    /// Decode without timestamp tokens: consecutive 30-second windows cut blindly, the text
    /// streamed token by token (a line per window; with a beam, when the window is decoded), no
    /// segments in the JSON
    #[arg(long)]
    pub no_timestamps: bool,
    /// Hypotheses kept at each decoding step (beam search as CTranslate2's, patience 1, length
    /// penalty 1); 1 decodes greedily (faster, the text streams as it is decoded)
    #[arg(short = 'b', long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    pub beam_size: u64,
    /// Decode each window on its own, without the text before it as prompt (faster-whisper's
    /// condition_on_previous_text=False): less consistent style, but a misrecognition cannot
    /// carry over into the next window
    #[arg(long)]
    pub no_condition_on_previous_text: bool,
    /// Time every word (faster-whisper's word_timestamps=True): from the cross-attention of the
    /// model's alignment heads; each segment line is followed by one line per word, and the JSON
    /// segments get their words. Segment times and the seeking between windows then follow the
    /// words
    #[arg(long, conflicts_with = "no_timestamps")]
    pub word_timestamps: bool,
    /// Text that comes before the speech (faster-whisper's initial_prompt): names, spellings or
    /// a style the first window should follow; fed to the model as if transcribed before it
    #[arg(long, value_name = "TEXT")]
    pub initial_prompt: Option<String>,
    /// Transcribe only the speech that Silero VAD finds (faster-whisper's vad_filter=True with
    /// its default options): long silences are cut out before decoding and the times mapped
    /// back onto the original audio
    #[arg(long)]
    pub vad_filter: bool,
    /// The Silero VAD v6 ONNX file for --vad-filter (default: the fetched silero-vad)
    #[arg(long, value_name = "FILE", default_value = "silero-vad")]
    pub vad_model: PathBuf,
    /// Temperatures to decode a window at, in turn, until its result passes the compression
    /// and log-probability thresholds (faster-whisper's fallback): 0 is the beam search, higher
    /// ones sample --best-of hypotheses. Comma-separated; faster-whisper's default is
    /// 0,0.2,0.4,0.6,0.8,1
    #[arg(long, value_name = "T,...", default_value = "0", value_delimiter = ',')]
    pub temperature: Vec<f32>,
    /// Hypotheses sampled at each temperature above 0 (the best is kept)
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    pub best_of: u64,
    /// With fallback: a result whose text's zlib compression ratio exceeds this is decoded
    /// again at the next temperature
    #[arg(long, value_name = "RATIO", default_value_t = 2.4)]
    pub compression_ratio_threshold: f64,
    /// Seed of the sampling at temperatures above 0 (the same seed gives the same text)
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

pub fn run(a: TranscribeArgs) -> Result<()> {
    crate::device::require_cpu(&a.device, "transcribe runs")?;
    if let Some(t) = a
        .temperature
        .iter()
        .find(|t| !t.is_finite() || **t < 0.0 || **t > 2.0)
    {
        bail!("--temperature {t}: each temperature must be between 0 and 2");
    }
    let model_arg = synaptix_bundle::cache::resolve_model(&a.model.to_string_lossy());
    let threads = crate::threads::init(a.threads)?;
    let t0 = Instant::now();
    let files = WhisperFiles::in_dir(&model_arg)?;
    let tokenizer = Tokenizer::from_tokenizer_json(&files.tokenizer)
        .with_context(|| format!("{}", files.tokenizer.display()))?;
    let tokens = WhisperTokens::from_config(&files.config, &|t| tokenizer.token_id(t), &|id| {
        tokenizer
            .piece(id)
            .map(|p| String::from_utf8_lossy(p).into_owned())
    })?;
    let language_token = match a.language.as_str() {
        "auto" => None,
        code => Some(tokens.language(code).with_context(|| {
            let known: Vec<&str> = tokens.languages.iter().map(|(_, c)| c.as_str()).collect();
            format!(
                "--language {code}: not a language of this model (known: {})",
                known.join(", ")
            )
        })?),
    };
    let model = Whisper::load(&files.model)?;
    let load_s = t0.elapsed().as_secs_f64();

    let t1 = Instant::now();
    let samples = synaptix_audio::load_whisper_audio(&a.audio)?;
    let vad = if a.vad_filter {
        let path = synaptix_bundle::cache::resolve_model(&a.vad_model.to_string_lossy());
        if !path.exists() {
            bail!(
                "--vad-filter: {} not found (fetch it with scripts/fetch-models.sh silero-vad, or name the file with --vad-model)",
                path.display()
            );
        }
        let vad = SileroVad::load(&path)?;
        let probs = vad.speech_probs(&samples)?;
        let chunks = speech_chunks(&probs, samples.len(), &VadOptions::default());
        Some((collect_chunks(&samples, &chunks), chunks))
    } else {
        None
    };
    let speech = vad.as_ref().map_or(&samples[..], |(s, _)| &s[..]);
    let map = vad.as_ref().map(|(_, chunks)| TimestampMap::new(chunks));
    let mel = synaptix_audio::whisper_log_mel(speech, model.dims().n_mels)?;
    let mel_s = t1.elapsed().as_secs_f64();
    let audio_s = samples.len() as f64 / synaptix_audio::WHISPER_SAMPLE_RATE as f64;

    let task = if a.translate {
        tokens.translate
    } else {
        tokens.transcribe
    };
    let mut options = TranscribeOptions::new(task, language_token);
    options.timestamps = !a.no_timestamps;
    options.beam_size = a.beam_size as usize;
    options.condition_on_previous_text = !a.no_condition_on_previous_text;
    options.word_timestamps = a.word_timestamps;
    options.temperatures = a.temperature.clone();
    options.best_of = a.best_of as usize;
    options.compression_ratio_threshold = Some(a.compression_ratio_threshold);
    options.seed = a.seed;
    if let Some(prompt) = &a.initial_prompt {
        options.initial_prompt = tokenizer
            .encode(&format!(" {}", prompt.trim()), false, false)
            .context("--initial-prompt")?;
    }
    let decode =
        |ids: &[u32]| String::from_utf8_lossy(&tokenizer.detokenize(ids, true, false)).into_owned();
    let json = a.json;
    let timestamps = options.timestamps;
    let stdout = std::io::stdout();
    let mut stream = tokenizer.stream_decoder();
    let mut on_event = |event: TranscribeEvent| {
        let mut out = stdout.lock();
        match event {
            TranscribeEvent::Language { code, probability } if !json => {
                eprintln!("language: {code} (probability {probability:.2})");
            }
            // Without timestamps the text streams token by token, a line per window.
            TranscribeEvent::Token(id) if !json && !timestamps => {
                let _ = write!(out, "{}", stream.push(id));
                let _ = out.flush();
            }
            TranscribeEvent::Segment(_) if !json && !timestamps => {
                let _ = writeln!(out, "{}", stream.finish());
            }
            TranscribeEvent::Segment(s) if !json => {
                // With VAD, in the original audio's time.
                let mut restored = s.clone();
                if let Some(map) = &map {
                    map.restore(std::slice::from_mut(&mut restored));
                }
                let s = &restored;
                let _ = writeln!(
                    out,
                    "[{} --> {}]  {}",
                    clock(s.start),
                    clock(s.end),
                    s.text.trim()
                );
                for w in &s.words {
                    let _ = writeln!(
                        out,
                        "  [{} --> {}] {} ({:.2})",
                        clock(w.start),
                        clock(w.end),
                        w.word.trim(),
                        w.probability
                    );
                }
                let _ = out.flush();
            }
            _ => {}
        }
    };
    let mut result = transcribe(
        &model,
        &mel.values,
        mel.frames,
        &tokens,
        &options,
        &decode,
        &mut on_event,
    )?;
    if let Some(map) = &map {
        map.restore(&mut result.segments);
    }
    let text: String = result.segments.iter().map(|s| s.text.as_str()).collect();
    let all_tokens: Vec<u32> = result
        .segments
        .iter()
        .flat_map(|s| s.tokens.iter().copied())
        .collect();
    let language = result
        .language
        .clone()
        .map(|(c, p)| (c, Some(p)))
        .unwrap_or_else(|| (a.language.clone(), None));
    let (encode_s, decode_s, windows) = (result.encode_s, result.decode_s, result.windows);
    if a.json {
        let mut out = serde_json::json!({
            "model": model_arg.display().to_string(),
            "audio": a.audio.display().to_string(),
            "audio_seconds": audio_s,
            "language": language.0,
            "language_probability": language.1,
            "task": if a.translate { "translate" } else { "transcribe" },
            "beam_size": options.beam_size,
            "condition_on_previous_text": options.condition_on_previous_text,
            "text": text.trim(),
            "tokens": all_tokens,
            "windows": windows,
            "threads": threads,
            "timings": {"load_s": load_s, "mel_s": mel_s, "encode_s": encode_s, "decode_s": decode_s},
        });
        if let Some((_, chunks)) = &vad {
            // Speech kept by the VAD, in 16 kHz samples of the original audio.
            out["vad_chunks"] = chunks
                .iter()
                .map(|c| serde_json::json!([c.start, c.end]))
                .collect();
        }
        if timestamps {
            out["segments"] = result
                .segments
                .iter()
                .map(|s| {
                    let mut seg = serde_json::json!({
                        "start": s.start,
                        "end": s.end,
                        "text": s.text,
                        "tokens": s.tokens,
                        "avg_logprob": s.avg_logprob,
                        "no_speech_prob": s.no_speech_prob,
                        "temperature": s.temperature,
                        "compression_ratio": s.compression_ratio,
                    });
                    if a.word_timestamps {
                        seg["words"] = s
                            .words
                            .iter()
                            .map(|w| {
                                serde_json::json!({
                                    "word": w.word,
                                    "start": w.start,
                                    "end": w.end,
                                    "probability": w.probability,
                                })
                            })
                            .collect();
                    }
                    seg
                })
                .collect();
        }
        println!("{out}");
    } else {
        let total = mel_s + encode_s + decode_s;
        eprintln!(
            "cpu | load {load_s:.2} s | audio {audio_s:.1} s in {windows} window(s) | mel {mel_s:.2} s, encoder {encode_s:.2} s, decoder {} tokens in {decode_s:.2} s | {:.2}× real time | {threads} threads",
            all_tokens.len(),
            audio_s / total.max(1e-9),
        );
    }
    Ok(())
}

/// Seconds as `mm:ss.mmm`, or `h:mm:ss.mmm` from an hour on.
fn clock(seconds: f64) -> String {
    let ms = (seconds.max(0.0) * 1000.0).round() as u64;
    let (h, m, s, ms) = (ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000);
    if h > 0 {
        format!("{h}:{m:02}:{s:02}.{ms:03}")
    } else {
        format!("{m:02}:{s:02}.{ms:03}")
    }
}
