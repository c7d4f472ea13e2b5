//! Speech to text with Whisper: decoding on top of the model of `synaptix_models::whisper`.
//!
//! [`generate`] decodes one encoded window as CTranslate2's `Whisper.generate` does for
//! faster-whisper: greedy or beam search (patience 1, length penalty 1, one hypothesis),
//! faster-whisper's suppressed tokens, and with timestamp tokens CTranslate2's timestamp rules,
//! applied to each beam's own history. [`transcribe`] runs faster-whisper 1.2.1's
//! `generate_segments` over a whole recording at temperature 0: windows of 30 seconds, segments
//! split at timestamp pairs, each window starting where the last one's complete segments end,
//! silent windows skipped, and the previous text fed back as a prompt.

use std::time::Instant;

use synaptix_models::whisper::{
    DecoderCache, EncodedAudio, Whisper, WhisperTokens, MAX_TEXT_POSITIONS, WINDOW_FRAMES,
};
use synaptix_models::ModelError;
use synaptix_sample::SplitMix64;

use crate::words::{add_word_timestamps, last_end, TimedPiece, Window, Word};

use crate::{InferError, Result};

/// Seconds per mel frame (hop 160 at 16 kHz).
pub const TIME_PER_FRAME: f64 = 0.01;
/// Mel frames per second.
const FRAMES_PER_SECOND: f64 = 100.0;
/// Seconds per timestamp token.
pub const TIME_PRECISION: f64 = 0.02;
/// Mel frames per timestamp step (the encoder's second convolution has stride 2).
const INPUT_STRIDE: usize = 2;
/// faster-whisper's `max_length // 2 - 1`: the most previous-text tokens a prompt carries.
pub const MAX_PREVIOUS_TOKENS: usize = MAX_TEXT_POSITIONS / 2 - 1;

fn invalid(problem: impl Into<String>) -> InferError {
    ModelError::BadHyperParameters {
        path: "whisper".into(),
        problem: problem.into(),
    }
    .into()
}

/// How [`generate`] searches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SearchOptions {
    /// Hypotheses kept at each step; 1 is greedy decoding.
    pub beam_size: usize,
    /// With timestamps: the first timestamp is at most this many 0.02 s steps into the window
    /// (faster-whisper passes 50, one second).
    pub max_initial_timestamp_index: usize,
}

/// The hypothesis [`generate`] keeps for a window.
#[derive(Debug, Clone, PartialEq)]
pub struct Hypothesis {
    /// The generated tokens, end-of-text excluded.
    pub tokens: Vec<u32>,
    /// The sum of the tokens' log-probabilities, end-of-text's included (CTranslate2's score
    /// before the length normalization).
    pub sum_logprob: f64,
    /// The probability of `<|nospeech|>` right after start-of-transcript.
    pub no_speech_prob: f32,
}

impl Hypothesis {
    /// faster-whisper's `avg_logprob`: the sum over the tokens plus one (for end-of-text).
    pub fn avg_logprob(&self) -> f64 {
        self.sum_logprob / (self.tokens.len() + 1) as f64
    }
}

/// The tokens a step may not produce, as CTranslate2's logits processors for Whisper disable
/// them: faster-whisper's suppressed tokens at every step, the blank and end-of-text at the
/// first, and with timestamps the timestamp rules.
struct Rules<'a> {
    tokens: &'a WhisperTokens,
    timestamps: bool,
    /// The last timestamp id allowed first.
    max_initial: usize,
}

impl Rules<'_> {
    /// Sets the disabled logits of a hypothesis with `history` (its generated tokens) to -∞.
    ///
    /// The timestamp rules: `<|notimestamps|>` never; the first token is a timestamp no later
    /// than `max_initial`; timestamps come in pairs, except right before end-of-text (after a
    /// timestamp that followed text only a timestamp or end-of-text; after two timestamps in a
    /// row, or after the first one, no timestamp); timestamps never decrease; and when text may
    /// come but the timestamps' total probability exceeds the most likely text token's
    /// (log-sum-exp of the timestamps' logits against the largest text logit, the same
    /// comparison as on log-softmax values), text is disabled.
    fn apply(&self, logits: &mut [f32], history: &[u32]) {
        let off = |l: &mut [f32]| l.iter_mut().for_each(|v| *v = f32::NEG_INFINITY);
        let t = self.tokens;
        let begin: &[u32] = if history.is_empty() {
            &t.suppress_begin
        } else {
            &[]
        };
        for &id in t.suppress.iter().chain(begin) {
            if let Some(l) = logits.get_mut(id as usize) {
                *l = f32::NEG_INFINITY;
            }
        }
        if !self.timestamps {
            return;
        }
        let (ts_begin, eot) = (t.timestamp_begin as usize, t.eot as usize);
        logits[t.no_timestamps as usize] = f32::NEG_INFINITY;
        let Some(&last) = history.last() else {
            off(&mut logits[..ts_begin]);
            if self.max_initial + 1 < logits.len() {
                off(&mut logits[self.max_initial + 1..]);
            }
            return;
        };
        let mut weigh_timestamps = true;
        if last as usize >= ts_begin {
            let penultimate = match history.len() {
                1 => last,
                n => history[n - 2],
            };
            if penultimate as usize >= ts_begin {
                off(&mut logits[ts_begin..]);
                weigh_timestamps = false;
            } else {
                off(&mut logits[..eot]);
            }
        }
        if let Some(&ts) = history.iter().rev().find(|&&t| t as usize >= ts_begin) {
            off(&mut logits[ts_begin..ts as usize]);
        }
        if weigh_timestamps {
            let text_max = logits[..ts_begin]
                .iter()
                .fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            if log_sum_exp(&logits[ts_begin..]) > text_max as f64 {
                off(&mut logits[..ts_begin]);
            }
        }
    }
}

