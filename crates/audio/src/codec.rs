//! Compressed audio: FLAC, MP3 and Ogg Vorbis through symphonia, behind a content sniff of our
//! own that decides what a file is (WAV goes to [`read_wav`], unknown content gets a one-line
//! error naming the supported formats, never a guess from a marker found deep in the file).

use std::cell::{Cell, RefCell};
use std::fs::File;
use std::io::{self, ErrorKind, Read, Seek, SeekFrom};
use std::panic::{self, AssertUnwindSafe};
use std::path::Path;
use std::sync::Once;

use symphonia::core::codecs::audio::{AudioDecoder, AudioDecoderOptions};
use symphonia::core::errors::Error as SymError;
use symphonia::core::formats::probe::Hint;
use symphonia::core::formats::{FormatOptions, FormatReader, TrackType};
use symphonia::core::io::{
    MediaSource, MediaSourceStream, MediaSourceStreamOptions, ReadOnlySource,
};
use symphonia::core::meta::MetadataOptions;

use crate::wav::read_wav;
use crate::{Audio, AudioError};

/// Bytes sniffed at the start of the file (after any ID3v2 tags) to tell the format.
const SNIFF_LEN: usize = 4096;
/// ID3v2 tags stepped over before giving up.
const MAX_ID3_TAGS: usize = 8;
/// Most mono samples decoded per byte of file. Real encodings stay far below it (FLAC of
/// digital silence in 4096-sample blocks is about 300 samples a byte, the largest legal FLAC
/// blocks about 6,500); it bounds what a small hostile file can make us allocate.
const MAX_SAMPLES_PER_BYTE: u64 = 8192;
/// Mono samples reserved per byte of file up front (MP3 and Vorbis give 2 to 6, FLAC about 1):
/// the container's frame count is trusted only up to that.
const RESERVE_PER_BYTE: u64 = 16;
/// Consecutive demuxer errors tolerated (each one skips damaged data) before decoding stops.
const MAX_CONSECUTIVE_ERRORS: u32 = 64;

/// A compressed container this crate decodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Container {
    Flac,
    Mp3,
    Ogg,
}

impl Container {
    fn name(self) -> &'static str {
        match self {
            Container::Flac => "FLAC",
            Container::Mp3 => "MP3",
            Container::Ogg => "Ogg",
        }
    }

    fn extension(self) -> &'static str {
        match self {
            Container::Flac => "flac",
            Container::Mp3 => "mp3",
            Container::Ogg => "ogg",
        }
    }

    /// symphonia's short name of the format reader for this container.
    fn reader_name(self) -> &'static str {
        match self {
            Container::Flac => "flac",
            Container::Mp3 => "mp3",
            Container::Ogg => "ogg",
        }
    }
}

/// What the first bytes say.
enum Sniffed {
    Wav,
    Compressed(Container),
    /// Not decodable; the string says what it seems to be.
    Unknown(String),
}

/// Reads an audio file to mono f32: WAV through [`read_wav`] (its checks and messages), FLAC,
/// MP3 (MPEG-1/2/2.5 Layer III) and Ogg Vorbis through symphonia. The format is told by the
/// file's content, not its name. Channels are averaged (in f64, as `read_wav` does); integer
/// FLAC samples map to [-1, 1) exactly as `read_wav` maps PCM, so a FLAC of a WAV file reads
/// back sample for sample equal to it.
///
/// MP3 encoder delay and padding (from the LAME/Xing header) and the Vorbis stream's start and
/// end (its priming block, the last page's granule position) are trimmed as the file describes
/// them (symphonia's gapless mode, as ffmpeg does). Damaged packets are skipped, as ffmpeg
/// skips them, and a file cut short decodes up to its last whole packet (Ogg: page); a file
/// that yields no audio at all is an error. Chained Ogg streams are decoded one after the
/// other.
///
/// Errors are one line and start with the path: [`AudioError::UnknownFormat`] (naming the
/// supported formats) for anything else, [`AudioError::Decode`] for a file symphonia cannot
/// open or decode, including a panic inside symphonia on crafted data, which is caught.
pub fn read_audio(path: &Path) -> Result<Audio, AudioError> {
    let name = path.display().to_string();
    let io_err = |source: io::Error| AudioError::Io {
        path: name.clone(),
        source,
    };
    let mut file = File::open(path).map_err(io_err)?;
    let file_len = file.metadata().map_err(io_err)?.len();
    let sniffed = sniff(&mut file, file_len).map_err(io_err)?;
    let container = match sniffed {
        Sniffed::Wav => return read_wav(path),
        Sniffed::Compressed(c) => c,
        Sniffed::Unknown(what) => return Err(AudioError::UnknownFormat { path: name, what }),
    };
    // The probe starts from the top of the file so that symphonia's own metadata readers take
    // the ID3v2 tags the sniff stepped over; the reader it settles on must be the sniffed one.
    file.seek(SeekFrom::Start(0)).map_err(io_err)?;
    // symphonia still has assertions and index checks that crafted data can reach (a Vorbis
    // setup header with inconsistent codebook dimensions panics in 0.6.1, for one): a panic
    // inside it becomes an error about the file.
    guarded(|| decode(file, file_len, container, &name)).unwrap_or_else(|panic| {
        Err(AudioError::Decode {
            path: name.clone(),
            format: container.name(),
            reason: one_line(&format!("the decoder failed on damaged data ({panic})")),
        })
    })
}

