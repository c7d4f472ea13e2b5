//! Compressed audio through `read_audio`: FLAC, MP3 and Ogg Vorbis fixtures made by
//! scripts/reference/make_audio_codec_fixtures.sh (Debian 12's ffmpeg 5.1.9), checked against
//! the WAV they were encoded from (FLAC, lossless) and against ffmpeg's own decodes (MP3, Vorbis);
//! then damaged and unsupported files, which must give a shorter decode or a one-line error
//! naming the file, and never a panic (read_audio catches the ones symphonia still has and
//! reports them as errors; the fuzz tests print how many they caught).

use std::path::{Path, PathBuf};

use synaptix_audio::{
    load_whisper_audio, read_audio, read_wav, Audio, AudioError, WHISPER_SAMPLE_RATE,
};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/audio")
}

fn tmp(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("synaptix-audio-codec-tests");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn read_f32_le(path: &Path) -> Vec<f32> {
    std::fs::read(path)
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> (f32, usize) {
    let mut worst = (0f32, 0);
    for (i, (&x, &y)) in a.iter().zip(b).enumerate() {
        let d = (x - y).abs();
        if d > worst.0 {
            worst = (d, i);
        }
    }
    worst
}

/// The WAV the codec fixtures were encoded from: 1.3 s at 16 kHz.
fn chirp_wav() -> Audio {
    let audio = read_wav(&fixtures().join("chirp16k.wav")).unwrap();
    assert_eq!((audio.samples.len(), audio.sample_rate), (20_800, 16_000));
    audio
}

#[test]
fn flac_equals_the_wav_sample_for_sample() {
    let wav = chirp_wav();
    let flac = read_audio(&fixtures().join("chirp16k.flac")).unwrap();
    assert_eq!(flac.sample_rate, 16_000);
    assert_eq!(flac.samples.len(), wav.samples.len());
    // Bit for bit: FLAC's 16-bit integers land on the same v / 32768 as read_wav's.
    let same_bits = flac
        .samples
        .iter()
        .zip(&wav.samples)
        .all(|(a, b)| a.to_bits() == b.to_bits());
    assert!(
        same_bits,
        "max diff {:?}",
        max_abs_diff(&flac.samples, &wav.samples)
    );
    // A WAV file through read_audio is read_wav's result.
    assert_eq!(read_audio(&fixtures().join("chirp16k.wav")).unwrap(), wav);
}

#[test]
fn stereo_flac_averages_channels() {
    // 24-bit stereo, the first 4410 frames of stereo44k_24bit.wav (whose left and right
    // channels are different tones): exactly read_wav's (L + R) / 2 of those frames.
    let wav = read_wav(&fixtures().join("stereo44k_24bit.wav")).unwrap();
    let flac = read_audio(&fixtures().join("stereo44k_24bit_0.1s.flac")).unwrap();
    assert_eq!(flac.sample_rate, 44_100);
    assert_eq!(flac.samples.len(), 4410);
    assert_eq!(flac.samples[..], wav.samples[..4410]);
    // Averaged, not one channel: the left channel alone is 0.5 sin(2 pi 440 t).
    let left_err = flac
        .samples
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let t = i as f64 / 44_100.0;
            (f64::from(v) - 0.5 * (std::f64::consts::TAU * 440.0 * t).sin()).abs()
        })
        .fold(0f64, f64::max);
    assert!(left_err > 0.1, "{left_err}");
    // 1600 samples at 16 kHz: 0.1 s.
    let x = load_whisper_audio(&fixtures().join("stereo44k_24bit_0.1s.flac")).unwrap();
    assert_eq!(x.len(), 1600);
}

