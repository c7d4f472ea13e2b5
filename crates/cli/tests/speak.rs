//! `synaptix speak` end to end on the Piper voice en_US-joe-medium (`scripts/fetch-models.sh`
//! fetches it; espeak-ng comes from `scripts/espeak.sh`):
//! - with the noise off, text to WAV equals piper-tts 1.8.0's `synthesize_wav` within one 16-bit
//!   step (`tests/fixtures/piper/question_piper.wav`, from `make_piper_goldens.py`), and the
//!   JSON report's ids and frames equal the onnxruntime goldens';
//! - what it says is understood: Whisper (base) transcribes the words of the text;
//! - a seed reproduces the samples, raw output to stdout carries the WAV's samples;
//! - bad input is one `error:` line and a failure exit.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use synaptix_bundle::cache;

mod common;
use common::{fails, synaptix, Scratch};

fn voice() -> String {
    let path = cache::models_dir().join("piper-en-us-joe-medium");
    assert!(
        path.exists(),
        "{} is missing: run scripts/fetch-models.sh",
        path.display()
    );
    path.display().to_string()
}

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/piper")
}

fn ok(args: &[&str]) -> Output {
    let out = synaptix(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// 16-bit mono samples and the rate of a WAV file.
fn read_wav(path: &Path) -> (u32, Vec<i16>) {
    let mut r = hound::WavReader::open(path).expect("a WAV file");
    let spec = r.spec();
    assert_eq!((spec.channels, spec.bits_per_sample), (1, 16));
    let samples = r.samples::<i16>().map(|s| s.unwrap()).collect();
    (spec.sample_rate, samples)
}

fn golden_case(name: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(fixtures().join("vits_goldens.json")).unwrap();
    let g: serde_json::Value = serde_json::from_str(&text).unwrap();
    g["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .cloned()
        .unwrap()
}

fn max_step_difference(a: &[i16], b: &[i16]) -> i32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (x as i32 - y as i32).abs())
        .max()
        .unwrap_or(0)
}

#[test]
fn speak_matches_piper_end_to_end() {
    let voice = voice();
    let s = Scratch::new("piper");
    let case = golden_case("question");
    let (rate, want) = read_wav(&fixtures().join("question_piper.wav"));
    let quiet = [
        "--noise-scale",
        "0",
        "--noise-w",
        "0",
        "--length-scale",
        "1.3",
    ];

    let wav = s.path("q.wav");
    let mut args = vec!["speak", &voice, "How are you today?", "-o", &wav, "--json"];
    args.extend(quiet);
    let out = ok(&args);
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert_eq!(j["sample_rate"], 22050);
    assert_eq!(j["sentences"].as_array().unwrap().len(), 1);
    assert_eq!(j["sentences"][0]["ids"], case["ids"]);
    assert_eq!(j["sentences"][0]["frames_per_id"], case["durations"]);
    assert_eq!(j["sentences"][0]["phonemes"], case["phonemes"]);
    let (got_rate, got) = read_wav(Path::new(&wav));
    assert_eq!(got_rate, rate);
    assert!(max_step_difference(&got, &want) <= 1);

    // The same phonemes given directly give the same audio.
    let wav2 = s.path("q2.wav");
    let phonemes = case["phonemes"].as_str().unwrap();
    let mut args = vec!["speak", &voice, phonemes, "--phonemes", "-o", &wav2];
    args.extend(quiet);
    ok(&args);
    assert_eq!(read_wav(Path::new(&wav2)).1, got);
}

#[test]
fn whisper_understands_what_it_says() {
    let voice = voice();
    let whisper = cache::models_dir().join("whisper-base");
    assert!(
        whisper.exists(),
        "whisper-base is missing: run scripts/fetch-models.sh"
    );
    let s = Scratch::new("roundtrip");
    let wav = s.path("said.wav");
    let text = "The weather is lovely today. Please open the window.";
    let out = ok(&["speak", &voice, text, "-o", &wav, "--seed", "7"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("[1/2]") && stderr.contains("[2/2]"),
        "{stderr}"
    );
    let out = ok(&[
        "transcribe",
        &whisper.display().to_string(),
        &wav,
        "--json",
        "--language",
        "en",
    ]);
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let words = |t: &str| -> Vec<String> {
        t.split_whitespace()
            .map(|w| {
                w.chars()
                    .filter(|c| c.is_alphanumeric())
                    .collect::<String>()
                    .to_lowercase()
            })
            .filter(|w| !w.is_empty())
            .collect()
    };
    assert_eq!(words(j["text"].as_str().unwrap()), words(text), "{j}");
}

#[test]
fn seeds_reproduce_and_raw_output_streams_the_samples() {
    let voice = voice();
    let s = Scratch::new("seed");
    let (a, b, c) = (s.path("a.wav"), s.path("b.wav"), s.path("c.wav"));
    let text = "Seeds make speech reproducible.";
    ok(&["speak", &voice, text, "-o", &a, "--seed", "3"]);
    ok(&["speak", &voice, text, "-o", &b, "--seed", "3"]);
    ok(&["speak", &voice, text, "-o", &c, "--seed", "4"]);
    let (wa, wb, wc) = (
        read_wav(Path::new(&a)).1,
        read_wav(Path::new(&b)).1,
        read_wav(Path::new(&c)).1,
    );
    assert_eq!(wa, wb);
    assert_ne!(wa, wc);

    let raw = ok(&["speak", &voice, text, "-o", "-", "--seed", "3"]).stdout;
    let samples: Vec<i16> = raw
        .chunks_exact(2)
        .map(|b| i16::from_le_bytes([b[0], b[1]]))
        .collect();
    assert_eq!(samples, wa);

    // Silence after each sentence, and text from standard input.
    let mut child = Command::new(env!("CARGO_BIN_EXE_synaptix"))
        .args([
            "speak",
            &voice,
            "-o",
            "-",
            "--seed",
            "3",
            "--sentence-silence",
            "0.5",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(out.stdout.len(), raw.len() + 2 * 11025);
    assert_eq!(&out.stdout[..raw.len()], &raw[..]);
    assert!(out.stdout[raw.len()..].iter().all(|&b| b == 0));
}

#[test]
fn speak_bad_input() {
    let voice = voice();
    let s = Scratch::new("bad");
    let out = s.path("x.wav");
    fails(
        &["speak", &s.path("nowhere"), "hi", "-o", &out],
        "no such voice",
    );
    fails(
        &["speak", &s.0.display().to_string(), "hi", "-o", &out],
        "no .onnx",
    );
    fails(&["speak", &voice, "   ", "-o", &out], "empty");
    fails(&["speak", &voice, "hi", "--device", "cuda"], "CPU only");
    fails(
        &["speak", &voice, "hi", "--length-scale", "0"],
        "--length-scale",
    );
    fails(&["speak", &voice, "hi", "--noise-w", "nan"], "--noise-w");
    fails(&["speak", &voice, "hi", "--volume=-1"], "--volume");
    fails(&["speak", &voice, "hi", "-o", "-", "--json"], "choose one");
    fails(
        &["speak", &voice, "hi", "-o", &s.path("no/such/dir/x.wav")],
        "cannot create",
    );

    // A truncated voice file next to a valid config.
    let onnx = std::fs::read_dir(&voice)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "onnx"))
        .unwrap();
    let bytes = std::fs::read(&onnx).unwrap();
    let cut = s.0.join("cut.onnx");
    std::fs::write(&cut, &bytes[..bytes.len() / 3]).unwrap();
    std::fs::copy(
        format!("{}.json", onnx.display()),
        s.0.join("cut.onnx.json"),
    )
    .unwrap();
    fails(
        &["speak", &cut.display().to_string(), "hi", "-o", &out],
        "cut.onnx",
    );
    // A voice without its config.
    let lone = s.0.join("lone.onnx");
    std::fs::write(&lone, &bytes[..100]).unwrap();
    fails(
        &["speak", &lone.display().to_string(), "hi", "-o", &out],
        "voice config",
    );
    // A config that is not Piper's espeak kind.
    std::fs::copy(&onnx, s.0.join("text.onnx")).unwrap();
    let config = std::fs::read_to_string(format!("{}.json", onnx.display())).unwrap();
    std::fs::write(
        s.0.join("text.onnx.json"),
        config.replace(
            "\"phoneme_type\": \"espeak\"",
            "\"phoneme_type\": \"pinyin\"",
        ),
    )
    .unwrap();
    fails(&["speak", &s.path("text.onnx"), "hi", "-o", &out], "pinyin");
}
