//! synaptix-audio: the audio front end for Whisper speech recognition.
//!
//! - [`read_audio`]: an audio file to mono f32, its format told by content: WAV through
//!   [`read_wav`], FLAC, MP3 and Ogg Vorbis through symphonia.
//! - [`read_wav`]: WAV files (PCM integer 8/16/24/32-bit, IEEE float 32-bit) to mono f32.
//! - [`resample`]: band-limited (Kaiser-windowed sinc) sample-rate conversion.
//! - [`load_whisper_audio`]: [`read_audio`] and [`resample`], giving 16 kHz mono samples.
//! - [`whisper_log_mel`]: the log-mel spectrogram Whisper's encoder takes. It reproduces
//!   faster-whisper 1.2.1's `FeatureExtractor(feature_size=n_mels)(waveform)` (numpy), which is
//!   OpenAI Whisper's `log_mel_spectrogram` (torch) plus 160 samples of trailing zero padding.
//!
//! Errors are [`AudioError`] values with one-line messages naming the file; malformed,
//! truncated or hostile files give an error, never a panic.

mod codec;
mod mel;
mod resample;
mod wav;

use std::path::Path;

pub use codec::read_audio;
pub use mel::{whisper_log_mel, LogMel, HOP_LENGTH, N_FFT};
pub use resample::resample;
pub use wav::{read_wav, write_wav_i16};

/// The sample rate every Whisper model expects.
pub const WHISPER_SAMPLE_RATE: u32 = 16_000;

/// Why audio could not be read or turned into features. Messages are one line; those about a
/// file start with its path.
#[derive(Debug, thiserror::Error)]
pub enum AudioError {
    /// The file could not be opened or read.
    #[error("{path}: cannot read: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The file is not a RIFF/WAVE file at all.
    #[error("{path}: not a WAV file ({reason})")]
    NotWav { path: String, reason: String },
    /// A WAV file in an encoding this crate does not decode (e.g. "12-bit integer", "ADPCM").
    #[error("{path}: unsupported WAV format: {what}")]
    Unsupported { path: String, what: String },
    /// A WAV file whose header or chunks are inconsistent.
    #[error("{path}: malformed WAV file: {reason}")]
    Malformed { path: String, reason: String },
    /// The data chunk promises more samples than the file holds.
    #[error("{path}: truncated WAV file: the data chunk promises {expected} samples, the file ends after {got}")]
    Truncated {
        path: String,
        expected: u64,
        got: u64,
    },
    /// A file in none of the formats [`read_audio`] decodes; `what` says what it seems to be
    /// ("a text file", "an MP4/M4A file", ...).
    #[error("{path}: unsupported audio format: {what} (supported: WAV, FLAC, MP3, Ogg Vorbis)")]
    UnknownFormat { path: String, what: String },
    /// A FLAC, MP3 or Ogg file that could not be decoded.
    #[error("{path}: cannot decode {format}: {reason}")]
    Decode {
        path: String,
        format: &'static str,
        reason: String,
    },
    /// A well-formed file without any sample frames.
    #[error("{path}: no samples")]
    NoSamples { path: String },
    /// `whisper_log_mel` was given no samples.
    #[error("no audio samples to compute a log-mel spectrogram of")]
    EmptyInput,
    /// `whisper_log_mel` was given a NaN or infinite sample.
    #[error("audio sample {index} is not finite ({value})")]
    NonFinite { index: usize, value: f32 },
    /// A mel band count Whisper does not use.
    #[error("unsupported number of mel bands: {0} (Whisper models use 80 or 128)")]
    MelBands(usize),
}

/// Reads an audio file ([`read_audio`]: WAV, FLAC, MP3 or Ogg Vorbis) and resamples it to
/// [`WHISPER_SAMPLE_RATE`]: the mono f32 samples Whisper's feature extractor takes.
pub fn load_whisper_audio(path: &Path) -> Result<Vec<f32>, AudioError> {
    let audio = read_audio(path)?;
    Ok(resample(
        &audio.samples,
        audio.sample_rate,
        WHISPER_SAMPLE_RATE,
    ))
}

/// Mono audio.
#[derive(Debug, Clone, PartialEq)]
pub struct Audio {
    /// One value per sample frame (channels averaged). Integer PCM and FLAC map to [-1, 1);
    /// float WAV data and MP3/Vorbis decoder output are passed through (normally within
    /// [-1, 1]).
    pub samples: Vec<f32>,
    /// Samples per second.
    pub sample_rate: u32,
}