/// Decodes `file` and compares it with ffmpeg's decode `file.f32`; returns the max abs diff.
///
/// Alignment: both decoders apply the container's gapless information, so the two decodes
/// start and end at the same sample and equal the WAV's length (20,800) with no offset:
/// - MP3: the LAME/Info header of the first (silent) frame records 39 frames of 576 samples
///   (22,464), an encoder delay of 576 and a padding of 1088. ffmpeg and symphonia both drop
///   576 + 529 (the decoder's own delay) = 1105 samples at the start (ffprobe shows
///   start 0.069063 s = 1105 / 16000) and 1088 - 529 = 559 at the end: 22,464 - 1105 - 559 =
///   20,800.
/// - Vorbis: the first audio packet only primes the overlap-add (it yields no samples), and the
///   last page's granule position cuts the final block to the stream's true end: 20,800.
///
/// The remaining difference is float rounding between two float decoders (IMDCT and synthesis
/// filter bank in another order). A decode one sample off, or with the delay not trimmed, is off
/// by tenths (the chirp reaches 6 kHz at amplitude 0.3), which the tolerance fails at once.
fn compare_with_ffmpeg(file: &str, tolerance: f32) -> f32 {
    let ours = read_audio(&fixtures().join(file)).unwrap();
    let want = read_f32_le(&fixtures().join(format!("{file}.f32")));
    assert_eq!(ours.sample_rate, 16_000, "{file}");
    assert_eq!(ours.samples.len(), want.len(), "{file}: length");
    assert_eq!(want.len(), 20_800, "{file}: ffmpeg's length");
    let (diff, at) = max_abs_diff(&ours.samples, &want);
    // The lossy decode against the original signal, for scale.
    let (vs_wav, _) = max_abs_diff(&ours.samples, &chirp_wav().samples);
    // The tolerance tells a wrong decode: the same decode shifted by one sample fails it.
    let (shifted, _) = max_abs_diff(&ours.samples[1..], &want);
    println!(
        "{file}: {} samples, max abs diff from ffmpeg {diff:.3e} (at {at}); from the WAV \
         {vs_wav:.3e}; shifted by one sample {shifted:.3e}",
        ours.samples.len()
    );
    assert!(diff <= tolerance, "{file}: max abs diff {diff} at {at}");
    assert!(shifted > 100.0 * tolerance, "{file}: {shifted}");
    diff
}

#[test]
fn mp3_matches_ffmpeg() {
    compare_with_ffmpeg("chirp16k.mp3", 5e-5);
}

#[test]
fn ogg_vorbis_matches_ffmpeg() {
    compare_with_ffmpeg("chirp16k.ogg", 5e-6);
}

#[test]
fn load_whisper_audio_reads_mp3() {
    let x = load_whisper_audio(&fixtures().join("chirp16k.mp3")).unwrap();
    assert_eq!(WHISPER_SAMPLE_RATE, 16_000);
    // 1.3 s at 16 kHz.
    assert_eq!(x.len(), 20_800);
    assert!(x.iter().all(|v| v.is_finite()));
}

/// Checks `read_audio`'s result on a damaged copy of a fixture: Ok with at most `max_len`
/// samples, or a one-line error naming the file.
fn check_damaged(path: &Path, max_len: usize) -> Result<usize, String> {
    match read_audio(path) {
        Ok(audio) => {
            assert!(audio.samples.len() <= max_len, "{}", path.display());
            assert!(audio.sample_rate > 0);
            Ok(audio.samples.len())
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(!msg.contains('\n'), "{msg}");
            assert!(msg.starts_with(&path.display().to_string()), "{msg}");
            Err(msg)
        }
    }
}

const CODEC_FIXTURES: [&str; 4] = [
    "chirp16k.flac",
    "chirp16k.mp3",
    "chirp16k.ogg",
    "stereo44k_24bit_0.1s.flac",
];

