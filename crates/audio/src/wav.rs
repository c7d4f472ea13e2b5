//! WAV reading: a small header probe of our own (for precise one-line errors about what a file
//! is), then hound for the samples.

use std::cell::Cell;
use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::path::Path;
use std::rc::Rc;

use crate::{Audio, AudioError};

/// Highest sample rate accepted; higher ones are almost surely a corrupt header, and would make
/// resampling filters needlessly long.
const MAX_SAMPLE_RATE: u32 = 768_000;
/// Chunks the probe walks before giving up on finding `fmt ` (hound then reports the problem).
const MAX_PROBED_CHUNKS: usize = 64;

const FORMAT_PCM: u16 = 0x0001;
const FORMAT_IEEE_FLOAT: u16 = 0x0003;
const FORMAT_EXTENSIBLE: u16 = 0xFFFE;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Int,
    Float,
}

/// What the `fmt ` chunk says, as far as the probe needs it.
struct Fmt {
    kind: Kind,
    channels: u16,
    sample_rate: u32,
    /// Significant bits per sample (the valid bits of WAVE_FORMAT_EXTENSIBLE when given).
    bits: u16,
    block_align: u16,
}

/// Reads a WAV file: PCM integer 8/16/24/32-bit (24-bit also in 4-byte containers) or IEEE
/// float 32-bit, any number of channels, averaged to mono.
///
/// Integer samples are scaled by 2^-(bits-1) (so 16-bit `v` becomes `v / 32768`), 8-bit ones
/// are unsigned with 128 as zero; channels are averaged in f64 and stored as f32.
pub fn read_wav(path: &Path) -> Result<Audio, AudioError> {
    let name = path.display().to_string();
    let io_err = |source: io::Error| AudioError::Io {
        path: name.clone(),
        source,
    };
    let mut file = File::open(path).map_err(io_err)?;
    let file_len = file.metadata().map_err(io_err)?.len();
    if file_len == 0 {
        return Err(AudioError::NotWav {
            path: name,
            reason: "empty file".into(),
        });
    }

    let fmt = probe(&mut file, &name)?;
    check_fmt(&fmt, &name)?;

    file.seek(SeekFrom::Start(0)).map_err(io_err)?;
    // hound reports running out of bytes as an io::Error of kind `Other` or `UnexpectedEof`;
    // whether the file really ended is taken from the reader itself.
    let at_eof = Rc::new(Cell::new(false));
    let source = EofFlag {
        inner: BufReader::new(file),
        at_eof: at_eof.clone(),
    };
    let mut reader =
        hound::WavReader::new(source).map_err(|e| header_error(e, &name, at_eof.get()))?;
    let spec = reader.spec();
    // hound decodes by its own reading of the header (which may differ from the probe's on a
    // file with several fmt chunks): check that one too.
    check_fmt(
        &Fmt {
            kind: match spec.sample_format {
                hound::SampleFormat::Int => Kind::Int,
                hound::SampleFormat::Float => Kind::Float,
            },
            channels: spec.channels,
            sample_rate: spec.sample_rate,
            bits: spec.bits_per_sample,
            block_align: fmt.block_align,
        },
        &name,
    )?;
    let channels = usize::from(spec.channels);
    let total = u64::from(reader.len());
    if total < channels as u64 {
        return Err(AudioError::NoSamples { path: name });
    }

    // The header's sample count is untrusted: never reserve more than the file can hold.
    let bytes_per_sample = u64::from((fmt.block_align / fmt.channels.max(1)).max(1));
    let capacity = (total.min(file_len / bytes_per_sample) / channels as u64) as usize;
    let mut mono = Vec::with_capacity(capacity);

    let mut read = 0u64;
    let mut acc = 0f64;
    let mut in_frame = 0usize;
    let mut push = |v: f64, mono: &mut Vec<f32>| {
        acc += v;
        in_frame += 1;
        if in_frame == channels {
            mono.push((acc / channels as f64) as f32);
            acc = 0.0;
            in_frame = 0;
        }
    };
    let sample_error = |e: hound::Error, read: u64| match e {
        hound::Error::IoError(_) if at_eof.get() => AudioError::Truncated {
            path: name.clone(),
            expected: total,
            got: read,
        },
        hound::Error::IoError(source) => AudioError::Io {
            path: name.clone(),
            source,
        },
        hound::Error::FormatError(reason) => AudioError::Malformed {
            path: name.clone(),
            reason: reason.into(),
        },
        other => AudioError::Malformed {
            path: name.clone(),
            reason: other.to_string(),
        },
    };
    match spec.sample_format {
        hound::SampleFormat::Int => {
            let scale = 1.0 / f64::from(1u32 << (spec.bits_per_sample - 1));
            for s in reader.samples::<i32>() {
                let v = s.map_err(|e| sample_error(e, read))?;
                read += 1;
                push(f64::from(v) * scale, &mut mono);
            }
        }
        hound::SampleFormat::Float => {
            for s in reader.samples::<f32>() {
                let v = s.map_err(|e| sample_error(e, read))?;
                read += 1;
                push(f64::from(v), &mut mono);
            }
        }
    }
    if mono.is_empty() {
        return Err(AudioError::NoSamples { path: name });
    }
    Ok(Audio {
        samples: mono,
        sample_rate: spec.sample_rate,
    })
}

