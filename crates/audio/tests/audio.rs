//! End-to-end checks against the fixtures of scripts/reference/make_mel_goldens.py
//! (faster-whisper 1.2.1's FeatureExtractor, numpy 2.4.6) and against closed-form signals.

use std::path::{Path, PathBuf};

use synaptix_audio::{
    load_whisper_audio, read_wav, resample, whisper_log_mel, AudioError, LogMel,
    WHISPER_SAMPLE_RATE,
};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/audio")
}

fn goldens() -> serde_json::Value {
    let text = std::fs::read_to_string(fixtures().join("audio_goldens.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn read_f32_le(path: &Path) -> Vec<f32> {
    std::fs::read(path)
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// The chirp fixture's samples (int16 / 32768).
fn chirp() -> Vec<f32> {
    let audio = read_wav(&fixtures().join("chirp16k.wav")).unwrap();
    assert_eq!(audio.sample_rate, 16_000);
    audio.samples
}

/// Compares `whisper_log_mel` of the golden's slice of the chirp with the golden; returns the
/// max abs error.
fn check_mel_golden(file: &str) -> f32 {
    let meta = goldens();
    let case = meta["mel"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["file"] == file)
        .unwrap();
    let offset = case["offset"].as_u64().unwrap() as usize;
    let count = case["samples"].as_u64().unwrap() as usize;
    let n_mels = case["n_mels"].as_u64().unwrap() as usize;
    let frames = case["frames"].as_u64().unwrap() as usize;

    let x = chirp();
    let mel: LogMel = whisper_log_mel(&x[offset..offset + count], n_mels).unwrap();
    assert_eq!((mel.n_mels, mel.frames), (n_mels, frames));
    let want = read_f32_le(&fixtures().join(file));
    assert_eq!(want.len(), n_mels * frames);
    let (mut max_err, mut at) = (0f32, 0);
    for (i, (&a, &b)) in mel.values.iter().zip(&want).enumerate() {
        let e = (a - b).abs();
        if e > max_err {
            (max_err, at) = (e, i);
        }
    }
    println!(
        "{file}: {n_mels} x {frames}, max abs error {max_err:.3e} at mel {} frame {}",
        at / frames,
        at % frames
    );
    assert!(max_err < 1e-4, "{file}: max abs error {max_err}");
    max_err
}

#[test]
fn mel80_matches_faster_whisper() {
    let x = chirp();
    assert_eq!(x.len(), 20_800);
    check_mel_golden("chirp16k_mel80.bin");
}

#[test]
fn mel128_matches_faster_whisper() {
    check_mel_golden("chirp16k_mid1600_mel128.bin");
}

#[test]
fn mel_of_30_samples_matches_faster_whisper() {
    // 190 padded samples against a 200-sample reflection: numpy reflects twice.
    check_mel_golden("chirp16k_mid30_mel80.bin");
}

#[test]
fn mel_frame_count() {
    for (len, frames) in [(1, 1), (159, 1), (160, 2), (20_800, 131), (480_000, 3001)] {
        let x: Vec<f32> = (0..len).map(|i| (i as f32 * 0.01).sin() * 0.1).collect();
        let mel = whisper_log_mel(&x, 80).unwrap();
        assert_eq!((mel.n_mels, mel.frames), (80, frames), "len {len}");
        assert_eq!(mel.values.len(), 80 * frames);
        assert!(mel.values.iter().all(|v| v.is_finite()));
        assert_eq!(mel.row(79).len(), frames);
    }
    // Digital silence: every value sits at log10(1e-10) = -10, i.e. (-10 + 4) / 4.
    let mel = whisper_log_mel(&[0.0; 1000], 128).unwrap();
    assert!(mel.values.iter().all(|&v| v == -1.5));
}

#[test]
fn mel_bad_input() {
    let e = whisper_log_mel(&[], 80).unwrap_err();
    assert!(matches!(e, AudioError::EmptyInput), "{e}");
    let e = whisper_log_mel(&[0.0; 100], 64).unwrap_err();
    assert!(matches!(e, AudioError::MelBands(64)), "{e}");
    let mut x = vec![0.0f32; 100];
    x[42] = f32::NAN;
    let e = whisper_log_mel(&x, 80).unwrap_err();
    assert!(matches!(e, AudioError::NonFinite { index: 42, .. }), "{e}");
    println!("{e}");
}

#[test]
fn mel_30s_is_independent_of_thread_count() {
    // 30 s of a deterministic, noisy signal: 3001 frames, the same on one thread as on all.
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let x: Vec<f32> = (0..480_000)
        .map(|i| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let noise = (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            0.3 * (i as f32 * 0.07).sin() + 0.05 * noise
        })
        .collect();
    let mel = whisper_log_mel(&x, 80).unwrap();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let mel1 = pool.install(|| whisper_log_mel(&x, 80).unwrap());
    assert_eq!(mel.frames, 3001);
    assert_eq!(mel, mel1, "results must not depend on the thread count");
}

#[test]
fn read_wav_24bit_stereo() {
    let meta = goldens();
    let stereo = &meta["stereo"];
    let audio = read_wav(&fixtures().join("stereo44k_24bit.wav")).unwrap();
    assert_eq!(audio.sample_rate, 44_100);
    assert_eq!(
        audio.samples.len() as u64,
        stereo["frames"].as_u64().unwrap()
    );
    // Exactly the script's (L + R) / 2 / 2^23.
    for pair in stereo["mono"].as_array().unwrap() {
        let i = pair[0].as_u64().unwrap() as usize;
        let want = pair[1].as_f64().unwrap() as f32;
        assert_eq!(audio.samples[i], want, "sample {i}");
    }
    // And the signal the script wrote, up to 24-bit rounding.
    let mut max_err = 0f64;
    for (i, &v) in audio.samples.iter().enumerate() {
        let t = i as f64 / 44_100.0;
        let tau = std::f64::consts::TAU;
        let left = 0.5 * (tau * 440.0 * t).sin();
        let right = 0.25 * (tau * 1000.0 * t + 0.3).sin() - 0.2 * (tau * 97.0 * t).sin();
        max_err = max_err.max((f64::from(v) - (left + right) / 2.0).abs());
    }
    println!("stereo 24-bit: max error against the formula {max_err:.2e}");
    assert!(max_err < 1e-6);
}

#[test]
fn load_whisper_audio_resamples_to_16k() {
    let x = load_whisper_audio(&fixtures().join("stereo44k_24bit.wav")).unwrap();
    assert_eq!(x.len(), 8000); // 0.5 s
    let y = load_whisper_audio(&fixtures().join("chirp16k.wav")).unwrap();
    assert_eq!(y, chirp());
    assert_eq!(WHISPER_SAMPLE_RATE, 16_000);
}

fn sine(rate: u32, freq: f64, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| (std::f64::consts::TAU * freq * i as f64 / f64::from(rate)).sin() as f32)
        .collect()
}

/// Max abs difference between `resample(sine at from)` and the sine at `to`, `skip` output
/// samples from either end excluded.
fn resampled_sine_error(from: u32, to: u32, freq: f64, len: usize, skip: usize) -> f32 {
    let y = resample(&sine(from, freq, len), from, to);
    let expect_len = len as f64 * f64::from(to) / f64::from(from);
    assert!(
        (y.len() as f64 - expect_len).abs() <= 1.0,
        "{from} -> {to}: {} samples, expected {expect_len}",
        y.len()
    );
    let reference = sine(to, freq, y.len());
    let err = y[skip..y.len() - skip]
        .iter()
        .zip(&reference[skip..])
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    println!(
        "{freq} Hz sine {from} -> {to} Hz: {} samples, max error {err:.2e}",
        y.len()
    );
    err
}

#[test]
fn resample_sine_44k1_to_16k() {
    let err = resampled_sine_error(44_100, 16_000, 1000.0, 44_100, 100);
    assert!(err < 1e-3);
}

#[test]
fn resample_other_rates() {
    // Upsampling, a 3:1 decimation and an awkward ratio (a tone well inside both passbands).
    assert!(resampled_sine_error(8_000, 16_000, 1000.0, 8_000, 100) < 1e-3);
    assert!(resampled_sine_error(48_000, 16_000, 3000.0, 48_000, 100) < 1e-3);
    assert!(resampled_sine_error(22_050, 16_000, 440.0, 22_050, 100) < 1e-3);
    assert!(resampled_sine_error(44_100, 16_001, 1000.0, 8_000, 100) < 1e-3);
}

#[test]
fn resample_removes_what_the_output_cannot_hold() {
    // 10 kHz at 48 kHz is above the 8 kHz Nyquist of 16 kHz: it must not alias to 6 kHz.
    let y = resample(&sine(48_000, 10_000.0, 48_000), 48_000, 16_000);
    let peak = y[100..y.len() - 100]
        .iter()
        .fold(0f32, |m, v| m.max(v.abs()));
    println!("10 kHz tone after 48 -> 16 kHz: peak {peak:.2e}");
    assert!(peak < 1e-3);
}

#[test]
fn resample_identity_and_degenerate() {
    let x = sine(16_000, 440.0, 1234);
    assert_eq!(resample(&x, 16_000, 16_000), x);
    assert!(resample(&[], 44_100, 16_000).is_empty());
    assert!(resample(&x, 0, 16_000).is_empty());
    assert!(resample(&x, 16_000, 0).is_empty());
    assert_eq!(resample(&[0.5], 44_100, 16_000).len(), 1);
}

// ---- bad files ------------------------------------------------------------------------

fn tmp(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("synaptix-audio-tests");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// A canonical 44-byte header followed by `data` (the data chunk length is `data_len`).
fn wav_bytes(tag: u16, channels: u16, rate: u32, bits: u16, data_len: u32, data: &[u8]) -> Vec<u8> {
    let block_align = channels * bits.div_ceil(8);
    let mut b = Vec::new();
    b.extend_from_slice(b"RIFF");
    b.extend_from_slice(&36u32.wrapping_add(data_len).to_le_bytes());
    b.extend_from_slice(b"WAVEfmt ");
    b.extend_from_slice(&16u32.to_le_bytes());
    b.extend_from_slice(&tag.to_le_bytes());
    b.extend_from_slice(&channels.to_le_bytes());
    b.extend_from_slice(&rate.to_le_bytes());
    b.extend_from_slice(&(rate * u32::from(block_align)).to_le_bytes());
    b.extend_from_slice(&block_align.to_le_bytes());
    b.extend_from_slice(&bits.to_le_bytes());
    b.extend_from_slice(b"data");
    b.extend_from_slice(&data_len.to_le_bytes());
    b.extend_from_slice(data);
    b
}

/// Writes `bytes` to a temp file, reads it, and checks the error is one line naming the file
/// and containing `expect`.
fn expect_error(name: &str, bytes: Option<&[u8]>, expect: &str) -> AudioError {
    let path = tmp(name);
    match bytes {
        Some(b) => std::fs::write(&path, b).unwrap(),
        None => {
            let _ = std::fs::remove_file(&path);
        }
    }
    let err = read_wav(&path).unwrap_err();
    let msg = err.to_string();
    println!("{name}: {msg}");
    assert!(!msg.contains('\n'), "{msg}");
    assert!(msg.starts_with(&path.display().to_string()), "{msg}");
    assert!(msg.contains(expect), "{msg:?} lacks {expect:?}");
    // load_whisper_audio passes the same error on for RIFF files (read_audio hands those to
    // read_wav); other content is a format read_audio does not know.
    let whisper = load_whisper_audio(&path).unwrap_err();
    if bytes.is_none_or(|b| b.starts_with(b"RIFF")) {
        assert_eq!(whisper.to_string(), msg);
    } else {
        assert!(
            matches!(whisper, AudioError::UnknownFormat { .. }),
            "{whisper}"
        );
    }
    err
}

#[test]
fn bad_files_are_errors() {
    let e = expect_error("missing.wav", None, "cannot read");
    assert!(matches!(e, AudioError::Io { .. }));
    expect_error("empty.wav", Some(b""), "not a WAV file (empty file)");
    expect_error(
        "text.wav",
        Some(b"hello, this is not audio\nsecond line\n"),
        "not a WAV file (RIFF header missing)",
    );
    expect_error(
        "avi.wav",
        Some(b"RIFF\x04\x00\x00\x00AVI LIST"),
        "not a WAV file (RIFF form type is not WAVE)",
    );

    // The data chunk promises 41,600 bytes; 1,000 are there.
    let good = std::fs::read(fixtures().join("chirp16k.wav")).unwrap();
    let e = expect_error(
        "truncated.wav",
        Some(&good[..44 + 1000]),
        "truncated WAV file",
    );
    assert!(matches!(
        e,
        AudioError::Truncated {
            expected: 20_800,
            got: 500,
            ..
        }
    ));
    // Cut inside a sample.
    expect_error(
        "truncated_odd.wav",
        Some(&good[..44 + 1001]),
        "truncated WAV file",
    );
    // Cut inside the header.
    expect_error(
        "truncated_header.wav",
        Some(&good[..30]),
        "malformed WAV file: the file ends inside the fmt chunk",
    );
    expect_error(
        "truncated_header2.wav",
        Some(&good[..40]),
        "malformed WAV file",
    );

    expect_error(
        "pcm12.wav",
        Some(&wav_bytes(1, 1, 16_000, 12, 4, &[0; 4])),
        "unsupported WAV format: 12-bit integer",
    );
    expect_error(
        "float64.wav",
        Some(&wav_bytes(3, 1, 16_000, 64, 8, &[0; 8])),
        "unsupported WAV format: 64-bit float",
    );
    expect_error(
        "mulaw.wav",
        Some(&wav_bytes(7, 1, 8_000, 8, 4, &[0; 4])),
        "unsupported WAV format: mu-law",
    );
    expect_error(
        "rate0.wav",
        Some(&wav_bytes(1, 1, 0, 16, 4, &[0; 4])),
        "sample rate 0",
    );
    expect_error(
        "nochannels.wav",
        Some(&wav_bytes(1, 0, 16_000, 16, 4, &[0; 4])),
        "zero channels",
    );
    let e = expect_error(
        "nosamples.wav",
        Some(&wav_bytes(1, 1, 16_000, 16, 0, &[])),
        "no samples",
    );
    assert!(matches!(e, AudioError::NoSamples { .. }));
    // A header promising 4 GiB must not make the reader reserve 4 GiB.
    expect_error(
        "huge.wav",
        Some(&wav_bytes(1, 2, 16_000, 16, 0xFFFF_FFFC, &[0; 64])),
        "truncated WAV file",
    );
}

#[test]
fn damaged_headers_never_panic() {
    let good = std::fs::read(fixtures().join("stereo44k_24bit.wav")).unwrap();
    let path = tmp("damaged.wav");
    let (mut ok, mut err) = (0, 0);
    let mut check = |bytes: &[u8]| {
        std::fs::write(&path, bytes).unwrap();
        match read_wav(&path) {
            Ok(_) => ok += 1,
            Err(e) => {
                assert!(!e.to_string().contains('\n'));
                err += 1;
            }
        }
    };
    for cut in (0..=64).chain([1000, 1001, 1002]) {
        check(&good[..cut]);
    }
    // Every header byte set to a few telling values, on a complete 100-frame file.
    let short = wav_bytes(1, 2, 44_100, 24, 600, &good[44..44 + 600]);
    for at in 0..44 {
        for v in [0u8, 1, 2, 3, 0x7F, 0x80, 0xFE, 0xFF] {
            let mut b = short.to_vec();
            b[at] = v;
            check(&b);
        }
    }
    println!("damaged headers: {ok} read, {err} refused");
}

#[test]
fn wav_formats_decode() {
    // 8-bit unsigned, 32-bit integer and 32-bit float, against their known scaling.
    let path = tmp("u8.wav");
    std::fs::write(&path, wav_bytes(1, 1, 8_000, 8, 4, &[0, 128, 255, 64])).unwrap();
    let a = read_wav(&path).unwrap();
    assert_eq!(a.samples, [-1.0, 0.0, 127.0 / 128.0, -0.5]);
    assert_eq!(a.sample_rate, 8_000);

    let mut data = Vec::new();
    for v in [i32::MIN, 0, 1 << 30, i32::MAX] {
        data.extend_from_slice(&v.to_le_bytes());
    }
    std::fs::write(&path, wav_bytes(1, 2, 8_000, 32, 16, &data)).unwrap();
    let a = read_wav(&path).unwrap();
    assert_eq!(
        a.samples,
        [-0.5, (0.5 + i32::MAX as f64 / 2_147_483_648.0) as f32 / 2.0]
    );

    let mut data = Vec::new();
    for v in [0.25f32, -0.75, 1.0] {
        data.extend_from_slice(&v.to_le_bytes());
    }
    std::fs::write(&path, wav_bytes(3, 1, 22_050, 32, 12, &data)).unwrap();
    let a = read_wav(&path).unwrap();
    assert_eq!(a.samples, [0.25, -0.75, 1.0]);
    assert_eq!(a.sample_rate, 22_050);
}