/// Every 10% prefix of each fixture. What to expect: MP3 decodes from the first whole frame
/// on; a FLAC file cut inside its metadata (ffmpeg writes an 8 KiB padding block) does not
/// open, and the stereo FLAC holds a single frame, so no prefix of it decodes; Ogg needs its
/// header pages (the Vorbis setup header is ~3.3 KB) and then decodes whole 0.1 s pages.
#[test]
fn truncated_files_never_panic() {
    for file in CODEC_FIXTURES {
        let bytes = std::fs::read(fixtures().join(file)).unwrap();
        let full = read_audio(&fixtures().join(file)).unwrap().samples.len();
        let mut report = Vec::new();
        for tenth in 0..10 {
            let cut = bytes.len() * tenth / 10;
            let path = tmp(&format!("cut{tenth}0_{file}"));
            std::fs::write(&path, &bytes[..cut]).unwrap();
            match check_damaged(&path, full) {
                Ok(n) => report.push(format!("{}%: {n}", tenth * 10)),
                Err(msg) => {
                    if tenth == 0 {
                        assert!(msg.contains("empty file"), "{msg}");
                    }
                    report.push(format!("{}%: error", tenth * 10));
                    println!("  {msg}");
                }
            }
        }
        println!(
            "{file} ({full} samples) cut to each tenth: {}",
            report.join(", ")
        );
    }
}

/// xorshift64*: deterministic damage without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Damaged copies per fixture; `SYNAPTIX_AUDIO_FUZZ_CASES=N` runs more (and another seed).
fn fuzz_cases() -> (usize, u64) {
    match std::env::var("SYNAPTIX_AUDIO_FUZZ_CASES") {
        Ok(n) => (n.parse().unwrap(), std::process::id() as u64 | 1),
        Err(_) => (120, 0x9e37_79b9_7f4a_7c15),
    }
}

/// Outcomes of damaged copies: decodes, errors, and the distinct panics inside symphonia that
/// read_audio caught and reported as errors.
#[derive(Default)]
struct Tally {
    ok: usize,
    errors: usize,
    caught: std::collections::BTreeMap<String, usize>,
}

impl Tally {
    fn add(&mut self, path: &Path) {
        match check_damaged(path, usize::MAX) {
            Ok(_) => self.ok += 1,
            Err(msg) => {
                self.errors += 1;
                if let Some(i) = msg.find("the decoder failed on damaged data (") {
                    let what = msg[i + 36..].trim_end_matches(')').to_string();
                    *self.caught.entry(what).or_insert(0) += 1;
                }
            }
        }
    }

    fn report(&self, what: &str) {
        println!(
            "{what}: {} decode, {} errors, of which {} caught panics inside symphonia",
            self.ok,
            self.errors,
            self.caught.values().sum::<usize>()
        );
        for (panic, n) in &self.caught {
            println!("    {n} x {panic}");
        }
    }
}

#[test]
fn byte_flipped_files_never_panic() {
    let (cases, seed) = fuzz_cases();
    let mut rng = Rng(seed);
    for file in CODEC_FIXTURES {
        let bytes = std::fs::read(fixtures().join(file)).unwrap();
        let path = tmp(&format!("flipped_{seed}_{file}"));
        let mut tally = Tally::default();
        for case in 0..cases {
            let mut damaged = bytes.clone();
            // A third of the cases hit the headers (where damage is most likely to mislead a
            // parser), the rest anywhere; 1 to 16 bytes each, a bit flipped or a random value.
            let span = if case % 3 == 0 {
                damaged.len().min(512)
            } else {
                damaged.len()
            };
            for _ in 0..1 + rng.below(16) {
                let at = rng.below(span);
                damaged[at] ^= 1 << rng.below(8);
                if rng.below(4) == 0 {
                    damaged[at] = rng.next() as u8;
                }
            }
            std::fs::write(&path, &damaged).unwrap();
            tally.add(&path);
        }
        tally.report(&format!("{file}: {cases} damaged copies"));
    }
}