thread_local! {
    /// Set while this thread runs symphonia under [`guarded`].
    static GUARDED: Cell<bool> = const { Cell::new(false) };
    /// The message and place of a panic caught under [`guarded`].
    static CAUGHT: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Runs `f`, turning a panic into `Err(message)`. The process's panic hook stays in charge of
/// every other panic; a panic on this thread inside `f` is not printed but returned.
fn guarded<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if GUARDED.with(Cell::get) {
                let place = info
                    .location()
                    .map(|l| {
                        let file = l.file();
                        let file = file.find("symphonia").map_or(file, |i| &file[i..]);
                        format!(" at {file}:{}", l.line())
                    })
                    .unwrap_or_default();
                let what = info.payload_as_str().unwrap_or("panic");
                CAUGHT.with(|c| *c.borrow_mut() = Some(format!("{what}{place}")));
            } else {
                previous(info);
            }
        }));
    });
    GUARDED.with(|g| g.set(true));
    let result = panic::catch_unwind(AssertUnwindSafe(f));
    GUARDED.with(|g| g.set(false));
    result.map_err(|payload| {
        CAUGHT.with(|c| c.borrow_mut().take()).unwrap_or_else(|| {
            payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "panic".into())
        })
    })
}

/// Decodes a sniffed FLAC, MP3 or Ogg file.
fn decode(
    file: File,
    file_len: u64,
    container: Container,
    name: &str,
) -> Result<Audio, AudioError> {
    let fail = |reason: String| AudioError::Decode {
        path: name.to_string(),
        format: container.name(),
        reason: one_line(&reason),
    };
    // Ogg is read as a stream: given a seekable source, symphonia's Ogg reader first scans the
    // last pages for the stream's length, and a file cut short or damaged near its end then
    // fails to open at all, where read front to back it decodes up to the damage. The length
    // only sizes the first allocation, and the end is trimmed by the last page's granule
    // position either way.
    let source: Box<dyn MediaSource> = match container {
        Container::Ogg => Box::new(ReadOnlySource::new(file)),
        _ => Box::new(file),
    };
    let mss = MediaSourceStream::new(source, MediaSourceStreamOptions::default());
    let mut hint = Hint::new();
    hint.with_extension(container.extension());
    let mut reader: Box<dyn FormatReader> = symphonia::default::get_probe()
        .probe(
            &hint,
            mss,
            FormatOptions::default(),
            MetadataOptions::default(),
        )
        .map_err(|e| fail(describe(&e)))?;
    let got = reader.format_info().short_name;
    if got != container.reader_name() {
        return Err(fail(format!(
            "the {} stream could not be read (symphonia found '{got}' data further on)",
            container.name()
        )));
    }

    let OpenTrack {
        id: mut track_id,
        mut decoder,
        sample_rate,
        num_frames,
    } = open_track(reader.as_ref(), container).map_err(|e| match e {
        TrackError::NoCodec(what) => AudioError::UnknownFormat {
            path: name.to_string(),
            what,
        },
        TrackError::Other(reason) => fail(reason),
    })?;

    let max_samples = file_len.saturating_mul(MAX_SAMPLES_PER_BYTE);
    let reserve = num_frames
        .unwrap_or(0)
        .min(file_len.saturating_mul(RESERVE_PER_BYTE))
        .min(max_samples);
    let mut mono: Vec<f32> = Vec::with_capacity(usize::try_from(reserve).unwrap_or(0));
    let mut planes: Vec<Vec<f64>> = Vec::new();

    // Every packet holds at least one byte of the file (Ogg's empty packets cost a lacing byte),
    // so more packets than bytes means a reader going round in circles.
    let max_packets = file_len.saturating_add(1024);
    let mut packets = 0u64;
    let mut consecutive_errors = 0u32;
    let mut last_error: Option<String> = None;
    loop {
        packets += 1;
        if packets > max_packets {
            return Err(fail("the demuxer makes no progress".into()));
        }
        let packet = match reader.next_packet() {
            Ok(Some(packet)) => packet,
            Ok(None) => break,
            // The file ends inside a packet or page: keep what decoded before it.
            Err(SymError::IoError(e)) if e.kind() == ErrorKind::UnexpectedEof => break,
            Err(SymError::DecodeError(msg)) => {
                // Damaged container data: the readers resynchronise on the next call.
                last_error = Some(format!("malformed stream: {msg}"));
                consecutive_errors += 1;
                if consecutive_errors > MAX_CONSECUTIVE_ERRORS {
                    break;
                }
                continue;
            }
            Err(SymError::ResetRequired) => {
                // A chained Ogg stream: a new logical stream begins. Carry on with its audio
                // track when it keeps the sample rate.
                let next = open_track(reader.as_ref(), container).map_err(|e| match e {
                    TrackError::NoCodec(what) | TrackError::Other(what) => {
                        fail(format!("chained stream: {what}"))
                    }
                })?;
                if next.sample_rate != sample_rate {
                    return Err(fail(format!(
                        "the sample rate changes from {sample_rate} Hz to {} Hz in a chained stream",
                        next.sample_rate
                    )));
                }
                (track_id, decoder) = (next.id, next.decoder);
                continue;
            }
            Err(e) => {
                if mono.is_empty() {
                    return Err(fail(describe(&e)));
                }
                break;
            }
        };
        consecutive_errors = 0;
        if packet.track_id != track_id {
            continue;
        }
        let buf = match decoder.decode(&packet) {
            Ok(buf) => buf,
            // A packet that does not decode is dropped, as ffmpeg drops it; the next one
            // starts afresh.
            Err(SymError::DecodeError(msg)) => {
                last_error = Some(format!("malformed stream: {msg}"));
                continue;
            }
            Err(SymError::IoError(e)) => {
                last_error = Some(format!("packet cut short: {e}"));
                continue;
            }
            Err(e) => {
                if mono.is_empty() {
                    return Err(fail(describe(&e)));
                }
                break;
            }
        };
        if buf.spec().rate() != sample_rate {
            last_error = Some(format!(
                "a packet at {} Hz in a {sample_rate} Hz stream",
                buf.spec().rate()
            ));
            continue;
        }
        let frames = buf.frames();
        let channels = buf.num_planes();
        if frames == 0 || channels == 0 {
            continue;
        }
        if (mono.len() + frames) as u64 > max_samples {
            return Err(fail(format!(
                "decodes to more than {MAX_SAMPLES_PER_BYTE} samples per byte of the file"
            )));
        }
        buf.copy_to_vecs_planar::<f64>(&mut planes);
        // Summed in channel order and divided, as read_wav averages.
        let n = channels as f64;
        mono.extend((0..frames).map(|i| (planes.iter().fold(0.0, |acc, p| acc + p[i]) / n) as f32));
    }

    if mono.is_empty() {
        if num_frames == Some(0) && last_error.is_none() {
            return Err(AudioError::NoSamples {
                path: name.to_string(),
            });
        }
        let why = match last_error {
            Some(reason) => format!(" (last error: {reason})"),
            None => String::new(),
        };
        return Err(fail(format!(
            "no audio decodes: the file is damaged or cut short{why}"
        )));
    }
    Ok(Audio {
        samples: mono,
        sample_rate,
    })
}

