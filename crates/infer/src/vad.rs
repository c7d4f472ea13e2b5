//! Voice activity detection for transcription, as faster-whisper 1.2.1's `vad_filter=True` does
//! it: [`speech_chunks`] turns Silero VAD's per-chunk speech probabilities into speech chunks
//! (`get_speech_timestamps` with its default options), [`collect_chunks`] keeps only their audio,
//! and after transcription [`TimestampMap::restore`] maps the segment and word times back onto
//! the original audio (`restore_speech_timestamps`).

use crate::transcribe::Segment;

/// Samples per VAD chunk (32 ms at 16 kHz).
const WINDOW: usize = 512;
const SAMPLE_RATE: f64 = 16_000.0;

/// faster-whisper's `VadOptions` (its defaults by [`Default`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VadOptions {
    /// Speech from this probability on.
    pub threshold: f32,
    /// Silence below this (`None`: `max(threshold - 0.15, 0.01)`).
    pub neg_threshold: Option<f32>,
    /// Speech chunks no longer than this are dropped.
    pub min_speech_duration_ms: f64,
    /// Longer chunks are split (at a pause of 98 ms or more if there is one).
    pub max_speech_duration_s: f64,
    /// The silence that ends a chunk.
    pub min_silence_duration_ms: f64,
    /// Padding added on both sides of each chunk.
    pub speech_pad_ms: f64,
}

impl Default for VadOptions {
    fn default() -> Self {
        VadOptions {
            threshold: 0.5,
            neg_threshold: None,
            min_speech_duration_ms: 0.0,
            max_speech_duration_s: f64::INFINITY,
            min_silence_duration_ms: 2000.0,
            speech_pad_ms: 400.0,
        }
    }
}

/// A stretch of speech, in samples of the original audio: `[start, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpeechChunk {
    pub start: usize,
    pub end: usize,
}

/// faster-whisper's `get_speech_timestamps` over the probabilities of the `samples`-long audio's
/// 512-sample chunks.
pub fn speech_chunks(probs: &[f32], samples: usize, o: &VadOptions) -> Vec<SpeechChunk> {
    let window = WINDOW as f64;
    let min_speech = SAMPLE_RATE * o.min_speech_duration_ms / 1000.0;
    let pad = SAMPLE_RATE * o.speech_pad_ms / 1000.0;
    let max_speech = SAMPLE_RATE * o.max_speech_duration_s - window - 2.0 * pad;
    let min_silence = SAMPLE_RATE * o.min_silence_duration_ms / 1000.0;
    let min_silence_at_max = SAMPLE_RATE * 98.0 / 1000.0;
    let neg = o.neg_threshold.unwrap_or((o.threshold - 0.15).max(0.01));

    let mut triggered = false;
    let mut speeches: Vec<(i64, i64)> = Vec::new();
    let mut current: Option<i64> = None;
    let (mut temp_end, mut prev_end, mut next_start) = (0i64, 0i64, 0i64);
    for (i, &p) in probs.iter().enumerate() {
        let at = (WINDOW * i) as i64;
        if p >= o.threshold && temp_end != 0 {
            temp_end = 0;
            if next_start < prev_end {
                next_start = at;
            }
        }
        if p >= o.threshold && !triggered {
            triggered = true;
            current = Some(at);
            continue;
        }
        if let (true, Some(start)) = (triggered, current) {
            if (at - start) as f64 > max_speech {
                if prev_end != 0 {
                    speeches.push((start, prev_end));
                    current = None;
                    if next_start < prev_end {
                        triggered = false;
                    } else {
                        current = Some(next_start);
                    }
                    prev_end = 0;
                    next_start = 0;
                    temp_end = 0;
                } else {
                    speeches.push((start, at));
                    current = None;
                    prev_end = 0;
                    next_start = 0;
                    temp_end = 0;
                    triggered = false;
                    continue;
                }
            }
        }
        if p < neg && triggered {
            if temp_end == 0 {
                temp_end = at;
            }
            if (at - temp_end) as f64 > min_silence_at_max {
                prev_end = temp_end;
            }
            if ((at - temp_end) as f64) < min_silence {
                continue;
            }
            if let Some(start) = current {
                if (temp_end - start) as f64 > min_speech {
                    speeches.push((start, temp_end));
                }
            }
            current = None;
            prev_end = 0;
            next_start = 0;
            temp_end = 0;
            triggered = false;
        }
    }
    let total = samples as i64;
    if let Some(start) = current {
        if (total - start) as f64 > min_speech {
            speeches.push((start, total));
        }
    }
    // Padding: half the gap when two chunks are closer than twice the padding.
    let n = speeches.len();
    for i in 0..n {
        if i == 0 {
            speeches[0].0 = (speeches[0].0 as f64 - pad).max(0.0) as i64;
        }
        if i + 1 < n {
            let silence = speeches[i + 1].0 - speeches[i].1;
            if (silence as f64) < 2.0 * pad {
                speeches[i].1 += silence.div_euclid(2);
                speeches[i + 1].0 = (speeches[i + 1].0 - silence.div_euclid(2)).max(0);
            } else {
                speeches[i].1 = (total as f64).min(speeches[i].1 as f64 + pad) as i64;
                speeches[i + 1].0 = (speeches[i + 1].0 as f64 - pad).max(0.0) as i64;
            }
        } else {
            speeches[i].1 = (total as f64).min(speeches[i].1 as f64 + pad) as i64;
        }
    }
    speeches
        .into_iter()
        .map(|(s, e)| SpeechChunk {
            start: s.max(0) as usize,
            end: e.max(0) as usize,
        })
        .collect()
}