#[test]
fn garbage_after_a_valid_signature_never_panics() {
    let mut rng = Rng(0x0123_4567_89ab_cdef);
    let mp3 = std::fs::read(fixtures().join("chirp16k.mp3")).unwrap();
    let flac = std::fs::read(fixtures().join("chirp16k.flac")).unwrap();
    let ogg = std::fs::read(fixtures().join("chirp16k.ogg")).unwrap();
    // Real headers (ID3 tag and first frame; STREAMINFO; the Vorbis header pages) followed by
    // noise.
    let prefixes: [(&str, &[u8]); 5] = [
        ("mp3", &mp3[..20 + 288 + 4]),
        ("flac", &flac[..42]),
        ("flac_meta", &flac[..flac.len().min(8192)]),
        ("ogg", &ogg[..ogg.len().min(4096)]),
        ("oggs", b"OggS"),
    ];
    for (name, prefix) in prefixes {
        for len in [0usize, 1, 7, 100, 5000, 40_000] {
            let mut b = prefix.to_vec();
            b.extend((0..len).map(|_| rng.next() as u8));
            let path = tmp(&format!("garbage_{name}_{len}"));
            std::fs::write(&path, &b).unwrap();
            if let Err(msg) = check_damaged(&path, usize::MAX) {
                if len == 40_000 {
                    println!("{name} + {len} noise bytes: {msg}");
                }
            }
        }
    }
}

fn expect_unsupported(name: &str, bytes: &[u8], what: &str) {
    let path = tmp(name);
    std::fs::write(&path, bytes).unwrap();
    let err = read_audio(&path).unwrap_err();
    let msg = err.to_string();
    println!("{msg}");
    assert!(matches!(err, AudioError::UnknownFormat { .. }), "{msg}");
    assert!(!msg.contains('\n'), "{msg}");
    assert!(msg.starts_with(&path.display().to_string()), "{msg}");
    assert!(
        msg.ends_with("(supported: WAV, FLAC, MP3, Ogg Vorbis)"),
        "{msg}"
    );
    assert!(msg.contains(what), "{msg:?} lacks {what:?}");
    assert_eq!(load_whisper_audio(&path).unwrap_err().to_string(), msg);
}

#[test]
fn unsupported_formats_say_what_is_supported() {
    expect_unsupported(
        "notes.mp3",
        b"hello, this is not audio\nsecond line\n",
        "a text file",
    );
    expect_unsupported("empty.flac", b"", "empty file");
    // Unknown binary content: noise with no signature and, by construction (no 0xFF byte), no
    // MPEG frame sync; high bytes only, so not UTF-8 text either.
    let mut rng = Rng(42);
    let noise: Vec<u8> = (0..10_000)
        .map(|_| (rng.next() as u8 | 0x80) & 0xFE)
        .collect();
    expect_unsupported("noise.ogg", &noise, "unrecognised content");
    let mut elf = b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0\x03\0>\0".to_vec();
    elf.resize(4096, 0);
    expect_unsupported("program.wav.bin", &elf, "unrecognised content");
    let mut m4a = b"\0\0\0\x20ftypM4A \0\0\x02\0M4A isomiso2".to_vec();
    m4a.resize(2048, 0);
    expect_unsupported("speech.m4a", &m4a, "MP4/M4A");
    // An Ogg file of a codec other than Vorbis: the first page of an Opus stream.
    let mut opus =
        b"OggS\0\x02\0\0\0\0\0\0\0\0\x01\0\0\0\0\0\0\0\0\0\0\0\x01\x13OpusHead\x01\x01".to_vec();
    opus.resize(1024, 0);
    expect_unsupported("voice.ogg", &opus, "Ogg Opus");
    // A WAV file's name does not make it a WAV file, and an MP3 is found under any name.
    let wav_named = tmp("really_an_mp3.wav");
    std::fs::copy(fixtures().join("chirp16k.mp3"), &wav_named).unwrap();
    assert_eq!(read_audio(&wav_named).unwrap().samples.len(), 20_800);
    // RIFF files stay with read_wav and its messages.
    let path = tmp("riff_avi.wav");
    std::fs::write(&path, b"RIFF\x04\0\0\0AVI ").unwrap();
    let msg = read_audio(&path).unwrap_err().to_string();
    assert!(
        msg.contains("not a WAV file (RIFF form type is not WAVE)"),
        "{msg}"
    );
}

