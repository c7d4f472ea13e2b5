//! `synaptix transcribe`: speech to text with a Whisper model (CTranslate2 directory).

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use synaptix_core::Device;
use synaptix_models::whisper::{Whisper, WhisperFiles, WhisperTokens, WINDOW_FRAMES};
use synaptix_tokenizer::Tokenizer;

#[derive(Args)]
#[command(after_help = "Examples:\n  \
    scripts/fetch-models.sh whisper-base\n  \
    synaptix transcribe whisper-base speech.wav\n  \
    synaptix transcribe whisper-base interview.wav --language de --translate\n  \
    synaptix transcribe ~/models/whisper-base speech.wav --json")]
pub struct TranscribeArgs {
    /// Whisper model directory in CTranslate2's layout (model.bin, config.json, tokenizer.json,
    /// as faster-whisper uses), or the name of a fetched model (whisper-base)
    pub model: PathBuf,
    /// Audio file: WAV (PCM 8/16/24/32-bit or float), any sample rate, mono or several channels
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
    /// Print one JSON object (language, text, token ids, timings) instead of streaming text
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: TranscribeArgs) -> Result<()> {
    match a.device.as_str() {
        "auto" | "cpu" => {}
        other => match other.parse::<Device>() {
            Ok(Device::Cuda(_)) => {
                bail!("--device {other}: transcribe runs on the CPU only for now")
            }
            Ok(_) => {}
            Err(e) => bail!("--device {other}: {e}"),
        },
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
    let mel = synaptix_audio::whisper_log_mel(&samples, model.dims().n_mels)?;
    let mel_s = t1.elapsed().as_secs_f64();
    let audio_s = samples.len() as f64 / synaptix_audio::WHISPER_SAMPLE_RATE as f64;
    // faster-whisper's content frames: the features but their last frame.
    let content = mel.frames.saturating_sub(1);

    let task = if a.translate {
        tokens.translate
    } else {
        tokens.transcribe
    };
    let mut language: Option<(String, f32)> = None;
    let mut all_tokens = Vec::new();
    let mut text = String::new();
    let (mut encode_s, mut decode_s, mut windows) = (0f64, 0f64, 0usize);
    let stdout = std::io::stdout();
    let mut seek = 0;
    while seek < content || (seek == 0 && content == 0) {
        let len = WINDOW_FRAMES.min(content - seek);
        // The window [seek, seek + len) of every mel row, zero-padded to WINDOW_FRAMES.
        let mut window = vec![0f32; mel.n_mels * WINDOW_FRAMES];
        for (c, row) in window.chunks_exact_mut(WINDOW_FRAMES).enumerate() {
            let src = &mel.values[c * mel.frames + seek..c * mel.frames + seek + len];
            row[..len].copy_from_slice(src);
        }
        let te = Instant::now();
        let encoded = model.encode(&window)?;
        encode_s += te.elapsed().as_secs_f64();
        let td = Instant::now();
        let lang_token = match (language_token, &language) {
            (Some(t), _) => t,
            (None, Some((code, _))) => tokens.language(code).unwrap_or(tokens.languages[0].0),
            (None, None) => {
                let (code, p) = model.detect_language(&encoded, &tokens)?;
                if !a.json {
                    eprintln!("language: {code} (probability {p:.2})");
                }
                let t = tokens.language(&code).unwrap_or(tokens.languages[0].0);
                language = Some((code, p));
                t
            }
        };
        let prompt = [tokens.sot, lang_token, task, tokens.no_timestamps];
        let mut stream = tokenizer.stream_decoder();
        let mut lock = stdout.lock();
        let json = a.json;
        let mut on_token = |id: u32| {
            if !json {
                let _ = write!(lock, "{}", stream.push(id));
                let _ = lock.flush();
            }
        };
        let (ids, _) = model.generate(&encoded, &prompt, &tokens, &mut on_token)?;
        if !json {
            let _ = writeln!(lock, "{}", stream.finish());
        }
        decode_s += td.elapsed().as_secs_f64();
        text.push_str(&String::from_utf8_lossy(
            &tokenizer.detokenize(&ids, true, false),
        ));
        all_tokens.extend(ids);
        windows += 1;
        seek += WINDOW_FRAMES.max(1);
        if content == 0 {
            break;
        }
    }
    let language = language
        .map(|(c, p)| (c, Some(p)))
        .unwrap_or_else(|| (a.language.clone(), None));
    if a.json {
        let out = serde_json::json!({
            "model": model_arg.display().to_string(),
            "audio": a.audio.display().to_string(),
            "audio_seconds": audio_s,
            "language": language.0,
            "language_probability": language.1,
            "task": if a.translate { "translate" } else { "transcribe" },
            "text": text.trim(),
            "tokens": all_tokens,
            "windows": windows,
            "threads": threads,
            "timings": {"load_s": load_s, "mel_s": mel_s, "encode_s": encode_s, "decode_s": decode_s},
        });
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