enum TrackError {
    /// The container holds no audio this crate decodes (e.g. Ogg Opus).
    NoCodec(String),
    Other(String),
}

/// The default audio track and a decoder for it.
struct OpenTrack {
    id: u32,
    decoder: Box<dyn AudioDecoder>,
    sample_rate: u32,
    /// The track's length in frames, when the container says.
    num_frames: Option<u64>,
}

fn open_track(reader: &dyn FormatReader, container: Container) -> Result<OpenTrack, TrackError> {
    let track = reader
        .default_track(TrackType::Audio)
        .ok_or_else(|| match container {
            Container::Ogg => TrackError::NoCodec(
                "an Ogg file without a Vorbis or FLAC stream (Opus is not supported)".into(),
            ),
            _ => TrackError::Other("no audio track".into()),
        })?;
    let params = track
        .codec_params
        .as_ref()
        .and_then(|p| p.audio())
        .ok_or_else(|| TrackError::Other("no audio codec parameters".into()))?;
    let sample_rate = params
        .sample_rate
        .filter(|&r| r > 0)
        .ok_or_else(|| TrackError::Other("no sample rate".into()))?;
    let decoder = symphonia::default::get_codecs()
        .make_audio_decoder(params, &AudioDecoderOptions::default())
        .map_err(|e| match e {
            SymError::Unsupported(_) => TrackError::NoCodec(format!(
                "{} file in an audio codec other than {}",
                container.name(),
                match container {
                    Container::Ogg => "Vorbis or FLAC",
                    _ => container.name(),
                }
            )),
            other => TrackError::Other(describe(&other)),
        })?;
    Ok(OpenTrack {
        id: track.id,
        decoder,
        sample_rate,
        num_frames: track.num_frames,
    })
}