// ---- damage behind valid checksums ------------------------------------------------------
//
// Ogg pages carry a CRC-32 and FLAC frames a CRC-16, so random damage mostly stops at the
// checksum and never reaches the Vorbis or FLAC decoder. A hostile file has valid checksums:
// these cases damage page and frame payloads and then recompute the checksums.

/// Ogg's CRC-32 (polynomial 0x04C11DB7, initial 0, not reflected).
fn ogg_crc(bytes: &[u8]) -> u32 {
    let mut crc = 0u32;
    for &b in bytes {
        crc ^= u32::from(b) << 24;
        for _ in 0..8 {
            crc = if crc & 0x8000_0000 != 0 {
                (crc << 1) ^ 0x04C1_1DB7
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// FLAC's frame CRC-16 (polynomial 0x8005, initial 0, not reflected).
fn flac_crc16(bytes: &[u8]) -> u16 {
    let mut crc = 0u16;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x8005
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// (start, header length, end) of each Ogg page.
fn ogg_pages(b: &[u8]) -> Vec<(usize, usize, usize)> {
    let mut pages = Vec::new();
    let mut at = 0;
    while at + 27 <= b.len() && &b[at..at + 4] == b"OggS" {
        let n = usize::from(b[at + 26]);
        let header = 27 + n;
        let body: usize = b[at + 27..at + header]
            .iter()
            .map(|&x| usize::from(x))
            .sum();
        pages.push((at, header, at + header + body));
        at += header + body;
    }
    assert_eq!(at, b.len());
    pages
}

/// (start, end) of each FLAC frame: frame syncs (0xFFF8) where the CRC-16 of the bytes before
/// them closes the previous frame.
fn flac_frames(b: &[u8]) -> Vec<(usize, usize)> {
    // Skip "fLaC" and the metadata blocks.
    let mut at = 4;
    loop {
        let last = b[at] & 0x80 != 0;
        let len = u32::from_be_bytes([0, b[at + 1], b[at + 2], b[at + 3]]) as usize;
        at += 4 + len;
        if last {
            break;
        }
    }
    let mut frames = Vec::new();
    let mut start = at;
    for pos in start + 2..=b.len() {
        let boundary = pos == b.len() || (b[pos] == 0xFF && b[pos + 1] == 0xF8);
        if boundary
            && pos - start > 4
            && flac_crc16(&b[start..pos - 2]) == u16::from_be_bytes([b[pos - 2], b[pos - 1]])
        {
            frames.push((start, pos));
            start = pos;
        }
    }
    assert_eq!(start, b.len(), "FLAC frames do not tile the file");
    frames
}

#[test]
fn damage_behind_valid_checksums_never_panics() {
    let (cases, seed) = fuzz_cases();
    let mut rng = Rng(seed ^ 0x5555);

    let ogg = std::fs::read(fixtures().join("chirp16k.ogg")).unwrap();
    let pages = ogg_pages(&ogg);
    let path = tmp(&format!("ogg_crc_{seed}.ogg"));
    let mut tally = Tally::default();
    for _ in 0..cases {
        let mut b = ogg.clone();
        let (start, header, end) = pages[rng.below(pages.len())];
        if end > start + header {
            for _ in 0..1 + rng.below(8) {
                let at = start + header + rng.below(end - start - header);
                b[at] ^= 1 << rng.below(8);
            }
        }
        b[start + 22..start + 26].fill(0);
        let crc = ogg_crc(&b[start..end]);
        b[start + 22..start + 26].copy_from_slice(&crc.to_le_bytes());
        std::fs::write(&path, &b).unwrap();
        tally.add(&path);
    }
    tally.report(&format!(
        "chirp16k.ogg, {} pages: {cases} damaged with valid CRCs",
        pages.len()
    ));

    for file in ["chirp16k.flac", "stereo44k_24bit_0.1s.flac"] {
        let flac = std::fs::read(fixtures().join(file)).unwrap();
        let frames = flac_frames(&flac);
        let path = tmp(&format!("flac_crc_{seed}_{file}"));
        let mut tally = Tally::default();
        for _ in 0..cases {
            let mut b = flac.clone();
            let (start, end) = frames[rng.below(frames.len())];
            // Past the frame header (at most 16 bytes, with its own CRC-8), before the CRC-16.
            if end - start > 20 {
                for _ in 0..1 + rng.below(8) {
                    let at = start + 16 + rng.below(end - start - 18);
                    b[at] ^= 1 << rng.below(8);
                }
            }
            let crc = flac_crc16(&b[start..end - 2]);
            b[end - 2..end].copy_from_slice(&crc.to_be_bytes());
            std::fs::write(&path, &b).unwrap();
            tally.add(&path);
        }
        tally.report(&format!(
            "{file}, {} frames: {cases} damaged with valid CRCs",
            frames.len()
        ));
    }
}

#[test]
fn chained_ogg_decodes_each_stream() {
    // Two Ogg files back to back make a chained stream: the second begins with its own headers.
    let once = read_audio(&fixtures().join("chirp16k.ogg")).unwrap();
    let mut bytes = std::fs::read(fixtures().join("chirp16k.ogg")).unwrap();
    bytes.extend_from_within(..);
    let path = tmp("chained.ogg");
    std::fs::write(&path, &bytes).unwrap();
    let twice = read_audio(&path).unwrap();
    assert_eq!(twice.sample_rate, 16_000);
    assert_eq!(twice.samples.len(), 2 * once.samples.len());
    assert_eq!(twice.samples[..20_800], once.samples[..]);
    assert_eq!(twice.samples[20_800..], once.samples[..]);
}

#[test]
fn panics_inside_symphonia_become_errors() {
    // One flipped bit in the Vorbis setup header (page 1, CRC recomputed) that symphonia 0.6.1
    // (the version Cargo.lock holds) panics on: an assertion in the Ogg reader's codebook
    // parser, and a division by zero in the Vorbis decoder's floor setup. read_audio reports
    // them as errors about the file. Should a symphonia upgrade fix these, this test fails
    // and its expectation goes (the fuzz tests above keep counting caught panics).
    let ogg = std::fs::read(fixtures().join("chirp16k.ogg")).unwrap();
    let (start, _, end) = ogg_pages(&ogg)[1];
    for (at, bit, site) in [
        (1314, 0x01, "symphonia-format-ogg"),
        (3274, 0x04, "symphonia-codec-vorbis"),
    ] {
        let mut b = ogg.clone();
        b[at] ^= bit;
        b[start + 22..start + 26].fill(0);
        let crc = ogg_crc(&b[start..end]);
        b[start + 22..start + 26].copy_from_slice(&crc.to_le_bytes());
        let path = tmp(&format!("setup_flip_{at}.ogg"));
        std::fs::write(&path, &b).unwrap();
        let err = read_audio(&path).unwrap_err();
        let msg = err.to_string();
        println!("{msg}");
        assert!(matches!(err, AudioError::Decode { .. }), "{msg}");
        assert!(!msg.contains('\n'), "{msg}");
        assert!(msg.starts_with(&path.display().to_string()), "{msg}");
        assert!(
            msg.contains("the decoder failed on damaged data ("),
            "{msg}"
        );
        assert!(msg.contains(site), "{msg}");
        // The guard leaves the thread able to decode the next file.
        assert_eq!(
            read_audio(&fixtures().join("chirp16k.ogg"))
                .unwrap()
                .samples
                .len(),
            20_800
        );
    }
}