/// The audio of the chunks, concatenated (faster-whisper's `collect_chunks` without a maximum
/// duration).
pub fn collect_chunks(audio: &[f32], chunks: &[SpeechChunk]) -> Vec<f32> {
    let mut out = Vec::new();
    for c in chunks {
        out.extend_from_slice(&audio[c.start.min(audio.len())..c.end.min(audio.len())]);
    }
    out
}

/// faster-whisper's `SpeechTimestampsMap`: times in the collected audio back to the original.
#[derive(Debug, Clone, PartialEq)]
pub struct TimestampMap {
    /// Each chunk's end in the collected audio (samples).
    chunk_end_sample: Vec<i64>,
    /// Seconds of silence removed before each chunk.
    total_silence_before: Vec<f64>,
}

/// Python's `round(x, 2)`.
fn round2(x: f64) -> f64 {
    format!("{x:.2}").parse().unwrap_or(x)
}

impl TimestampMap {
    pub fn new(chunks: &[SpeechChunk]) -> TimestampMap {
        let (mut previous_end, mut silent) = (0i64, 0i64);
        let mut map = TimestampMap {
            chunk_end_sample: Vec::new(),
            total_silence_before: Vec::new(),
        };
        for c in chunks {
            silent += c.start as i64 - previous_end;
            previous_end = c.end as i64;
            map.chunk_end_sample.push(c.end as i64 - silent);
            map.total_silence_before.push(silent as f64 / SAMPLE_RATE);
        }
        map
    }

    fn chunk_index(&self, time: f64, is_end: bool) -> usize {
        let sample = (time * SAMPLE_RATE) as i64;
        if is_end {
            if let Some(i) = self.chunk_end_sample.iter().position(|&e| e == sample) {
                return i;
            }
        }
        let after = self.chunk_end_sample.partition_point(|&e| e <= sample);
        after.min(self.chunk_end_sample.len().saturating_sub(1))
    }

    fn original(&self, time: f64, chunk: usize) -> f64 {
        round2(self.total_silence_before.get(chunk).copied().unwrap_or(0.0) + time)
    }

    /// `restore_speech_timestamps`: each segment's times (or, with words, each word's, by the
    /// chunk of its middle, and the segment's from its first and last word) in the original
    /// audio.
    pub fn restore(&self, segments: &mut [Segment]) {
        if self.chunk_end_sample.is_empty() {
            return;
        }
        for s in segments {
            if s.words.is_empty() {
                s.start = self.original(s.start, self.chunk_index(s.start, false));
                s.end = self.original(s.end, self.chunk_index(s.end, true));
                continue;
            }
            for w in &mut s.words {
                let chunk = self.chunk_index((w.start + w.end) / 2.0, false);
                w.start = self.original(w.start, chunk);
                w.end = self.original(w.end, chunk);
            }
            if let (Some(first), Some(last)) = (s.words.first(), s.words.last()) {
                s.start = first.start;
                s.end = last.end;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_padded_and_merged() {
        // Speech in chunks 10-19 and 30-39 (the gap of 10 chunks = 5120 samples is under twice
        // the 6400-sample padding, so they share it), then silence to the end.
        let mut probs = vec![0.0f32; 200];
        probs[10..20].fill(0.9);
        probs[30..40].fill(0.9);
        let o = VadOptions {
            min_silence_duration_ms: 100.0,
            ..VadOptions::default()
        };
        let chunks = speech_chunks(&probs, 200 * 512, &o);
        assert_eq!(
            chunks,
            vec![
                SpeechChunk {
                    start: 0,
                    end: 20 * 512 + 2560
                },
                SpeechChunk {
                    start: 30 * 512 - 2560,
                    end: 40 * 512 + 6400
                }
            ]
        );
        let map = TimestampMap::new(&chunks);
        // The chunks touch (no silence removed): ends at 12800 and 12800 + 14080.
        assert_eq!(map.chunk_end_sample, vec![12800, 26880]);
        assert_eq!(map.original(1.0, map.chunk_index(1.0, false)), 1.0);
        // 0.8 s of collected audio ends chunk 0 exactly: as an end it stays in chunk 0.
        assert_eq!(map.chunk_index(0.8, true), 0);
        assert_eq!(map.chunk_index(0.8, false), 1);
    }
}