/// Reads the RIFF header and walks the chunks up to `fmt `.
fn probe(file: &mut File, name: &str) -> Result<Fmt, AudioError> {
    let not_wav = |reason: &str| AudioError::NotWav {
        path: name.to_string(),
        reason: reason.to_string(),
    };
    let malformed = |reason: &str| AudioError::Malformed {
        path: name.to_string(),
        reason: reason.to_string(),
    };
    let mut riff = [0u8; 12];
    let got = read_up_to(file, &mut riff).map_err(|source| AudioError::Io {
        path: name.to_string(),
        source,
    })?;
    if got < 4 || &riff[0..4] != b"RIFF" {
        return Err(not_wav("RIFF header missing"));
    }
    if got < 12 {
        return Err(not_wav("file ends inside the RIFF header"));
    }
    if &riff[8..12] != b"WAVE" {
        return Err(not_wav("RIFF form type is not WAVE"));
    }

    for _ in 0..MAX_PROBED_CHUNKS {
        let mut header = [0u8; 8];
        let got = read_up_to(file, &mut header).map_err(|source| AudioError::Io {
            path: name.to_string(),
            source,
        })?;
        if got < 8 {
            return Err(malformed("no fmt chunk"));
        }
        let len = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
        match &header[0..4] {
            b"fmt " => {
                let mut body = [0u8; 40];
                let want = (len as usize).min(body.len());
                let got = read_up_to(file, &mut body[..want]).map_err(|source| AudioError::Io {
                    path: name.to_string(),
                    source,
                })?;
                if len < 16 {
                    return Err(malformed("fmt chunk shorter than 16 bytes"));
                }
                if got < want {
                    return Err(malformed("the file ends inside the fmt chunk"));
                }
                return parse_fmt(&body[..got], name);
            }
            b"data" => return Err(malformed("data chunk before the fmt chunk")),
            _ => {
                // Skip the chunk as hound does (no RIFF pad byte for odd lengths).
                file.seek(SeekFrom::Current(i64::from(len)))
                    .map_err(|source| AudioError::Io {
                        path: name.to_string(),
                        source,
                    })?;
            }
        }
    }
    Err(malformed("no fmt chunk among the first chunks"))
}

/// Decodes a `fmt ` chunk body (16 bytes or more, at most the first 40).
fn parse_fmt(b: &[u8], name: &str) -> Result<Fmt, AudioError> {
    let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
    let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let tag = u16_at(0);
    let channels = u16_at(2);
    let sample_rate = u32_at(4);
    let block_align = u16_at(12);
    let mut bits = u16_at(14);
    let code = if tag == FORMAT_EXTENSIBLE {
        if b.len() < 40 {
            return Err(AudioError::Malformed {
                path: name.to_string(),
                reason: "WAVE_FORMAT_EXTENSIBLE fmt chunk shorter than 40 bytes".into(),
            });
        }
        let valid_bits = u16_at(18);
        if valid_bits > 0 {
            bits = valid_bits;
        }
        // The sub-format GUID begins with the format code.
        u16_at(24)
    } else {
        tag
    };
    let kind = match code {
        FORMAT_PCM => Kind::Int,
        FORMAT_IEEE_FLOAT => Kind::Float,
        other => {
            return Err(AudioError::Unsupported {
                path: name.to_string(),
                what: format_name(other),
            })
        }
    };
    Ok(Fmt {
        kind,
        channels,
        sample_rate,
        bits,
        block_align,
    })
}

