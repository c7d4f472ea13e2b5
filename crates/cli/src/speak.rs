//! `synaptix speak`: text to speech with a Piper voice (VITS, ONNX file + `.onnx.json`).

use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use synaptix_infer::speak::{speak, SpeakOptions, SpokenSentence};
use synaptix_models::vits::{Scales, VitsVoice};
use synaptix_tokenizer::PiperPhonemizer;

#[derive(Args)]
#[command(
    after_help = "Text is split into sentences and turned into phonemes by espeak-ng (the system \
    library libespeak-ng.so.1, loaded at run time: Debian/Ubuntu package libespeak-ng1), as \
    piper-tts does; each sentence is synthesized, scaled to full volume and written as 16-bit \
    mono PCM at the voice's rate. Phonemes can also be given directly: the whole text with \
    --phonemes, or inline as [[ phonemes ]]. The sampling noise is seeded: the same seed, text \
    and options give the same samples.\n\n\
    Examples:\n  \
    scripts/fetch-models.sh piper-en-us-joe-medium\n  \
    synaptix speak piper-en-us-joe-medium \"Hello there. How are you today?\" -o hello.wav\n  \
    echo \"Text from a pipe.\" | synaptix speak piper-en-us-joe-medium -o piped.wav\n  \
    synaptix speak voices/en_US-joe-medium.onnx --file story.txt --length-scale 1.2 -o story.wav\n  \
    synaptix speak piper-en-us-joe-medium \"Streaming.\" -o - | aplay -r 22050 -f S16_LE -t raw -\n  \
    synaptix speak piper-en-us-joe-medium \"həlˈoʊ wˈɜːld\" --phonemes -o ipa.wav --json"
)]
pub struct SpeakArgs {
    /// Piper voice: its .onnx file (with the .onnx.json beside it), a directory holding one, or
    /// the name of a fetched voice (piper-en-us-joe-medium)
    pub voice: PathBuf,
    /// Text to speak; without it (and without --file) the text is read from standard input
    pub text: Option<String>,
    /// Read the text from this file
    #[arg(short = 'f', long, conflicts_with = "text")]
    pub file: Option<PathBuf>,
    /// Output WAV file; `-` writes raw 16-bit little-endian PCM to standard output, a sentence at
    /// a time as each is synthesized (piper's --output-raw)
    #[arg(short = 'o', long, default_value = "speech.wav")]
    pub output: PathBuf,
    /// The text is phonemes (IPA, as espeak-ng writes them), spoken as one sentence
    #[arg(long)]
    pub phonemes: bool,
    /// Duration multiplier: above 1 speaks slower (default: the voice's, usually 1)
    #[arg(long)]
    pub length_scale: Option<f32>,
    /// Variation of the voice (default: the voice's, usually 0.667; 0 for none)
    #[arg(long)]
    pub noise_scale: Option<f32>,
    /// Variation of the rhythm (default: the voice's, usually 0.8; 0 for none)
    #[arg(long)]
    pub noise_w: Option<f32>,
    /// Seed of the sampling noise (default: random, printed)
    #[arg(long)]
    pub seed: Option<u64>,
    /// Seconds of silence after each sentence
    #[arg(long, default_value_t = 0.0)]
    pub sentence_silence: f32,
    /// Volume multiplier applied after normalisation (samples are clipped to full scale)
    #[arg(long, default_value_t = 1.0)]
    pub volume: f32,
    /// Keep the model's own level instead of scaling each sentence to full volume
    #[arg(long)]
    pub no_normalize: bool,
    /// Print one JSON object (sentences with phonemes, ids, frames per id, timings) on stdout
    #[arg(long)]
    pub json: bool,
    /// CPU threads (0: all cores)
    #[arg(short = 't', long, default_value_t = 0)]
    pub threads: usize,
    /// Where to run: auto or cpu (voices run on the CPU for now; cuda is an error)
    #[arg(long, default_value = "auto")]
    pub device: String,
}

fn check_scale(name: &str, v: f32, min: f32, max: f32) -> Result<f32> {
    if !v.is_finite() || v < min || v > max {
        bail!("--{name} {v}: expected a number from {min} to {max}");
    }
    Ok(v)
}