/// What every search starts from: the prompt run through the decoder.
struct Start<'a> {
    rules: Rules<'a>,
    /// The decoder cache after the prompt, and the logits of its last position.
    cache: DecoderCache,
    logits: Vec<f32>,
    /// The probability of `<|nospeech|>` right after start-of-transcript.
    no_speech_prob: f32,
    /// CTranslate2's `max_length` for faster-whisper's 448: `min(224, 449 - prompt length)`.
    max_steps: usize,
}

/// Runs `prompt` through the decoder (to start-of-transcript first, for the no-speech
/// probability) and sets up the rules for what follows it.
fn start<'a>(
    model: &Whisper,
    audio: &EncodedAudio,
    prompt: &[u32],
    tokens: &'a WhisperTokens,
    options: &SearchOptions,
) -> Result<Start<'a>> {
    let vocab = model.dims().vocab;
    let (ts_begin, eot) = (tokens.timestamp_begin as usize, tokens.eot);
    if eot as usize >= ts_begin || ts_begin >= vocab {
        return Err(invalid(format!(
            "end-of-text {eot} and the first timestamp {ts_begin} do not fit a vocabulary of {vocab}"
        )));
    }
    let sot_at = prompt
        .iter()
        .position(|&t| t == tokens.sot)
        .ok_or_else(|| invalid("the prompt has no <|startoftranscript|>"))?;
    let rules = Rules {
        tokens,
        timestamps: prompt.last() != Some(&tokens.no_timestamps),
        max_initial: ts_begin.saturating_add(options.max_initial_timestamp_index),
    };
    let mut cache = model.new_cache();
    let at_sot = model.decode(audio, &mut cache, &prompt[..=sot_at])?;
    let no_speech_prob = match tokens.no_speech {
        Some(id) if (id as usize) < vocab => {
            (at_sot[id as usize] as f64 - log_sum_exp(&at_sot)).exp() as f32
        }
        _ => 0.0,
    };
    let logits = if sot_at + 1 < prompt.len() {
        model.decode(audio, &mut cache, &prompt[sot_at + 1..])?
    } else {
        at_sot
    };
    Ok(Start {
        rules,
        cache,
        logits,
        no_speech_prob,
        max_steps: (MAX_TEXT_POSITIONS / 2)
            .min((MAX_TEXT_POSITIONS + 1).saturating_sub(prompt.len())),
    })
}