fn check_fmt(fmt: &Fmt, name: &str) -> Result<(), AudioError> {
    let unsupported = |what: String| AudioError::Unsupported {
        path: name.to_string(),
        what,
    };
    if fmt.channels == 0 {
        return Err(AudioError::Malformed {
            path: name.to_string(),
            reason: "zero channels".into(),
        });
    }
    match fmt.kind {
        Kind::Int if !matches!(fmt.bits, 8 | 16 | 24 | 32) => {
            return Err(unsupported(format!("{}-bit integer", fmt.bits)))
        }
        Kind::Float if fmt.bits != 32 => {
            return Err(unsupported(format!("{}-bit float", fmt.bits)))
        }
        _ => {}
    }
    if fmt.sample_rate == 0 {
        return Err(AudioError::Malformed {
            path: name.to_string(),
            reason: "sample rate 0".into(),
        });
    }
    if fmt.sample_rate > MAX_SAMPLE_RATE {
        return Err(unsupported(format!(
            "sample rate {} Hz (at most {MAX_SAMPLE_RATE})",
            fmt.sample_rate
        )));
    }
    Ok(())
}

fn format_name(code: u16) -> String {
    let known = match code {
        0x0002 => "ADPCM",
        0x0006 => "A-law",
        0x0007 => "mu-law",
        0x0011 => "IMA ADPCM",
        0x0050 => "MPEG",
        0x0055 => "MP3",
        _ => "",
    };
    if known.is_empty() {
        format!("format code 0x{code:04X}")
    } else {
        format!("{known} (format code 0x{code:04X})")
    }
}

/// Maps a hound error raised while reading the header.
fn header_error(e: hound::Error, name: &str, at_eof: bool) -> AudioError {
    match e {
        hound::Error::IoError(_) if at_eof => AudioError::Malformed {
            path: name.to_string(),
            reason: "the file ends inside the header".into(),
        },
        hound::Error::IoError(source) => AudioError::Io {
            path: name.to_string(),
            source,
        },
        hound::Error::Unsupported => AudioError::Unsupported {
            path: name.to_string(),
            what: "an encoding hound does not decode".into(),
        },
        hound::Error::FormatError(reason) => AudioError::Malformed {
            path: name.to_string(),
            reason: reason.into(),
        },
        other => AudioError::Malformed {
            path: name.to_string(),
            reason: other.to_string(),
        },
    }
}

/// A reader that remembers whether it has reached the end of its input.
struct EofFlag<R> {
    inner: R,
    at_eof: Rc<Cell<bool>>,
}

impl<R: Read> Read for EofFlag<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n == 0 && !buf.is_empty() {
            self.at_eof.set(true);
        }
        Ok(n)
    }
}

/// Fills `buf` as far as the reader allows; returns the bytes read (short only at end of file).
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

/// Writes mono 16-bit PCM samples as a WAV stream (`std::io::Write + Seek`: a file or an
/// in-memory cursor); `name` labels errors.
pub fn write_wav_i16<W: io::Write + Seek>(
    out: W,
    name: &str,
    samples: &[i16],
    sample_rate: u32,
) -> Result<(), AudioError> {
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let io_err = |e: hound::Error| AudioError::Io {
        path: name.to_string(),
        source: match e {
            hound::Error::IoError(e) => e,
            other => io::Error::other(other.to_string()),
        },
    };
    // A RIFF size is 32 bits: at most 2^31 - 1 bytes of 16-bit samples after the header.
    if samples.len() > (i32::MAX as usize - 64) / 2 {
        return Err(AudioError::Io {
            path: name.to_string(),
            source: io::Error::other("too many samples for one WAV file (over 2 GiB)"),
        });
    }
    let mut writer = hound::WavWriter::new(io::BufWriter::new(out), spec).map_err(io_err)?;
    let mut pcm = writer.get_i16_writer(samples.len() as u32);
    for &s in samples {
        pcm.write_sample(s);
    }
    pcm.flush().map_err(io_err)?;
    writer.finalize().map_err(io_err)
}
