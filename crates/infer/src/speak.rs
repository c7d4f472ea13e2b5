//! Text to speech with a Piper voice: the sentence loop of piper-tts 1.8.0's `PiperVoice.synthesize`
//! on top of `synaptix_models::vits`. Each sentence's phoneme ids run through the model on their
//! own; its audio is then scaled so its peak is full scale (piper's `normalize_audio`, on by
//! default), multiplied by the volume, clipped to [-1, 1] and converted to 16-bit PCM as piper
//! does (`int16(clip(x · 32767))`, truncating toward zero). Optional silence follows each
//! sentence (piper's `--sentence-silence`).

use std::time::Instant;

use synaptix_models::vits::{GaussianNoise, Scales, Synthesis, VitsVoice};

use crate::Result;

/// piper's full-scale value for 16-bit output.
const MAX_WAV_VALUE: f32 = 32767.0;
/// Below this peak a sentence is treated as silence instead of being amplified.
const SILENT_PEAK: f32 = 1e-8;

#[derive(Debug, Clone, Copy)]
pub struct SpeakOptions {
    pub scales: Scales,
    /// Seed of the Gaussian noise; the same seed, text and options give the same samples.
    pub seed: u64,
    /// Scale each sentence to full scale before the volume (piper's default).
    pub normalize: bool,
    pub volume: f32,
    /// Seconds of silence after each sentence.
    pub sentence_silence: f32,
}

/// One spoken sentence.
#[derive(Debug, Clone)]
pub struct SpokenSentence {
    /// The model's output for it (raw, before normalisation), with frames per phoneme id.
    pub synthesis: Synthesis,
    /// The 16-bit samples written for it, silence included.
    pub pcm: Vec<i16>,
    /// Seconds the model took.
    pub seconds: f64,
}

/// Piper's post-processing of one sentence's raw audio to 16-bit samples: divided by its peak
/// (when normalising), times the volume, clipped to [-1, 1], times 32767, truncated.
pub fn to_pcm(audio: &[f32], normalize: bool, volume: f32) -> Vec<i16> {
    let peak = audio.iter().fold(0f32, |m, v| m.max(v.abs()));
    if normalize && peak < SILENT_PEAK {
        return vec![0; audio.len()];
    }
    audio
        .iter()
        .map(|&v| {
            let mut x = if normalize { v / peak } else { v };
            if volume != 1.0 {
                x *= volume;
            }
            (x.clamp(-1.0, 1.0) * MAX_WAV_VALUE) as i16
        })
        .collect()
}

/// Speaks each sentence's phoneme ids in turn, handing every finished sentence to `on_sentence`
/// (streaming output) before starting the next.
pub fn speak(
    voice: &VitsVoice,
    sentences: &[Vec<i64>],
    options: &SpeakOptions,
    mut on_sentence: impl FnMut(&SpokenSentence) -> Result<()>,
) -> Result<()> {
    let mut noise = GaussianNoise::new(options.seed);
    let silence = (options.sentence_silence.max(0.0) * voice.sample_rate() as f32) as usize;
    for ids in sentences {
        let start = Instant::now();
        let synthesis = voice.synthesize(ids, options.scales, &mut noise)?;
        let seconds = start.elapsed().as_secs_f64();
        let mut pcm = to_pcm(&synthesis.audio, options.normalize, options.volume);
        pcm.resize(pcm.len() + silence, 0);
        on_sentence(&SpokenSentence {
            synthesis,
            pcm,
            seconds,
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pcm_follows_piper() {
        // Peak 0.5 → full scale; truncation toward zero; volume after normalisation; clipping.
        let audio = [0.5f32, -0.25, 0.0, 0.1];
        assert_eq!(to_pcm(&audio, true, 1.0), vec![32767, -16383, 0, 6553]);
        assert_eq!(to_pcm(&audio, false, 1.0), vec![16383, -8191, 0, 3276]);
        assert_eq!(to_pcm(&audio, false, 4.0), vec![32767, -32767, 0, 13106]);
        assert_eq!(to_pcm(&audio, true, 0.5), vec![16383, -8191, 0, 3276]);
        assert_eq!(to_pcm(&[1e-9, -1e-9], true, 1.0), vec![0, 0]);
    }
}