/// Decodes one encoded window after `prompt` as CTranslate2's `Whisper.generate` with
/// faster-whisper's options: `[<|startofprev|>, previous text...,] <|startoftranscript|>,
/// language, task[, <|notimestamps|>]`; timestamp tokens unless the prompt ends in
/// `<|notimestamps|>`.
///
/// The prompt runs through the decoder first; the no-speech probability is the softmax of
/// `<|nospeech|>` at start-of-transcript (before any suppression). Each step then disables
/// tokens for each hypothesis by its own history (the suppressed tokens, and the timestamp
/// rules), takes log-softmax and adds the hypothesis' score.
///
/// Greedy decoding (`beam_size` 1) keeps the best token (lowest id on ties) until end-of-text.
/// A beam of `k` keeps the `2k` best continuations over all hypotheses (one at the first step,
/// from the prompt); of the first `k`, each end-of-text finishes a hypothesis (its score the
/// sum of its log-probabilities) and its place goes to the next candidate past the `k`-th that
/// is not end-of-text. The search ends once `k` hypotheses have finished, or after
/// `min(224, 449 - prompt length)` steps (CTranslate2's `max_length` for faster-whisper's 448),
/// where every hypothesis left finishes; the kept one has the highest score divided by its
/// length. Hypotheses carry their own self-attention cache (copied where they branch); the
/// cross-attention keys and values are shared.
///
/// `on_token` sees the kept hypothesis' tokens: as they are chosen with greedy decoding, when
/// the search ends with a beam.
pub fn generate(
    model: &Whisper,
    audio: &EncodedAudio,
    prompt: &[u32],
    tokens: &WhisperTokens,
    options: &SearchOptions,
    on_token: &mut dyn FnMut(u32),
) -> Result<Hypothesis> {
    let beam_size = options.beam_size;
    if beam_size == 0 {
        return Err(invalid("the beam size must be at least 1"));
    }
    let vocab = model.dims().vocab;
    let eot = tokens.eot;
    let Start {
        rules,
        cache,
        mut logits,
        no_speech_prob,
        max_steps,
    } = start(model, audio, prompt, tokens, options)?;
    // The live hypotheses: tokens, summed log-probability, decoder cache.
    let mut history: Vec<Vec<u32>> = vec![Vec::new()];
    let mut scores: Vec<f32> = vec![0.0];
    let mut caches: Vec<DecoderCache> = vec![cache];
    let mut finished: Vec<(Vec<u32>, f32)> = Vec::new();
    // Greedy decoding streams its tokens as they are chosen.
    let mut streamed = 0;
    for step in 0..max_steps {
        let last_step = step + 1 == max_steps;
        for ((row, past), &score) in logits.chunks_exact_mut(vocab).zip(&history).zip(&scores) {
            rules.apply(row, past);
            let lse = log_sum_exp(row);
            row.iter_mut()
                .for_each(|v| *v = score + (*v as f64 - lse) as f32);
        }
        let top = top_k(&logits, 2 * beam_size);
        let id_of = |c: (usize, f32)| (c.0 % vocab) as u32;
        // Which candidates carry on: the first `beam_size`, finished ones replaced.
        let mut kept = Vec::with_capacity(beam_size);
        let mut spare = beam_size;
        for (k, &candidate) in top.iter().enumerate().take(beam_size) {
            let mut next = k;
            if id_of(candidate) == eot || last_step {
                let mut done = history[candidate.0 / vocab].clone();
                if id_of(candidate) != eot {
                    done.push(id_of(candidate));
                }
                finished.push((done, candidate.1));
                if let Some(j) = (spare..top.len()).find(|&j| id_of(top[j]) != eot) {
                    next = j;
                    spare = j + 1;
                }
            }
            kept.push(top[next]);
        }
        if last_step || finished.len() >= beam_size {
            break;
        }
        // The kept candidates' hypotheses: a cache moves to its last user, others copy it.
        let mut users = vec![0usize; caches.len()];
        kept.iter().for_each(|c| users[c.0 / vocab] += 1);
        let mut old_caches: Vec<Option<DecoderCache>> = caches.drain(..).map(Some).collect();
        let old_history = std::mem::take(&mut history);
        scores.clear();
        for &candidate in &kept {
            let origin = candidate.0 / vocab;
            users[origin] -= 1;
            let cache = if users[origin] == 0 {
                old_caches[origin].take()
            } else {
                old_caches[origin].clone()
            };
            caches.push(cache.expect("a cache for each kept hypothesis"));
            let mut past = old_history[origin].clone();
            past.push(id_of(candidate));
            history.push(past);
            scores.push(candidate.1);
        }
        if beam_size == 1 {
            on_token(id_of(kept[0]));
            streamed += 1;
        }
        let last: Vec<u32> = history.iter().map(|h| h[h.len() - 1]).collect();
        logits = model.decode_step(audio, &mut caches, &last)?;
    }
    // The highest score over the length (CTranslate2's length penalty 1); the first on ties.
    let normalized = |(t, s): &(Vec<u32>, f32)| s / t.len() as f32;
    let best = finished
        .iter()
        .enumerate()
        .fold(None::<usize>, |best, (i, h)| match best {
            Some(b) if normalized(&finished[b]) >= normalized(h) => Some(b),
            _ => Some(i),
        })
        .ok_or_else(|| invalid("the prompt leaves no room for a token"))?;
    let (tokens_out, score) = finished.swap_remove(best);
    tokens_out[streamed.min(tokens_out.len())..]
        .iter()
        .for_each(|&t| on_token(t));
    Ok(Hypothesis {
        tokens: tokens_out,
        sum_logprob: score as f64,
        no_speech_prob,
    })
}

/// How [`sample`] draws: the temperature (above 0) and the hypotheses drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    pub temperature: f32,
    pub best_of: usize,
}

