//! Whisper decoding with whisper-base against the goldens of
//! `scripts/reference/make_whisper_goldens.py` (speech synthesized by espeak-ng, stored as a
//! 16 kHz WAV):
//!
//! - one window without timestamps, greedy and with a beam of 5: the same tokens as
//!   CTranslate2's `generate` in float32;
//! - timestamp mode against faster-whisper 1.2.1's `transcribe` (temperature 0, no VAD) on the
//!   clip and on longer inputs assembled from it, greedy without conditioning on previous text,
//!   beam 5 with it (faster-whisper's default) and without it: the same windows, and segments
//!   with the same seek, start, end, tokens and text.
//!
//! Needs the model: `scripts/fetch-models.sh whisper-base` (CI runs it first).

use std::path::PathBuf;

use synaptix_bundle::cache;
use synaptix_infer::transcribe::{
    generate, split_at_timestamps, transcribe, SearchOptions, Segment, TimedTokens,
    TranscribeEvent, TranscribeOptions,
};
use synaptix_models::whisper::{Whisper, WhisperFiles, WhisperTokens, WINDOW_FRAMES};
use synaptix_tokenizer::Tokenizer;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/whisper")
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("id array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

struct Setup {
    golden: serde_json::Value,
    tokenizer: Tokenizer,
    tokens: WhisperTokens,
    model: Whisper,
}

impl Setup {
    /// The model and the goldens; `None` (the test skipped) without the model.
    fn load() -> Option<Setup> {
        let dir = cache::models_dir().join("whisper-base");
        let Ok(files) = WhisperFiles::in_dir(&dir) else {
            eprintln!(
                "SKIPPED: whisper-base not found in {} (run scripts/fetch-models.sh whisper-base)",
                dir.display()
            );
            return None;
        };
        let text = std::fs::read_to_string(fixtures().join("goldens.json")).expect("goldens.json");
        let golden = serde_json::from_str(&text).expect("valid json");
        let tokenizer = Tokenizer::from_tokenizer_json(&files.tokenizer).expect("tokenizer.json");
        let tokens = WhisperTokens::from_config(&files.config, &|t| tokenizer.token_id(t), &|id| {
            tokenizer
                .piece(id)
                .map(|p| String::from_utf8_lossy(p).into_owned())
        })
        .expect("config.json");
        let model = Whisper::load(&files.model).expect("model.bin");
        Some(Setup {
            golden,
            tokenizer,
            tokens,
            model,
        })
    }

    fn decode(&self, ids: &[u32]) -> String {
        String::from_utf8_lossy(&self.tokenizer.detokenize(ids, true, false)).into_owned()
    }
}

/// Greedy and beam-5 decoding of the clip's first window without timestamps: CTranslate2's
/// tokens, streamed as generated, and (beam) its length-normalized score.
#[test]
fn generate_matches_ctranslate2() {
    let Some(s) = Setup::load() else { return };
    let clip = &s.golden["clips"][0];
    let wav = fixtures().join(clip["wav"].as_str().expect("wav"));
    let audio = synaptix_audio::read_wav(&wav).expect("wav fixture");
    let mel = synaptix_audio::whisper_log_mel(&audio.samples, 80).expect("mel");
    let len = (mel.frames - 1).min(WINDOW_FRAMES);
    let mut window = vec![0f32; 80 * WINDOW_FRAMES];
    for (c, row) in window.chunks_exact_mut(WINDOW_FRAMES).enumerate() {
        row[..len].copy_from_slice(&mel.values[c * mel.frames..c * mel.frames + len]);
    }
    let encoded = s.model.encode(&window).expect("encode");
    let prompt = ids(&clip["prompt"]);
    assert_eq!(prompt[1], s.tokens.language("en").expect("en"));
    assert_eq!(prompt[3], s.tokens.no_timestamps);
    let beam = &s.golden["beam5"];
    assert_eq!(ids(&beam["prompt"]), prompt);
    for (beam_size, want) in [(1, clip), (5, beam)] {
        let options = SearchOptions {
            beam_size,
            max_initial_timestamp_index: 50,
        };
        let mut streamed = Vec::new();
        let got = generate(
            &s.model,
            &encoded,
            &prompt,
            &s.tokens,
            &options,
            &mut |id| streamed.push(id),
        )
        .expect("generate");
        let text = s.decode(&got.tokens);
        eprintln!("beam {beam_size}: {text}");
        assert_eq!(
            got.tokens,
            ids(&want["tokens"]),
            "beam {beam_size}: tokens differ from ctranslate2's: {text:?}"
        );
        assert_eq!(streamed, got.tokens);
        assert_eq!(text, want["text"].as_str().expect("text"));
        if let Some(score) = want["score"].as_f64() {
            let normalized = got.sum_logprob / got.tokens.len() as f64;
            eprintln!("beam {beam_size}: score {normalized:.5} (ctranslate2 {score:.5})");
            assert!((normalized - score).abs() < 1e-3, "{normalized} vs {score}");
        }
    }
}

/// The clip's samples assembled as the goldens' `parts` say: `{"clip": [from, to]}` (to `null`:
/// the clip's end) and `{"zeros": n}`, concatenated.
fn assemble(clip: &[f32], parts: &serde_json::Value) -> Vec<f32> {
    let mut out = Vec::new();
    for part in parts.as_array().expect("parts") {
        if let Some(n) = part.get("zeros") {
            out.resize(out.len() + n.as_u64().expect("zeros") as usize, 0.0);
        } else {
            let range = &part["clip"];
            let from = range[0].as_u64().expect("from") as usize;
            let to = range[1].as_u64().map_or(clip.len(), |t| t as usize);
            out.extend_from_slice(&clip[from..to]);
        }
    }
    out
}

/// `transcribe` with `beam_size` and `condition` on every input of the goldens' `key`:
/// faster-whisper's language, windows and segments.
fn segments_match(key: &str, beam_size: usize, condition: bool) {
    let Some(s) = Setup::load() else { return };
    assert_eq!(s.tokens.timestamp_begin, 50364);
    assert_eq!(s.tokens.no_speech, s.tokenizer.token_id("<|nocaptions|>"));
    assert_eq!(s.tokens.sot_prev, s.tokenizer.token_id("<|startofprev|>"));
    let clip = synaptix_audio::read_wav(&fixtures().join("speech16k.wav")).expect("wav fixture");
    let decode = |ids: &[u32]| s.decode(ids);

    let cases = s.golden[key].as_array().expect(key);
    assert!(cases.len() >= 3);
    for case in cases {
        let name = format!("{key}/{}", case["name"].as_str().expect("name"));
        let samples = assemble(&clip.samples, &case["parts"]);
        assert_eq!(
            samples.len() as u64,
            case["samples"].as_u64().expect("samples")
        );
        let mel = synaptix_audio::whisper_log_mel(&samples, 80).expect("mel");
        let options = TranscribeOptions {
            beam_size,
            condition_on_previous_text: condition,
            ..TranscribeOptions::new(s.tokens.transcribe, None)
        };
        let mut streamed = Vec::new();
        let got = transcribe(
            &s.model,
            &mel.values,
            mel.frames,
            &s.tokens,
            &options,
            &decode,
            &mut |event| {
                if let TranscribeEvent::Segment(s) = event {
                    streamed.push(s.clone());
                }
            },
        )
        .expect("transcribe");
        let (language, p) = got.language.clone().expect("detected");
        let p_ref = case["language_probability"].as_f64().expect("p");
        eprintln!(
            "{name}: {:.2} s, {} windows, language {language} p {p:.4} (faster-whisper {p_ref:.4}), encoder {:.2} s, decoder {:.2} s",
            samples.len() as f64 / 16000.0,
            got.windows,
            got.encode_s,
            got.decode_s,
        );
        assert_eq!(language, case["language"].as_str().expect("language"));
        assert_eq!(got.segments, streamed);
        let want = case["segments"].as_array().expect("segments");
        for s in &got.segments {
            eprintln!(
                "  [{:7.2} -> {:7.2}] seek {:5} avg_logprob {:.4} no_speech {:.4} {:?}",
                s.start, s.end, s.seek, s.avg_logprob, s.no_speech_prob, s.text
            );
        }
        for (i, (s, w)) in got.segments.iter().zip(want).enumerate() {
            let at = format!("{name} segment {i}");
            assert_eq!(
                s.tokens,
                ids(&w["tokens"]),
                "{at}: tokens differ ({:?})",
                s.text
            );
            assert_eq!(
                s.seek as u64,
                w["seek"].as_u64().expect("seek"),
                "{at}: seek"
            );
            for (got, key) in [(s.start, "start"), (s.end, "end")] {
                let want = w[key].as_f64().expect(key);
                assert!((got - want).abs() < 1e-9, "{at}: {key} {got} != {want}");
            }
            assert_eq!(s.text, w["text"].as_str().expect("text"), "{at}: text");
            let avg = w["avg_logprob"].as_f64().expect("avg_logprob");
            let nsp = w["no_speech_prob"].as_f64().expect("no_speech_prob");
            assert!(
                (s.avg_logprob - avg).abs() < 1e-3,
                "{at}: avg_logprob {} vs {avg}",
                s.avg_logprob
            );
            assert!(
                (s.no_speech_prob as f64 - nsp).abs() < 1e-3,
                "{at}: no_speech_prob {} vs {nsp}",
                s.no_speech_prob
            );
        }
        assert_eq!(got.segments.len(), want.len(), "{name}: segment count");
        assert_eq!(
            got.windows as u64,
            case["windows"].as_u64().expect("windows"),
            "{name}: windows"
        );
        assert_eq!(
            got.skipped as u64,
            case["windows_skipped"].as_u64().expect("skipped"),
            "{name}: windows skipped as silence"
        );
    }
}

/// Greedy, no conditioning on previous text (goldens' `timestamped`).
#[test]
fn greedy_segments_match_faster_whisper() {
    segments_match("timestamped", 1, false);
}

/// faster-whisper's defaults at temperature 0: beam 5, the previous text as prompt.
#[test]
fn beam5_segments_match_faster_whisper() {
    segments_match("timestamped_beam5", 5, true);
}

/// Beam 5 without conditioning on previous text.
#[test]
fn beam5_unconditioned_segments_match_faster_whisper() {
    segments_match("timestamped_beam5_no_condition", 5, false);
}

fn ts(i: u32) -> u32 {
    50364 + i
}

/// faster-whisper's `_split_segments_by_timestamps` on hand-made windows (no model needed).
#[test]
fn split_at_timestamps_like_faster_whisper() {
    let tb = 50364;
    // Pairs, then an unfinished piece: the remainder is dropped, seek moves to the last pair.
    let tokens = [ts(0), 1, 2, ts(150), ts(150), 3, ts(300), ts(310), 4, 5];
    let (pieces, seek) = split_at_timestamps(&tokens, tb, 1000, 3000);
    assert_eq!(
        pieces,
        vec![
            TimedTokens {
                start: 10.0,
                end: 10.0 + 150.0 * 0.02,
                tokens: vec![ts(0), 1, 2, ts(150)]
            },
            TimedTokens {
                start: 10.0 + 150.0 * 0.02,
                end: 10.0 + 300.0 * 0.02,
                tokens: vec![ts(150), 3, ts(300)]
            },
        ]
    );
    assert_eq!(seek, 1000 + 300 * 2);
    // A single timestamp at the end: the last piece is kept and the whole window consumed.
    let tokens = [ts(0), 1, ts(50), ts(60), 2, ts(90)];
    let (pieces, seek) = split_at_timestamps(&tokens, tb, 0, 2500);
    assert_eq!(pieces.len(), 2);
    assert_eq!(pieces[1].tokens, vec![ts(60), 2, ts(90)]);
    assert!((pieces[1].end - 90.0 * 0.02).abs() < 1e-12);
    assert_eq!(seek, 2500);
    // No pair: one piece to the last timestamp, the window consumed.
    let (pieces, seek) = split_at_timestamps(&[ts(0), 7, 8, ts(100)], tb, 3000, 3000);
    assert_eq!(pieces.len(), 1);
    assert_eq!(
        (pieces[0].start, pieces[0].end),
        (30.0, 30.0 + 100.0 * 0.02)
    );
    assert_eq!(seek, 6000);
    // No timestamp past 0.00: the piece lasts the window.
    let (pieces, seek) = split_at_timestamps(&[ts(0), 7, 8], tb, 0, 1234);
    assert_eq!((pieces[0].start, pieces[0].end), (0.0, 12.34));
    assert_eq!(seek, 1234);
}

/// `transcribe` of 16 kHz `samples` with `options`, segments only (no events).
fn run(s: &Setup, samples: &[f32], options: &TranscribeOptions) -> Vec<Segment> {
    run_with_tokens(s, samples, options).0
}

/// [`run`], and the tokens `transcribe` reported as it went.
fn run_with_tokens(
    s: &Setup,
    samples: &[f32],
    options: &TranscribeOptions,
) -> (Vec<Segment>, Vec<u32>) {
    let decode = |ids: &[u32]| s.decode(ids);
    let mel = synaptix_audio::whisper_log_mel(samples, 80).expect("mel");
    let mut reported = Vec::new();
    let segments = transcribe(
        &s.model,
        &mel.values,
        mel.frames,
        &s.tokens,
        options,
        &decode,
        &mut |event| {
            if let TranscribeEvent::Token(t) = event {
                reported.push(t)
            }
        },
    )
    .expect("transcribe")
    .segments;
    (segments, reported)
}

/// The segments equal faster-whisper's `want`: tokens, seek, start and end.
fn assert_segments(name: &str, got: &[Segment], want: &serde_json::Value) {
    let want = want.as_array().expect("segments");
    assert_eq!(got.len(), want.len(), "{name}: segment count");
    for (i, (seg, w)) in got.iter().zip(want).enumerate() {
        let at = format!("{name} segment {i} ({:?})", seg.text);
        assert_eq!(seg.tokens, ids(&w["tokens"]), "{at}: tokens");
        assert_eq!(
            seg.seek as u64,
            w["seek"].as_u64().expect("seek"),
            "{at}: seek"
        );
        for (got, key) in [(seg.start, "start"), (seg.end, "end")] {
            let want = w[key].as_f64().expect(key);
            assert!((got - want).abs() < 1e-9, "{at}: {key} {got} != {want}");
        }
    }
}

/// Word timestamps (faster-whisper's `word_timestamps=True`, beam 5, conditioning) on every
/// input of `tests/fixtures/whisper/words.json` (`make_whisper_word_goldens.py`): the same
/// segments (seek, start, end, tokens, text; times follow the words and so does seeking) and
/// the same words with the same start and end (to the 0.01 s faster-whisper rounds to) and
/// probabilities within 2e-3.
#[test]
fn word_timestamps_match_faster_whisper() {
    let Some(s) = Setup::load() else { return };
    assert_eq!(s.tokens.alignment_heads.len(), 8);
    let text = std::fs::read_to_string(fixtures().join("words.json")).expect("words.json");
    let golden: serde_json::Value = serde_json::from_str(&text).expect("valid json");
    let clip = synaptix_audio::read_wav(&fixtures().join("speech16k.wav")).expect("wav fixture");
    let cases = golden["clips"].as_array().expect("clips");
    assert_eq!(cases.len(), 3);
    let mut words_checked = 0;
    for case in cases {
        let name = case["name"].as_str().expect("name");
        let options = TranscribeOptions {
            word_timestamps: true,
            ..TranscribeOptions::new(s.tokens.transcribe, None)
        };
        let got = run(&s, &assemble(&clip.samples, &case["parts"]), &options);
        assert_segments(name, &got, &case["segments"]);
        for (seg, w) in got
            .iter()
            .zip(case["segments"].as_array().expect("segments"))
        {
            let at = format!("{name} segment {:?}", seg.text);
            assert_eq!(seg.text, w["text"].as_str().expect("text"), "{at}: text");
            let want_words = w["words"].as_array().expect("words");
            assert_eq!(seg.words.len(), want_words.len(), "{at}: word count");
            for (word, ww) in seg.words.iter().zip(want_words) {
                let at = format!("{at} word {:?}", word.word);
                assert_eq!(word.word, ww["word"].as_str().expect("word"), "{at}");
                for (got, key) in [(word.start, "start"), (word.end, "end")] {
                    let want = ww[key].as_f64().expect(key);
                    assert!((got - want).abs() < 1e-9, "{at}: {key} {got} != {want}");
                }
                let p = ww["probability"].as_f64().expect("probability");
                assert!(
                    (word.probability as f64 - p).abs() < 2e-3,
                    "{at}: probability {} vs {p}",
                    word.probability
                );
                words_checked += 1;
            }
        }
    }
    assert_eq!(words_checked, 191);
}

/// faster-whisper's `initial_prompt` (`tests/fixtures/whisper/prompt.json`,
/// `make_whisper_prompt_goldens.py`): the prompt's token ids as its tokenizer makes them, and on
/// every input, with and without conditioning on previous text, the same segments (the prompt
/// corrects "round" to "brown" and "Speak" to "Speech").
#[test]
fn initial_prompt_matches_faster_whisper() {
    let Some(s) = Setup::load() else { return };
    let text = std::fs::read_to_string(fixtures().join("prompt.json")).expect("prompt.json");
    let golden: serde_json::Value = serde_json::from_str(&text).expect("valid json");
    let prompt = golden["initial_prompt"].as_str().expect("prompt");
    let prompt_ids = s
        .tokenizer
        .encode(&format!(" {}", prompt.trim()), false, false)
        .expect("encode");
    assert_eq!(prompt_ids, ids(&golden["prompt_ids"]));
    let clip = synaptix_audio::read_wav(&fixtures().join("speech16k.wav")).expect("wav fixture");
    for (key, condition) in [("conditioned", true), ("unconditioned", false)] {
        for case in golden[key].as_array().expect(key) {
            let name = format!("{key}/{}", case["name"].as_str().expect("name"));
            let options = TranscribeOptions {
                initial_prompt: prompt_ids.clone(),
                condition_on_previous_text: condition,
                ..TranscribeOptions::new(s.tokens.transcribe, None)
            };
            let got = run(&s, &assemble(&clip.samples, &case["parts"]), &options);
            assert_segments(&name, &got, &case["segments"]);
        }
    }
}

/// faster-whisper's `vad_filter=True` (`tests/fixtures/whisper/vad.json`,
/// `make_whisper_vad_goldens.py`): Silero VAD's speech chunks equal `get_speech_timestamps`',
/// and transcribing only their audio, times mapped back onto the original, gives the same
/// segments (seek in the collected audio, start and end in the original, tokens, text).
#[test]
fn vad_filter_matches_faster_whisper() {
    use synaptix_infer::vad::{collect_chunks, speech_chunks, TimestampMap, VadOptions};
    use synaptix_models::silero_vad::SileroVad;
    let Some(s) = Setup::load() else { return };
    let vad_path = cache::models_dir().join("silero_vad_v6.onnx");
    let vad = SileroVad::load(&vad_path).expect("scripts/fetch-models.sh silero-vad");
    let text = std::fs::read_to_string(fixtures().join("vad.json")).expect("vad.json");
    let golden: serde_json::Value = serde_json::from_str(&text).expect("valid json");
    let clip = synaptix_audio::read_wav(&fixtures().join("speech16k.wav")).expect("wav fixture");
    for case in golden["clips"].as_array().expect("clips") {
        let name = case["name"].as_str().expect("name");
        let audio = assemble(&clip.samples, &case["parts"]);
        let probs = vad.speech_probs(&audio).expect("probabilities");
        let chunks = speech_chunks(&probs, audio.len(), &VadOptions::default());
        let want_chunks: Vec<(u64, u64)> = case["speech_chunks"]
            .as_array()
            .expect("chunks")
            .iter()
            .map(|c| {
                (
                    c["start"].as_u64().expect("start"),
                    c["end"].as_u64().expect("end"),
                )
            })
            .collect();
        let got_chunks: Vec<(u64, u64)> = chunks
            .iter()
            .map(|c| (c.start as u64, c.end as u64))
            .collect();
        assert_eq!(got_chunks, want_chunks, "{name}: speech chunks");
        let speech = collect_chunks(&audio, &chunks);
        let mut got = run(
            &s,
            &speech,
            &TranscribeOptions::new(s.tokens.transcribe, None),
        );
        TimestampMap::new(&chunks).restore(&mut got);
        assert_segments(name, &got, &case["segments"]);
    }
}

/// faster-whisper's temperature fallback (`tests/fixtures/whisper/fallback.json`,
/// `make_whisper_fallback_goldens.py`). At temperature 0 every segment's compression ratio is
/// faster-whisper's (zlib's compressed size, so the fallback decisions agree). With its default
/// temperatures, the clean clips never fall back and give faster-whisper's segments, while the
/// clip that repeats "The quick brown fox" falls back on its window as faster-whisper's did; what
/// the sampling then draws is synaptix's own (a result kept before the last temperature passes
/// both thresholds) and the same seed draws it again.
#[test]
fn temperature_fallback_matches_faster_whisper() {
    let Some(s) = Setup::load() else { return };
    let text = std::fs::read_to_string(fixtures().join("fallback.json")).expect("fallback.json");
    let golden: serde_json::Value = serde_json::from_str(&text).expect("valid json");
    let clip = synaptix_audio::read_wav(&fixtures().join("speech16k.wav")).expect("wav fixture");
    let temperatures: Vec<f32> = golden["temperatures"]
        .as_array()
        .expect("temperatures")
        .iter()
        .map(|t| t.as_f64().expect("temperature") as f32)
        .collect();
    let fallback = |seed: u64| TranscribeOptions {
        temperatures: temperatures.clone(),
        seed,
        ..TranscribeOptions::new(s.tokens.transcribe, None)
    };
    let clips = golden["clips"].as_array().expect("clips");
    assert_eq!(clips.len(), 4);
    for case in clips {
        let name = case["name"].as_str().expect("name");
        let audio = assemble(&clip.samples, &case["parts"]);
        let at_zero = run(
            &s,
            &audio,
            &TranscribeOptions::new(s.tokens.transcribe, None),
        );
        assert_segments(name, &at_zero, &case["temperature_0"]);
        for (seg, w) in at_zero
            .iter()
            .zip(case["temperature_0"].as_array().expect("segments"))
        {
            let want = w["compression_ratio"].as_f64().expect("ratio");
            assert!(
                (seg.compression_ratio - want).abs() < 1e-12,
                "{name}: compression ratio {} != {want}",
                seg.compression_ratio
            );
            assert_eq!(seg.temperature, 0.0);
        }
        let want = case["fallback"].as_array().expect("fallback segments");
        let fell_back = want[0]["temperature"].as_f64().expect("temperature") > 0.0;
        match name {
            "speech16k" | "clip_silence_head_silence" => {
                assert!(!fell_back, "{name}: the golden falls back");
                let got = run(&s, &audio, &fallback(0));
                assert_segments(&format!("{name} with fallback"), &got, &case["fallback"]);
                assert!(got.iter().all(|seg| seg.temperature == 0.0));
            }
            "fox_repeated" => {
                assert!(fell_back, "{name}: the golden does not fall back");
                assert!(at_zero[0].compression_ratio > 2.4);
                let got = run(&s, &audio, &fallback(7));
                assert!(!got.is_empty(), "{name}: no segments");
                let first = &got[0];
                assert!(first.temperature > 0.0, "{name}: no fallback");
                let last = *temperatures.last().expect("temperatures");
                if first.temperature < last {
                    assert!(
                        first.compression_ratio <= 2.4 && first.avg_logprob >= -1.0,
                        "{name}: kept at {} without passing the thresholds",
                        first.temperature
                    );
                }
                let again = run(&s, &audio, &fallback(7));
                assert_eq!(got, again, "{name}: the same seed drew another result");
                // Without timestamps a window is one segment of all its tokens: each is
                // reported once, streamed at temperature 0 alone (whose result fails the
                // thresholds here) and after the choice with a fallback.
                for temperatures in [vec![0.0], vec![0.0, 0.5]] {
                    let options = TranscribeOptions {
                        timestamps: false,
                        temperatures,
                        best_of: 2,
                        ..TranscribeOptions::new(s.tokens.transcribe, None)
                    };
                    let (segments, reported) = run_with_tokens(&s, &audio, &options);
                    let tokens: Vec<u32> = segments.iter().flat_map(|g| g.tokens.clone()).collect();
                    assert_eq!(reported, tokens, "{name}: tokens reported");
                }
            }
            // The window with the sentence three times falls back there too; what it samples
            // then decides the next windows' prompts, so only the T = 0 ratios are compared.
            _ => assert!(fell_back, "{name}"),
        }
    }
}