/// symphonia's error as one line.
fn describe(e: &SymError) -> String {
    match e {
        SymError::IoError(io) if io.kind() == ErrorKind::UnexpectedEof => {
            "the file ends too early".into()
        }
        other => other.to_string(),
    }
}

/// Collapses any line breaks, so that messages stay one line.
fn one_line(s: &str) -> String {
    s.split(['\n', '\r'])
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Tells the format from the first bytes (after any ID3v2 tags, which MP3 files, and now and
/// then FLAC files, begin with).
fn sniff(file: &mut File, file_len: u64) -> io::Result<Sniffed> {
    if file_len == 0 {
        return Ok(Sniffed::Unknown("empty file".into()));
    }
    let mut head = vec![0u8; SNIFF_LEN];
    let mut offset = 0u64;
    let mut tags = 0;
    let got = loop {
        file.seek(SeekFrom::Start(offset))?;
        let got = read_up_to(file, &mut head)?;
        match id3v2_len(&head[..got]) {
            Some(len) if tags < MAX_ID3_TAGS => {
                tags += 1;
                offset += len;
                if offset >= file_len {
                    return Ok(Sniffed::Unknown("an ID3 tag without audio after it".into()));
                }
            }
            _ => break got,
        }
    };
    let b = &head[..got];
    if tags == 0 && b.starts_with(b"RIFF") {
        return Ok(Sniffed::Wav);
    }
    if b.starts_with(b"fLaC") {
        return Ok(Sniffed::Compressed(Container::Flac));
    }
    if b.starts_with(b"OggS") {
        // The first page holds the identification packet of the first logical stream.
        let first = &b[..b.len().min(128)];
        let has = |m: &[u8]| first.windows(m.len()).any(|w| w == m);
        if has(b"OpusHead") {
            return Ok(Sniffed::Unknown("Ogg Opus".into()));
        }
        if has(b"Speex   ") {
            return Ok(Sniffed::Unknown("Ogg Speex".into()));
        }
        return Ok(Sniffed::Compressed(Container::Ogg));
    }
    // MP3: a Layer III frame header chained to the next one. Right at the start a lone header
    // does, when the file ends before the next would begin (a very short or cut file); behind
    // an ID3 tag, a little junk before the first frame is tolerated as other decoders do.
    let search = if tags > 0 { b.len() } else { 1 };
    for at in 0..search.min(b.len()) {
        if let Some(frame) = mp3_frame_len(&b[at..]) {
            let next = at + frame;
            let file_ends_first = offset + (next as u64) + 4 > file_len;
            if (at == 0 && file_ends_first)
                || b.get(next..next + 4)
                    .is_some_and(|h| mp3_frame_len(h).is_some() && same_stream(&b[at..], h))
            {
                return Ok(Sniffed::Compressed(Container::Mp3));
            }
        }
    }
    Ok(Sniffed::Unknown(describe_unknown(b, tags > 0)))
}

/// Length of an ID3v2 tag (header, body and footer) at the start of `b`.
fn id3v2_len(b: &[u8]) -> Option<u64> {
    if b.len() < 10 || &b[0..3] != b"ID3" || b[3] == 0xFF || b[4] == 0xFF {
        return None;
    }
    let size = &b[6..10];
    if size.iter().any(|&x| x >= 0x80) {
        return None;
    }
    let body = size.iter().fold(0u64, |acc, &x| (acc << 7) | u64::from(x));
    let footer = if b[5] & 0x10 != 0 { 10 } else { 0 };
    Some(10 + body + footer)
}

/// The length of the MPEG audio Layer III frame whose header starts `b` (symphonia decodes
/// Layer III only; free-format bit rates it does not decode either).
fn mp3_frame_len(b: &[u8]) -> Option<usize> {
    let h = u32::from_be_bytes(b.get(0..4)?.try_into().ok()?);
    if h >> 21 != 0x7FF {
        return None;
    }
    let version = (h >> 19) & 3; // 0: MPEG-2.5, 2: MPEG-2, 3: MPEG-1
    let layer = (h >> 17) & 3; // 1: Layer III
    let bitrate_index = ((h >> 12) & 15) as usize;
    let rate_index = ((h >> 10) & 3) as usize;
    if version == 1 || layer != 1 || bitrate_index == 0 || bitrate_index == 15 || rate_index == 3 {
        return None;
    }
    const MPEG1_KBPS: [u32; 15] = [
        0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320,
    ];
    const MPEG2_KBPS: [u32; 15] = [0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160];
    const MPEG1_RATES: [u32; 3] = [44_100, 48_000, 32_000];
    let padding = (h >> 9) & 1;
    let len = if version == 3 {
        144 * 1000 * MPEG1_KBPS[bitrate_index] / MPEG1_RATES[rate_index] + padding
    } else {
        let rate = MPEG1_RATES[rate_index] / if version == 2 { 2 } else { 4 };
        72 * 1000 * MPEG2_KBPS[bitrate_index] / rate + padding
    };
    Some(len as usize)
}

/// Whether two frame headers belong to one stream (same version, layer and sample rate).
fn same_stream(a: &[u8], b: &[u8]) -> bool {
    const MASK: [u8; 3] = [0xFF, 0xFE, 0x0C];
    (0..3).all(|i| a[i] & MASK[i] == b[i] & MASK[i])
}

/// What an unsupported file seems to be, for the error message.
fn describe_unknown(b: &[u8], id3: bool) -> String {
    let at = |i: usize, m: &[u8]| b.get(i..i + m.len()) == Some(m);
    let known = if at(4, b"ftyp") {
        "an MP4/M4A file"
    } else if at(0, &[0x1A, 0x45, 0xDF, 0xA3]) {
        "a Matroska/WebM file"
    } else if at(0, b"FORM") {
        "an AIFF/IFF file"
    } else if at(0, b"RF64") || at(0, b"BW64") {
        "an RF64 file"
    } else if at(0, b"caff") {
        "a CAF file"
    } else if at(0, b"#!AMR") {
        "an AMR file"
    } else if at(0, b"MAC ") {
        "a Monkey's Audio file"
    } else if at(0, b"wvpk") {
        "a WavPack file"
    } else if b.len() >= 2 && b[0] == 0xFF && b[1] & 0xF6 == 0xF0 {
        "an AAC (ADTS) stream"
    } else if b.len() >= 4 && b[0] == 0xFF && b[1] & 0xE0 == 0xE0 {
        "MPEG audio that is not Layer III, or damaged"
    } else if id3 {
        "an ID3 tag followed by no recognised audio"
    } else if looks_like_text(b) {
        "a text file"
    } else {
        "unrecognised content"
    };
    known.to_string()
}

fn looks_like_text(b: &[u8]) -> bool {
    // Judge a prefix that may end inside a multi-byte character.
    let s = match std::str::from_utf8(b) {
        Ok(s) => s,
        Err(e) if e.error_len().is_none() => {
            std::str::from_utf8(&b[..e.valid_up_to()]).unwrap_or_default()
        }
        Err(_) => return false,
    };
    !s.is_empty()
        && s.chars()
            .all(|c| !c.is_control() || matches!(c, '\n' | '\r' | '\t' | '\u{c}'))
}

/// Fills `buf` as far as the reader allows; returns the bytes read.
fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}