/// Decodes one encoded window after `prompt` by random sampling, as faster-whisper asks
/// CTranslate2 to at a temperature above 0 (`beam_size=1`, `num_hypotheses=best_of`,
/// `sampling_topk=0`): `best_of` hypotheses drawn independently, each step applying the rules
/// of [`generate`], taking log-softmax, and drawing a token from the whole vocabulary with
/// probabilities proportional to `exp(log-probability / temperature)`. A hypothesis' score sums
/// its tokens' log-probabilities before the temperature (end-of-text's included); the kept one
/// has the highest score over its length (the first on ties). The draws come from `rng`, so
/// they are synaptix's own, reproducible by seed, not CTranslate2's.
pub fn sample(
    model: &Whisper,
    audio: &EncodedAudio,
    prompt: &[u32],
    tokens: &WhisperTokens,
    options: &SearchOptions,
    sampling: Sampling,
    rng: &mut SplitMix64,
) -> Result<Hypothesis> {
    let Sampling {
        temperature,
        best_of,
    } = sampling;
    if temperature.is_nan() || temperature <= 0.0 || best_of == 0 {
        return Err(invalid(format!(
            "sampling needs a temperature above 0 and at least one hypothesis (got {temperature}, {best_of})"
        )));
    }
    let vocab = model.dims().vocab;
    let eot = tokens.eot;
    let Start {
        rules,
        cache,
        logits,
        no_speech_prob,
        max_steps,
    } = start(model, audio, prompt, tokens, options)?;
    // Every hypothesis starts from the prompt's logits; `live` indexes the unfinished ones.
    let mut history: Vec<Vec<u32>> = vec![Vec::new(); best_of];
    let mut scores = vec![0f64; best_of];
    let mut done = vec![false; best_of];
    let mut caches: Vec<Option<DecoderCache>> = vec![Some(cache); best_of];
    let mut live: Vec<usize> = (0..best_of).collect();
    let mut rows: Vec<f32> = logits.repeat(best_of);
    let inv_t = 1.0 / temperature as f64;
    let mut weights = vec![0f64; vocab];
    for step in 0..max_steps {
        let mut next_live = Vec::with_capacity(live.len());
        let mut last = Vec::with_capacity(live.len());
        for (row, &h) in rows.chunks_exact_mut(vocab).zip(&live) {
            rules.apply(row, &history[h]);
            let lse = log_sum_exp(row);
            let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
            let mut total = 0.0;
            for (w, &v) in weights.iter_mut().zip(row.iter()) {
                *w = ((v as f64 - max) * inv_t).exp();
                total += *w;
            }
            let target = rng.next_f64() * total;
            let mut acc = 0.0;
            let mut token = None;
            for (j, &w) in weights.iter().enumerate() {
                if w > 0.0 {
                    acc += w;
                    token = Some(j);
                    if acc > target {
                        break;
                    }
                }
            }
            let token = token.ok_or_else(|| invalid("every token is disabled"))?;
            scores[h] += row[token] as f64 - lse;
            if token as u32 == eot || step + 1 == max_steps {
                if token as u32 != eot {
                    history[h].push(token as u32);
                }
                done[h] = true;
            } else {
                history[h].push(token as u32);
                next_live.push(h);
                last.push(token as u32);
            }
        }
        if next_live.is_empty() {
            break;
        }
        // The caches of the hypotheses still running, in `next_live` order.
        let mut step_caches: Vec<DecoderCache> =
            next_live.iter().filter_map(|&h| caches[h].take()).collect();
        rows = model.decode_step(audio, &mut step_caches, &last)?;
        for (&h, c) in next_live.iter().zip(step_caches) {
            caches[h] = Some(c);
        }
        live = next_live;
    }
    debug_assert!(done.iter().all(|&d| d));
    let normalized = |h: usize| scores[h] / history[h].len().max(1) as f64;
    let best = (0..best_of).fold(0, |b, h| if normalized(h) > normalized(b) { h } else { b });
    Ok(Hypothesis {
        tokens: std::mem::take(&mut history[best]),
        sum_logprob: scores[best],
        no_speech_prob,
    })
}

/// The `k` best of `scores` as (index, score), best first; lower index first on ties.
fn top_k(scores: &[f32], k: usize) -> Vec<(usize, f32)> {
    let mut top: Vec<(usize, f32)> = Vec::with_capacity(k + 1);
    for (i, &s) in scores.iter().enumerate() {
        if top.len() == k && top.last().is_none_or(|&(_, worst)| s <= worst) {
            continue;
        }
        let at = top.partition_point(|&(_, t)| t >= s);
        top.insert(at, (i, s));
        top.truncate(k);
    }
    top
}

/// `ln Σ exp(x)` in f64; `-inf` when every value is `-inf`.
fn log_sum_exp(x: &[f32]) -> f64 {
    let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    if max == f32::NEG_INFINITY {
        return f64::NEG_INFINITY;
    }
    let max = max as f64;
    max + x.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln()
}