pub fn run(a: SpeakArgs) -> Result<()> {
    crate::device::require_cpu(&a.device, "speak runs")?;
    let sentence_silence = check_scale("sentence-silence", a.sentence_silence, 0.0, 60.0)?;
    let volume = check_scale("volume", a.volume, 0.0, 100.0)?;
    if a.json && a.output.as_os_str() == "-" {
        bail!("--json and -o - both write to standard output: choose one");
    }
    let text = match (&a.text, &a.file) {
        (Some(t), _) => t.clone(),
        (None, Some(path)) => std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?,
        (None, None) => {
            let mut t = String::new();
            std::io::stdin()
                .read_to_string(&mut t)
                .context("cannot read the text from standard input")?;
            t
        }
    };
    if text.trim().is_empty() {
        bail!("nothing to speak: the text is empty");
    }
    let threads = crate::threads::init(a.threads)?;
    let voice_path = synaptix_bundle::cache::resolve_model(&a.voice.to_string_lossy());
    if !voice_path.exists() {
        bail!(
            "{}: no such voice file or directory (fetch one with scripts/fetch-models.sh piper-en-us-joe-medium)",
            voice_path.display()
        );
    }
    let t0 = Instant::now();
    let voice = VitsVoice::load(&voice_path)?;
    let phonemizer = PiperPhonemizer::from_config_file(voice.config_path())?;
    let load_s = t0.elapsed().as_secs_f64();
    let defaults = voice.default_scales();
    let scales = Scales {
        noise_scale: check_scale(
            "noise-scale",
            a.noise_scale.unwrap_or(defaults.noise_scale),
            0.0,
            10.0,
        )?,
        length_scale: check_scale(
            "length-scale",
            a.length_scale.unwrap_or(defaults.length_scale),
            0.01,
            100.0,
        )?,
        noise_w: check_scale("noise-w", a.noise_w.unwrap_or(defaults.noise_w), 0.0, 10.0)?,
    };
    let seed = a.seed.unwrap_or_else(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        nanos ^ (std::process::id() as u64).rotate_left(32)
    });

    let t1 = Instant::now();
    let sentences: Vec<Vec<String>> = if a.phonemes {
        vec![PiperPhonemizer::raw_phonemes(text.trim())]
    } else {
        phonemizer.sentences(&text)?
    };
    let phonemize_s = t1.elapsed().as_secs_f64();
    let mut ids = Vec::with_capacity(sentences.len());
    for phonemes in &sentences {
        let mapped = phonemizer.ids(phonemes);
        if !mapped.missing.is_empty() {
            let mut missing = mapped.missing.clone();
            missing.dedup();
            eprintln!(
                "warning: the voice has no id for {} (left out, as piper does)",
                missing
                    .iter()
                    .map(|p| format!("{p:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        ids.push(mapped.ids);
    }
    if ids.is_empty() {
        bail!("nothing to speak: espeak-ng found no phonemes in the text");
    }

    let options = SpeakOptions {
        scales,
        seed,
        normalize: !a.no_normalize,
        volume,
        sentence_silence,
    };
    let raw_stdout = a.output.as_os_str() == "-";
    // Created before the work, so a bad path fails at once.
    let out_file = if raw_stdout {
        None
    } else {
        Some(
            std::fs::File::create(&a.output)
                .with_context(|| format!("cannot create {}", a.output.display()))?,
        )
    };
    let rate = voice.sample_rate();
    let mut pcm: Vec<i16> = Vec::new();
    let mut reports = Vec::new();
    let mut synth_s = 0.0;
    let stdout = std::io::stdout();
    let total = ids.len();
    speak(&voice, &ids, &options, |s: &SpokenSentence| {
        let i = reports.len();
        synth_s += s.seconds;
        let audio_s = s.synthesis.audio.len() as f64 / rate as f64;
        if !a.json {
            let phonemes: String = sentences[i].concat();
            eprintln!(
                "[{}/{total}] {audio_s:.2} s of audio in {:.2} s: {}",
                i + 1,
                s.seconds,
                phonemes.trim()
            );
        }
        if raw_stdout {
            let bytes: Vec<u8> = s.pcm.iter().flat_map(|v| v.to_le_bytes()).collect();
            let mut out = stdout.lock();
            out.write_all(&bytes)
                .and_then(|_| out.flush())
                .map_err(|e| {
                    synaptix_models::ModelError::BadInput(format!("standard output: {e}"))
                })?;
        } else {
            pcm.extend_from_slice(&s.pcm);
        }
        reports.push(serde_json::json!({
            "phonemes": sentences[i].concat(),
            "ids": ids[i],
            "frames_per_id": s.synthesis.durations,
            "audio_seconds": audio_s,
            "synthesis_seconds": s.seconds,
        }));
        Ok(())
    })?;
    if let Some(file) = out_file {
        synaptix_audio::write_wav_i16(file, &a.output.display().to_string(), &pcm, rate)?;
    }
    let audio_s: f64 = reports
        .iter()
        .map(|r| r["audio_seconds"].as_f64().unwrap_or(0.0))
        .sum();
    if a.json {
        let out = serde_json::json!({
            "voice": voice.onnx_path().display().to_string(),
            "output": a.output.display().to_string(),
            "sample_rate": rate,
            "samples": pcm.len(),
            "audio_seconds": audio_s,
            "scales": {"noise_scale": scales.noise_scale, "length_scale": scales.length_scale, "noise_w": scales.noise_w},
            "seed": seed,
            "sentences": reports,
            "threads": threads,
            "timings": {"load_s": load_s, "phonemize_s": phonemize_s, "synthesis_s": synth_s},
        });
        println!("{out}");
    } else {
        let target = if raw_stdout {
            "standard output (raw s16le)".to_string()
        } else {
            a.output.display().to_string()
        };
        eprintln!(
            "cpu | load {load_s:.2} s | {total} sentence(s), {audio_s:.2} s of audio at {rate} Hz in {synth_s:.2} s ({:.1}× real time) | wrote {target} | seed {seed}, {threads} threads",
            audio_s / synth_s.max(1e-9),
        );
    }
    Ok(())
}