/// How [`transcribe`] decodes.
#[derive(Debug, Clone, PartialEq)]
pub struct TranscribeOptions {
    /// `<|transcribe|>` or `<|translate|>`.
    pub task: u32,
    /// The language token; `None` detects it on the first window.
    pub language: Option<u32>,
    /// Timestamp tokens, segments and faster-whisper's seeking; `false` decodes consecutive
    /// 30-second windows with `<|notimestamps|>`.
    pub timestamps: bool,
    /// Hypotheses kept at each step (1: greedy decoding).
    pub beam_size: usize,
    /// The prompt of each window carries the text of the segments before it.
    pub condition_on_previous_text: bool,
    /// A window more likely than this to hold no speech ...
    pub no_speech_threshold: Option<f64>,
    /// ... whose average log-probability is not above this is skipped as silence.
    pub log_prob_threshold: Option<f64>,
    /// Seconds: the first timestamp of a window is no later.
    pub max_initial_timestamp: f64,
    /// Times each word from the cross-attention of the model's alignment heads
    /// ([`crate::words`]); segment times and seeking follow the words, as faster-whisper's
    /// `word_timestamps=True`. Needs timestamps.
    pub word_timestamps: bool,
    /// faster-whisper's `initial_prompt` as tokens (the text's, after a space): fed back before
    /// the first window as if it had been transcribed before it (and, without conditioning on
    /// previous text, before the first window only).
    pub initial_prompt: Vec<u32>,
    /// faster-whisper's temperature fallback: a window is decoded at each of these in turn
    /// until one result passes the thresholds below (0: the beam search, above 0: `best_of`
    /// sampled hypotheses); `[0.0]` (the default here) never falls back.
    pub temperatures: Vec<f32>,
    /// Hypotheses sampled at each temperature above 0.
    pub best_of: usize,
    /// A result whose text's compression ratio (UTF-8 bytes over zlib bytes) exceeds this
    /// falls back (repetition loops compress well).
    pub compression_ratio_threshold: Option<f64>,
    /// A window decoded at a temperature above this no longer carries the earlier text into the
    /// next window's prompt.
    pub prompt_reset_on_temperature: f32,
    /// The seed of the sampling draws.
    pub seed: u64,
}

impl TranscribeOptions {
    /// faster-whisper's defaults, at temperature 0 alone (no fallback unless `temperatures` is
    /// set, e.g. to [`TranscribeOptions::FALLBACK_TEMPERATURES`]): timestamps, beam 5,
    /// conditioning on the previous text, no-speech threshold 0.6, log-probability threshold
    /// -1.0, compression ratio threshold 2.4, best of 5, prompt reset above 0.5, first
    /// timestamp within 1 s.
    pub fn new(task: u32, language: Option<u32>) -> TranscribeOptions {
        TranscribeOptions {
            task,
            language,
            timestamps: true,
            beam_size: 5,
            condition_on_previous_text: true,
            no_speech_threshold: Some(0.6),
            log_prob_threshold: Some(-1.0),
            max_initial_timestamp: 1.0,
            word_timestamps: false,
            initial_prompt: Vec::new(),
            temperatures: vec![0.0],
            best_of: 5,
            compression_ratio_threshold: Some(2.4),
            prompt_reset_on_temperature: 0.5,
            seed: 0,
        }
    }

    /// faster-whisper's fallback temperatures: 0, 0.2, 0.4, 0.6, 0.8, 1.
    pub const FALLBACK_TEMPERATURES: [f32; 6] = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0];
}

/// A stretch of transcribed speech.
#[derive(Debug, Clone, PartialEq)]
pub struct Segment {
    /// The frame its window started at.
    pub seek: usize,
    /// Seconds from the start of the audio.
    pub start: f64,
    pub end: f64,
    /// Its tokens, timestamps included (with timestamps they open and, but for a window's
    /// unfinished last segment, close it).
    pub tokens: Vec<u32>,
    /// The text of its text tokens.
    pub text: String,
    /// Its window's average log-probability and no-speech probability.
    pub avg_logprob: f64,
    pub no_speech_prob: f32,
    /// The temperature its window's result was decoded at (the last one tried when every
    /// result failed the thresholds), and that result's compression ratio.
    pub temperature: f32,
    pub compression_ratio: f64,
    /// Its words, with word timestamps (else empty).
    pub words: Vec<Word>,
}

/// What [`transcribe`] reports as it goes.
#[derive(Debug)]
pub enum TranscribeEvent<'a> {
    /// The language detected on the first window.
    Language { code: &'a str, probability: f32 },
    /// A generated token (timestamps included); see [`generate`] for when.
    Token(u32),
    /// A final segment.
    Segment(&'a Segment),
}

/// The result of [`transcribe`].
#[derive(Debug, Clone, PartialEq)]
pub struct Transcription {
    /// The detected language and its probability (`None` when given).
    pub language: Option<(String, f32)>,
    pub segments: Vec<Segment>,
    /// Windows decoded, and those of them skipped as silence.
    pub windows: usize,
    pub skipped: usize,
    /// Seconds in the encoder, and in language detection and decoding.
    pub encode_s: f64,
    pub decode_s: f64,
}

/// faster-whisper's `get_compression_ratio`: the text's UTF-8 bytes over the size zlib
/// (`zlib.compress`'s level 6, the system zlib's deflate) compresses them to.
pub fn compression_ratio(text: &str) -> f64 {
    use std::io::Write;
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::new(6));
    // Writing into a Vec cannot fail.
    let _ = z.write_all(text.as_bytes());
    let compressed = z.finish().map(|v| v.len()).unwrap_or(1).max(1);
    text.len() as f64 / compressed as f64
}

/// One window's kept result and how it was decoded.
struct Decoded {
    hypothesis: Hypothesis,
    temperature: f32,
    compression_ratio: f64,
}

/// faster-whisper's `generate_with_fallback`: the window decoded at each temperature in turn
/// until a result needs no fallback: its compression ratio at most the threshold and its
/// average log-probability at least the threshold, or a likely silence (no-speech probability
/// above its threshold with a low log-probability: left for the caller to skip). When every
/// result fails, the one with the highest average log-probability among those under the
/// compression threshold (else among all) is kept, reported at the last temperature tried.
#[allow(clippy::too_many_arguments)]
fn decode_with_fallback(
    model: &Whisper,
    audio: &EncodedAudio,
    prompt: &[u32],
    tokens: &WhisperTokens,
    search: &SearchOptions,
    options: &TranscribeOptions,
    text_of: &dyn Fn(&[u32]) -> String,
    rng: &mut SplitMix64,
    on_token: &mut dyn FnMut(u32),
) -> Result<Decoded> {
    let temperatures: &[f32] = if options.temperatures.is_empty() {
        &[0.0]
    } else {
        &options.temperatures
    };
    // With temperature 0 alone the search streams its tokens as it goes (greedy decoding);
    // otherwise the kept result's tokens are reported once it is chosen.
    let live = temperatures == [0.0];
    let mut all: Vec<Decoded> = Vec::new();
    let mut below_threshold: Vec<usize> = Vec::new();
    for &temperature in temperatures {
        let hypothesis = if temperature > 0.0 {
            sample(
                model,
                audio,
                prompt,
                tokens,
                search,
                Sampling {
                    temperature,
                    best_of: options.best_of,
                },
                rng,
            )?
        } else if live {
            generate(model, audio, prompt, tokens, search, on_token)?
        } else {
            generate(model, audio, prompt, tokens, search, &mut |_| {})?
        };
        let ratio = compression_ratio(text_of(&hypothesis.tokens).trim());
        let avg = hypothesis.avg_logprob();
        let low_logprob = options.log_prob_threshold.is_some_and(|t| avg < t);
        let mut fallback = low_logprob;
        if options
            .compression_ratio_threshold
            .is_some_and(|t| ratio > t)
        {
            fallback = true;
        } else {
            below_threshold.push(all.len());
        }
        if low_logprob
            && options
                .no_speech_threshold
                .is_some_and(|t| hypothesis.no_speech_prob as f64 > t)
        {
            fallback = false;
        }
        all.push(Decoded {
            hypothesis,
            temperature,
            compression_ratio: ratio,
        });
        if !fallback {
            let kept = all.pop().expect("just pushed");
            if !live {
                kept.hypothesis.tokens.iter().for_each(|&t| on_token(t));
            }
            return Ok(kept);
        }
    }
    let pool: Vec<usize> = if below_threshold.is_empty() {
        (0..all.len()).collect()
    } else {
        below_threshold
    };
    // Python's max: the first of the highest.
    let best = pool.iter().copied().fold(pool[0], |b, i| {
        if all[i].hypothesis.avg_logprob() > all[b].hypothesis.avg_logprob() {
            i
        } else {
            b
        }
    });
    let mut kept = all.swap_remove(best);
    kept.temperature = *temperatures.last().expect("at least one temperature");
    if !live {
        kept.hypothesis.tokens.iter().for_each(|&t| on_token(t));
    }
    Ok(kept)
}

/// Transcribes a whole log-mel spectrogram (`mel: [n_mels, frames]` row-major, as
/// `whisper_log_mel` returns it) window by window, following faster-whisper 1.2.1's
/// `generate_segments` without VAD or hotwords, each window decoded by `decode_with_fallback` at
/// `options.temperatures` (by default 0 alone); with `word_timestamps` as its `word_timestamps=True` (without the hallucination
/// silence threshold, off by default there too).
///
/// With timestamps (the default): the content frames (all but the last) are read in windows
/// of up to 3000 frames starting at `seek`; each is decoded with [`generate`] after the prompt.
/// A window whose no-speech probability exceeds `no_speech_threshold` while its average
/// log-probability (sum / (tokens + 1)) does not exceed `log_prob_threshold` is skipped as
/// silence. Otherwise its tokens split into segments at each pair of consecutive timestamps
/// ([`split_at_timestamps`]); segments with equal start and end or blank text are dropped,
/// and `seek` moves past the window when it ends in a single timestamp (or has no timestamp
/// pair), else to the last timestamp.
///
/// Without timestamps (`options.timestamps == false`): consecutive 3000-frame windows with
/// `<|notimestamps|>` in the prompt, one segment per window, never skipped (one window even for
/// audio shorter than a frame).
///
/// The prompt is start-of-transcript, language and task (and `<|notimestamps|>`); with
/// `condition_on_previous_text`, once segments were kept, `<|startofprev|>` and the last
/// [`MAX_PREVIOUS_TOKENS`] (223) of their tokens (timestamps included) come first.
///
/// `decode_text` turns text tokens (those below end-of-text) into text. `on_event` sees the
/// detected language, every generated token and each segment as it is final.
pub fn transcribe(
    model: &Whisper,
    mel: &[f32],
    frames: usize,
    tokens: &WhisperTokens,
    options: &TranscribeOptions,
    decode_text: &dyn Fn(&[u32]) -> String,
    on_event: &mut dyn FnMut(TranscribeEvent),
) -> Result<Transcription> {
    let n_mels = model.dims().n_mels;
    if mel.len() != n_mels * frames {
        return Err(ModelError::Kernel(synaptix_core::Error::ShapeMismatch {
            op: "whisper transcribe",
            detail: format!("{} mel values, expected {n_mels}×{frames}", mel.len()),
        })
        .into());
    }
    let text_of = |ids: &[u32]| {
        let text: Vec<u32> = ids.iter().copied().filter(|&t| t < tokens.eot).collect();
        decode_text(&text)
    };
    let search = SearchOptions {
        beam_size: options.beam_size,
        max_initial_timestamp_index: (options.max_initial_timestamp / TIME_PRECISION)
            .round_ties_even()
            .max(0.0) as usize,
    };
    // faster-whisper's content frames: the features but their last frame.
    let content = frames.saturating_sub(1);
    let mut result = Transcription {
        language: None,
        segments: Vec::new(),
        windows: 0,
        skipped: 0,
        encode_s: 0.0,
        decode_s: 0.0,
    };
    let mut language_token = options.language;
    // The kept segments' tokens, fed back from `prompt_since` on.
    let mut previous: Vec<u32> = options.initial_prompt.clone();
    let mut prompt_since = 0;
    let mut seek = 0usize;
    let mut rng = SplitMix64::new(options.seed);
    // faster-whisper's last_speech_timestamp (word timestamps): where speech last ended.
    let mut last_speech_timestamp = 0.0f64;
    loop {
        let more = if options.timestamps {
            seek < content
        } else {
            seek < content || (seek == 0 && content == 0)
        };
        if !more {
            break;
        }
        let size = WINDOW_FRAMES.min(content - seek);
        // The window [seek, seek + size) of every mel row, zero-padded to WINDOW_FRAMES.
        let mut window = vec![0f32; n_mels * WINDOW_FRAMES];
        for (c, row) in window.chunks_exact_mut(WINDOW_FRAMES).enumerate() {
            row[..size].copy_from_slice(&mel[c * frames + seek..c * frames + seek + size]);
        }
        let started = Instant::now();
        let encoded = model.encode(&window)?;
        result.encode_s += started.elapsed().as_secs_f64();
        let started = Instant::now();
        let language = match language_token {
            Some(t) => t,
            None => {
                let (code, p) = model.detect_language(&encoded, tokens)?;
                on_event(TranscribeEvent::Language {
                    code: &code,
                    probability: p,
                });
                let t = tokens.language(&code).unwrap_or(tokens.languages[0].0);
                result.language = Some((code, p));
                language_token = Some(t);
                t
            }
        };
        result.windows += 1;
        let mut prompt = Vec::new();
        let fed_back = &previous[prompt_since..];
        if let (Some(sot_prev), false) = (tokens.sot_prev, fed_back.is_empty()) {
            prompt.push(sot_prev);
            prompt
                .extend_from_slice(&fed_back[fed_back.len().saturating_sub(MAX_PREVIOUS_TOKENS)..]);
        }
        prompt.extend([tokens.sot, language, options.task]);
        if !options.timestamps {
            prompt.push(tokens.no_timestamps);
        }
        let on_token = &mut |id| on_event(TranscribeEvent::Token(id));
        let Decoded {
            hypothesis: generated,
            temperature,
            compression_ratio,
        } = decode_with_fallback(
            model, &encoded, &prompt, tokens, &search, options, &text_of, &mut rng, on_token,
        )?;
        result.decode_s += started.elapsed().as_secs_f64();
        let avg_logprob = generated.avg_logprob();
        let time_offset = seek as f64 * TIME_PER_FRAME;
        let mut kept = Vec::new();
        if !options.timestamps {
            kept.push(Segment {
                seek,
                start: time_offset,
                end: time_offset + size as f64 * TIME_PER_FRAME,
                text: text_of(&generated.tokens),
                tokens: generated.tokens,
                avg_logprob,
                no_speech_prob: generated.no_speech_prob,
                temperature,
                compression_ratio,
                words: Vec::new(),
            });
            seek += WINDOW_FRAMES;
        } else {
            if let Some(threshold) = options.no_speech_threshold {
                let mut silent = generated.no_speech_prob as f64 > threshold;
                if options
                    .log_prob_threshold
                    .is_some_and(|lp| avg_logprob > lp)
                {
                    silent = false;
                }
                if silent {
                    result.skipped += 1;
                    seek += size;
                    continue;
                }
            }
            let (pieces, next_seek) =
                split_at_timestamps(&generated.tokens, tokens.timestamp_begin, seek, size);
            let mut timed: Vec<TimedPiece> = pieces
                .iter()
                .map(|p| TimedPiece {
                    start: p.start,
                    end: p.end,
                    text_tokens: p
                        .tokens
                        .iter()
                        .copied()
                        .filter(|&t| t < tokens.eot)
                        .collect(),
                    words: Vec::new(),
                })
                .collect();
            // faster-whisper would decode the same window forever when the last timestamp
            // pair sits at 0.00; move past the window instead.
            let mut next = if next_seek > seek {
                next_seek
            } else {
                seek + size
            };
            if options.word_timestamps {
                let started = Instant::now();
                let start = [tokens.sot, language, options.task];
                let code = tokens
                    .languages
                    .iter()
                    .find(|(id, _)| *id == language)
                    .map_or("", |(_, c)| c.as_str());
                let window = Window {
                    model,
                    audio: &encoded,
                    tokens,
                    start: &start,
                    num_frames: size,
                    language: code,
                    decode: decode_text,
                };
                add_word_timestamps(&mut timed, &window, seek, last_speech_timestamp)?;
                result.decode_s += started.elapsed().as_secs_f64();
                let g = &generated.tokens;
                let single_timestamp_ending = g.len() >= 2
                    && g[g.len() - 2] < tokens.timestamp_begin
                    && tokens.timestamp_begin <= g[g.len() - 1];
                let end = last_end(&timed);
                if let (false, Some(end)) = (single_timestamp_ending, end) {
                    if end > time_offset {
                        next = (end * FRAMES_PER_SECOND).round_ties_even() as usize;
                    }
                }
                if let Some(end) = end {
                    last_speech_timestamp = end;
                }
            }
            for (piece, times) in pieces.into_iter().zip(timed) {
                let text = text_of(&piece.tokens);
                if times.start == times.end || text.trim().is_empty() {
                    continue;
                }
                kept.push(Segment {
                    seek,
                    start: times.start,
                    end: times.end,
                    tokens: piece.tokens,
                    text,
                    avg_logprob,
                    no_speech_prob: generated.no_speech_prob,
                    temperature,
                    compression_ratio,
                    words: times.words,
                });
            }
            seek = next;
        }
        for segment in kept {
            previous.extend_from_slice(&segment.tokens);
            on_event(TranscribeEvent::Segment(&segment));
            result.segments.push(segment);
        }
        if !options.condition_on_previous_text || temperature > options.prompt_reset_on_temperature
        {
            prompt_since = previous.len();
        }
        if !options.timestamps && content == 0 {
            break;
        }
    }
    Ok(result)
}

/// A piece of a window's tokens between timestamps, before the blank ones are dropped.
#[derive(Debug, Clone, PartialEq)]
pub struct TimedTokens {
    pub start: f64,
    pub end: f64,
    pub tokens: Vec<u32>,
}

/// faster-whisper's `_split_segments_by_timestamps` for the window of `size` frames at `seek`:
/// the tokens split before each timestamp that follows a timestamp, every piece timed by its
/// first and last token; when the tokens end in a single timestamp the remainder is a piece
/// too and the next seek is past the window, otherwise the unfinished remainder is left out and
/// the next seek is the last timestamp of the pieces. Without a timestamp pair the whole window
/// is one piece, ending at its last timestamp when that is not 0.00, else at the window's end.
/// Returns the pieces and the next seek.
pub fn split_at_timestamps(
    tokens: &[u32],
    timestamp_begin: u32,
    seek: usize,
    size: usize,
) -> (Vec<TimedTokens>, usize) {
    let time_offset = seek as f64 * TIME_PER_FRAME;
    let is_ts = |t: u32| t >= timestamp_begin;
    let position = |t: u32| t as i64 - timestamp_begin as i64;
    let n = tokens.len();
    let single_ending = n >= 2 && !is_ts(tokens[n - 2]) && is_ts(tokens[n - 1]);
    let mut cuts: Vec<usize> = (1..n)
        .filter(|&i| is_ts(tokens[i]) && is_ts(tokens[i - 1]))
        .collect();
    if cuts.is_empty() {
        let mut duration = size as f64 * TIME_PER_FRAME;
        if let Some(&last) = tokens.iter().rev().find(|&&t| is_ts(t)) {
            if last != timestamp_begin {
                duration = position(last) as f64 * TIME_PRECISION;
            }
        }
        let piece = TimedTokens {
            start: time_offset,
            end: time_offset + duration,
            tokens: tokens.to_vec(),
        };
        return (vec![piece], seek + size);
    }
    if single_ending {
        cuts.push(n);
    }
    let mut pieces = Vec::with_capacity(cuts.len());
    let mut from = 0;
    for &cut in &cuts {
        let slice = &tokens[from..cut];
        pieces.push(TimedTokens {
            start: time_offset + position(slice[0]) as f64 * TIME_PRECISION,
            end: time_offset + position(slice[slice.len() - 1]) as f64 * TIME_PRECISION,
            tokens: slice.to_vec(),
        });
        from = cut;
    }
    let next = if single_ending {
        seek + size
    } else {
        let last = position(tokens[from - 1]);
        (seek as i64 + last * INPUT_STRIDE as i64).max(0) as usize
    };
    (pieces, next)
}
