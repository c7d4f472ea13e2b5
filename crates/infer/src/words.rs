//! Word timestamps for Whisper, as faster-whisper 1.2.1 computes them with
//! `word_timestamps=True`:
//! - [`align`] is CTranslate2 4.8's `Whisper.align`: the window's text is forced through the
//!   decoder after the start sequence and `<|notimestamps|>`. The cross-attention scores of the
//!   model's alignment heads then go through a softmax over the window's content frames and a
//!   normalisation over the tokens (zero mean, unit variance per frame). A median filter of width
//!   7 runs along the frames, the heads are averaged, and dynamic time warping finds the path of
//!   the text rows (and end-of-text) over the frames. Each text token's probability (softmax over
//!   the text vocabulary) comes along.
//! - [`find_alignment`] splits the tokens into words (at spaces and punctuation, or at every
//!   complete character for languages written without spaces). A word starts at the first frame
//!   its first token reaches on the path.
//! - [`add_word_timestamps`] is faster-whisper's clean-up: long words at sentence boundaries
//!   are cut to twice the median word duration, and punctuation is merged into neighbouring
//!   words. Words are assigned to the window's segments, and segment starts and ends move to
//!   the words' (or a too-long first or last word is cut back to the segment's).

use synaptix_models::whisper::{EncodedAudio, Whisper, WhisperTokens};

use crate::Result;

/// Audio frames (after the encoder's stride) per second: one per 20 ms.
const TOKENS_PER_SECOND: f64 = 50.0;
/// Mel frames per second.
const FRAMES_PER_SECOND: f64 = 100.0;
/// CTranslate2's median filter width for alignment.
const MEDIAN_FILTER_WIDTH: usize = 7;
/// Languages whose words are split at every complete character, not at spaces.
const WITHOUT_SPACES: &[&str] = &["zh", "ja", "th", "lo", "my", "yue"];
/// Python's `string.punctuation`.
const PUNCTUATION: &str = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";
/// faster-whisper's defaults: merged into the word after, or before.
pub const PREPEND_PUNCTUATIONS: &str = "\"'“¿([{-";
pub const APPEND_PUNCTUATIONS: &str = "\"'.。,，!！?？:：”)]}、";
const SENTENCE_END_MARKS: &str = ".。!！?？";

/// A word and when it was said, in seconds from the start of the audio.
#[derive(Debug, Clone, PartialEq)]
pub struct Word {
    /// As decoded, with its leading space and merged punctuation.
    pub word: String,
    pub start: f64,
    pub end: f64,
    /// The mean probability of its tokens.
    pub probability: f32,
}

/// One window to align: the model with the window's encoded audio, the start sequence
/// (start-of-transcript, language, task), the mel frames of the window that hold audio, the
/// language code (for splitting words) and the text decoder.
pub struct Window<'a> {
    pub model: &'a Whisper,
    pub audio: &'a EncodedAudio,
    pub tokens: &'a WhisperTokens,
    pub start: &'a [u32],
    pub num_frames: usize,
    pub language: &'a str,
    pub decode: &'a dyn Fn(&[u32]) -> String,
}

/// What [`align`] finds.
#[derive(Debug, Clone, PartialEq)]
pub struct Alignment {
    /// The warping path as `(text row, frame)` pairs (row `text.len()` is end-of-text).
    pub path: Vec<(isize, isize)>,
    /// Each text token's probability.
    pub probs: Vec<f32>,
}

/// A word of [`find_alignment`], times relative to its window.
#[derive(Debug, Clone, PartialEq)]
pub struct WordTiming {
    pub word: String,
    pub tokens: Vec<u32>,
    pub start: f64,
    pub end: f64,
    pub probability: f32,
}

/// CTranslate2's `align` for one window: `text` (tokens below end-of-text) forced after the
/// start sequence and `<|notimestamps|>`.
pub fn align(w: &Window, text: &[u32]) -> Result<Alignment> {
    let (model, audio, tokens, start) = (w.model, w.audio, w.tokens, w.start);
    let mut input = start.to_vec();
    input.push(tokens.no_timestamps);
    input.extend_from_slice(text);
    input.push(tokens.eot);
    let rows = input.len();
    let (logits, scores) = model.forward_scores(audio, &input, &tokens.alignment_heads)?;
    let vocab = logits.len() / rows.max(1);
    let eot = tokens.eot as usize;
    let offset = start.len();

    // The probability of each text token among the text vocabulary (ids below end-of-text).
    let probs = text
        .iter()
        .enumerate()
        .map(|(t, &id)| {
            let row = &logits[(offset + t) * vocab..(offset + t) * vocab + eot.min(vocab)];
            let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            let sum: f32 = row.iter().map(|&v| (v - max).exp()).sum();
            row.get(id as usize).map_or(0.0, |&v| (v - max).exp() / sum)
        })
        .collect();

    // Heads' scores → softmax over the content frames → normalised over the tokens → median
    // filter along the frames → mean over the heads.
    let total = scores.first().map_or(0, |s| s.len() / rows.max(1));
    let frames = (w.num_frames / 2).min(total);
    let mut mean = vec![0f32; rows * frames];
    for head in &scores {
        let mut weights: Vec<f32> = head
            .chunks_exact(total)
            .flat_map(|r| r[..frames].iter().copied())
            .collect();
        for row in weights.chunks_exact_mut(frames.max(1)) {
            let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            let mut sum = 0f32;
            row.iter_mut().for_each(|v| {
                *v = (*v - max).exp();
                sum += *v;
            });
            row.iter_mut().for_each(|v| *v /= sum);
        }
        normalize_columns(&mut weights, rows, frames);
        let filtered = median_filter_rows(&weights, frames, MEDIAN_FILTER_WIDTH);
        mean.iter_mut().zip(&filtered).for_each(|(m, &v)| *m += v);
    }
    let n_heads = scores.len().max(1) as f32;
    mean.iter_mut().for_each(|v| *v /= n_heads);
    // The text rows and end-of-text: rows offset ..= offset + text.len().
    let matrix = &mean[offset * frames..(offset + text.len() + 1) * frames];
    Ok(Alignment {
        path: negative_dtw(matrix, text.len() + 1, frames),
        probs,
    })
}

/// Each column of `w: [rows, cols]` to zero mean and unit variance over the rows (a layer norm
/// along the rows without epsilon).
fn normalize_columns(w: &mut [f32], rows: usize, cols: usize) {
    for c in 0..cols {
        let mean = (0..rows).map(|r| w[r * cols + c]).sum::<f32>() / rows as f32;
        let var = (0..rows)
            .map(|r| (w[r * cols + c] - mean).powi(2))
            .sum::<f32>()
            / rows as f32;
        let inv = 1.0 / var.sqrt();
        for r in 0..rows {
            w[r * cols + c] = (w[r * cols + c] - mean) * inv;
        }
    }
}

/// The median of each window of `width` values along every row of `w: [_, cols]`, the row
/// reflected at its ends (without repeating the edge value); rows no longer than `width / 2`
/// are kept as they are.
fn median_filter_rows(w: &[f32], cols: usize, width: usize) -> Vec<f32> {
    let rank = width / 2;
    if cols <= rank {
        return w.to_vec();
    }
    let mut out = vec![0f32; w.len()];
    let mut window = vec![0f32; width];
    for (row, dst) in w.chunks_exact(cols).zip(out.chunks_exact_mut(cols)) {
        for (j, d) in dst.iter_mut().enumerate() {
            for (k, slot) in window.iter_mut().enumerate() {
                let mut read = (j as isize + k as isize - rank as isize).unsigned_abs();
                if read >= cols {
                    read = 2 * cols - read - 2;
                }
                *slot = row[read];
            }
            window.sort_unstable_by(f32::total_cmp);
            *d = window[rank];
        }
    }
    out
}

/// Dynamic time warping over `-x` (`x: [n, m]`): the cheapest monotonic path from `(0, 0)` to
/// `(n - 1, m - 1)` by diagonal, down and right steps, ties going right; as `(row, column)`
/// pairs. A path that runs along the first row or column of the cost matrix yields row or
/// column -1 there, as the reference's does.
fn negative_dtw(x: &[f32], n: usize, m: usize) -> Vec<(isize, isize)> {
    let inf = f32::INFINITY;
    let mut cost = vec![inf; (n + 1) * (m + 1)];
    let mut trace = vec![-1i8; (n + 1) * (m + 1)];
    let at = |i: usize, j: usize| i * (m + 1) + j;
    cost[0] = 0.0;
    for j in 1..=m {
        for i in 1..=n {
            let (c0, c1, c2) = (
                cost[at(i - 1, j - 1)],
                cost[at(i - 1, j)],
                cost[at(i, j - 1)],
            );
            let (c, t) = if c0 < c1 && c0 < c2 {
                (c0, 0)
            } else if c1 < c0 && c1 < c2 {
                (c1, 1)
            } else {
                (c2, 2)
            };
            cost[at(i, j)] = -x[(i - 1) * m + (j - 1)] + c;
            trace[at(i, j)] = t;
        }
    }
    for j in 0..=m {
        trace[at(0, j)] = 2;
    }
    for i in 0..=n {
        trace[at(i, 0)] = 1;
    }
    let (mut i, mut j) = (n, m);
    let mut path = Vec::with_capacity(n + m);
    while i > 0 || j > 0 {
        path.push((i as isize - 1, j as isize - 1));
        match trace[at(i, j)] {
            0 => {
                i -= 1;
                j -= 1;
            }
            1 => i -= 1,
            _ => j -= 1,
        }
    }
    path.reverse();
    path
}

/// faster-whisper's `split_tokens_on_unicode`: groups of tokens that decode to complete
/// characters (no U+FFFD unless the whole text has one there), with their text.
fn split_on_unicode(
    ids: &[u32],
    decode: &dyn Fn(&[u32]) -> String,
) -> (Vec<String>, Vec<Vec<u32>>) {
    const REPLACEMENT: char = '\u{FFFD}';
    let full: Vec<char> = decode(ids).chars().collect();
    let (mut words, mut groups) = (Vec::new(), Vec::new());
    let mut current = Vec::new();
    let mut offset = 0;
    for &id in ids {
        current.push(id);
        let decoded = decode(&current);
        let complete = match decoded.chars().position(|c| c == REPLACEMENT) {
            None => true,
            Some(at) => full.get(at + offset) == Some(&REPLACEMENT),
        };
        if complete {
            offset += decoded.chars().count();
            words.push(decoded);
            groups.push(std::mem::take(&mut current));
        }
    }
    (words, groups)
}

/// faster-whisper's `split_to_word_tokens`: for languages written with spaces, the character
/// groups of [`split_on_unicode`] joined into words, a new word starting at a special token, a
/// leading space or punctuation.
pub fn split_words(
    ids: &[u32],
    language: &str,
    eot: u32,
    decode: &dyn Fn(&[u32]) -> String,
) -> (Vec<String>, Vec<Vec<u32>>) {
    // Special tokens decode to nothing, as the Python tokenizer skips them.
    let text_only = |ids: &[u32]| {
        let text: Vec<u32> = ids.iter().copied().filter(|&t| t < eot).collect();
        decode(&text)
    };
    let (subwords, groups) = split_on_unicode(ids, &text_only);
    if WITHOUT_SPACES.contains(&language) {
        return (subwords, groups);
    }
    let (mut words, mut word_tokens): (Vec<String>, Vec<Vec<u32>>) = (Vec::new(), Vec::new());
    for (subword, group) in subwords.into_iter().zip(groups) {
        let special = group.first().is_some_and(|&t| t >= eot);
        let with_space = subword.starts_with(' ');
        // Python's `in` on a string: a substring test (an empty word counts).
        let punctuation = PUNCTUATION.contains(subword.trim());
        match (words.last_mut(), word_tokens.last_mut()) {
            (Some(w), Some(t)) if !(special || with_space || punctuation) => {
                w.push_str(&subword);
                t.extend(group);
            }
            _ => {
                words.push(subword);
                word_tokens.push(group);
            }
        }
    }
    (words, word_tokens)
}

/// faster-whisper's `find_alignment` for one window's text tokens: each word's start and end
/// (window seconds) and probability.
pub fn find_alignment(w: &Window, text: &[u32]) -> Result<Vec<WordTiming>> {
    if text.is_empty() {
        return Ok(Vec::new());
    }
    let Alignment { path, probs } = align(w, text)?;
    let mut with_eot = text.to_vec();
    with_eot.push(w.tokens.eot);
    let (words, word_tokens) = split_words(&with_eot, w.language, w.tokens.eot, w.decode);
    if word_tokens.len() <= 1 {
        return Ok(Vec::new());
    }
    // The time of the first frame of each row on the path.
    let mut jump_times = Vec::with_capacity(text.len() + 1);
    let mut previous = None;
    for &(row, frame) in &path {
        if previous != Some(row) {
            jump_times.push(frame as f64 / TOKENS_PER_SECOND);
            previous = Some(row);
        }
    }
    let mut boundaries = vec![0usize];
    for group in &word_tokens[..word_tokens.len() - 1] {
        boundaries.push(boundaries.last().copied().unwrap_or(0) + group.len());
    }
    let mut out = Vec::with_capacity(words.len());
    for (k, (word, group)) in words.into_iter().zip(word_tokens).enumerate() {
        let (Some(&from), Some(&to)) = (boundaries.get(k), boundaries.get(k + 1)) else {
            break;
        };
        let (Some(&start), Some(&end)) = (jump_times.get(from), jump_times.get(to)) else {
            break;
        };
        let slice = &probs[from.min(probs.len())..to.min(probs.len())];
        let probability = if slice.is_empty() {
            f32::NAN
        } else {
            slice.iter().sum::<f32>() / slice.len() as f32
        };
        out.push(WordTiming {
            word,
            tokens: group,
            start,
            end,
            probability,
        });
    }
    Ok(out)
}

/// faster-whisper's `merge_punctuations`: opening marks joined to the word after them, closing
/// marks to the word before.
pub fn merge_punctuations(alignment: &mut [WordTiming], prepended: &str, appended: &str) {
    if alignment.len() < 2 {
        return;
    }
    let (mut i, mut j) = (alignment.len() as isize - 2, alignment.len() - 1);
    while i >= 0 {
        let iu = i as usize;
        let previous = &alignment[iu];
        if previous.word.starts_with(' ') && prepended.contains(previous.word.trim()) {
            let (word, tokens) = (previous.word.clone(), previous.tokens.clone());
            let following = &mut alignment[j];
            following.word = word + &following.word;
            following.tokens = [tokens, std::mem::take(&mut following.tokens)].concat();
            alignment[iu].word.clear();
            alignment[iu].tokens.clear();
        } else {
            j = iu;
        }
        i -= 1;
    }
    let (mut i, mut j) = (0usize, 1usize);
    while j < alignment.len() {
        if !alignment[i].word.ends_with(' ') && appended.contains(alignment[j].word.as_str()) {
            let (word, tokens) = (alignment[j].word.clone(), alignment[j].tokens.clone());
            alignment[i].word.push_str(&word);
            alignment[i].tokens.extend(tokens);
            alignment[j].word.clear();
            alignment[j].tokens.clear();
        } else {
            i = j;
        }
        j += 1;
    }
}

/// Python's `round(x, 2)`: to two decimals, the exact binary value rounded (ties to even).
fn round2(x: f64) -> f64 {
    format!("{x:.2}").parse().unwrap_or(x)
}

/// The median of `v` (the mean of the two middle values for an even count); 0 when empty.
fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// One segment of a window as [`add_word_timestamps`] sees it: its times and text tokens (below
/// end-of-text); the words are filled in and the times may move.
#[derive(Debug, Clone, PartialEq)]
pub struct TimedPiece {
    pub start: f64,
    pub end: f64,
    pub text_tokens: Vec<u32>,
    pub words: Vec<Word>,
}

/// faster-whisper's `add_word_timestamps` for the window at `seek` (mel frames): words for
/// each piece, and the piece times adjusted. Returns the new last speech timestamp.
pub fn add_word_timestamps(
    pieces: &mut [TimedPiece],
    window: &Window,
    seek: usize,
    mut last_speech_timestamp: f64,
) -> Result<f64> {
    if pieces.is_empty() {
        return Ok(last_speech_timestamp);
    }
    let text: Vec<u32> = pieces
        .iter()
        .flat_map(|p| p.text_tokens.iter().copied())
        .collect();
    let mut alignment = find_alignment(window, &text)?;
    let durations: Vec<f64> = alignment
        .iter()
        .map(|w| w.end - w.start)
        .filter(|&d| d != 0.0)
        .collect();
    let median_duration = median(durations.clone()).min(0.7);
    let max_duration = median_duration * 2.0;
    // Long words at sentence boundaries are cut to twice the median word duration.
    if !durations.is_empty() {
        for i in 1..alignment.len() {
            if alignment[i].end - alignment[i].start > max_duration {
                if SENTENCE_END_MARKS.contains(alignment[i].word.as_str()) {
                    alignment[i].end = alignment[i].start + max_duration;
                } else if SENTENCE_END_MARKS.contains(alignment[i - 1].word.as_str()) {
                    alignment[i].start = alignment[i].end - max_duration;
                }
            }
        }
    }
    merge_punctuations(&mut alignment, PREPEND_PUNCTUATIONS, APPEND_PUNCTUATIONS);

    let time_offset = seek as f64 / FRAMES_PER_SECOND;
    let mut word_index = 0;
    for piece in pieces.iter_mut() {
        let mut saved = 0;
        let mut words: Vec<Word> = Vec::new();
        while word_index < alignment.len() && saved < piece.text_tokens.len() {
            let timing = &alignment[word_index];
            if !timing.word.is_empty() {
                words.push(Word {
                    word: timing.word.clone(),
                    start: round2(time_offset + timing.start),
                    end: round2(time_offset + timing.end),
                    probability: timing.probability,
                });
            }
            saved += timing.tokens.len();
            word_index += 1;
        }
        if !words.is_empty() {
            // The first and second word after a pause are no longer than twice the median.
            let first_long = words[0].end - words[0].start > max_duration;
            let pair_long = words.len() > 1 && words[1].end - words[0].start > max_duration * 2.0;
            if words[0].end - last_speech_timestamp > median_duration * 4.0
                && (first_long || pair_long)
            {
                if words.len() > 1 && words[1].end - words[1].start > max_duration {
                    let boundary = (words[1].end / 2.0).max(words[1].end - max_duration);
                    words[0].end = boundary;
                    words[1].start = boundary;
                }
                words[0].start = (words[0].end - max_duration).max(0.0);
            }
            // Prefer the segment's start when the first word is too long, else the word's.
            if piece.start < words[0].end && piece.start - 0.5 > words[0].start {
                words[0].start = (words[0].end - median_duration).min(piece.start).max(0.0);
            } else {
                piece.start = words[0].start;
            }
            // The same for the end and the last word.
            let last = words.len() - 1;
            if piece.end > words[last].start && piece.end + 0.5 < words[last].end {
                words[last].end = (words[last].start + median_duration).max(piece.end);
            } else {
                piece.end = words[last].end;
            }
            last_speech_timestamp = piece.end;
        }
        piece.words = words;
    }
    Ok(last_speech_timestamp)
}

/// faster-whisper's `get_end`: the end of the last word of the last piece with words, else the
/// last piece's end.
pub fn last_end(pieces: &[TimedPiece]) -> Option<f64> {
    pieces
        .iter()
        .rev()
        .find_map(|p| p.words.last().map(|w| w.end))
        .or_else(|| pieces.last().map(|p| p.end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtw_takes_the_cheapest_monotonic_path() {
        // Row 0 is strong on frames 0-1, row 1 on frames 2-3. Worked by hand: the cheapest way
        // into (2, 2) is down from (1, 2), so row 1 starts at frame 1, the frame before its
        // first strong one.
        let x = [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0];
        assert_eq!(
            negative_dtw(&x, 2, 4),
            vec![(0, 0), (0, 1), (1, 1), (1, 2), (1, 3)]
        );
    }

    #[test]
    fn median_filter_reflects_at_the_ends() {
        let row = [5.0, 1.0, 4.0, 2.0, 3.0];
        // Width 3: windows [1,5,1], [5,1,4], [1,4,2], [4,2,3], [2,3,2].
        assert_eq!(
            median_filter_rows(&row, 5, 3),
            vec![1.0, 4.0, 2.0, 3.0, 2.0]
        );
        assert_eq!(median_filter_rows(&row[..1], 1, 3), vec![5.0]);
    }

    #[test]
    fn punctuation_joins_its_neighbours() {
        let w = |word: &str, t: u32| WordTiming {
            word: word.into(),
            tokens: vec![t],
            start: 0.0,
            end: 0.0,
            probability: 1.0,
        };
        let mut a = vec![w(" \"", 1), w("Hi", 2), w(",", 3), w(" you", 4), w(".", 5)];
        merge_punctuations(&mut a, PREPEND_PUNCTUATIONS, APPEND_PUNCTUATIONS);
        let words: Vec<&str> = a.iter().map(|w| w.word.as_str()).collect();
        assert_eq!(words, vec!["", " \"Hi,", "", " you.", ""]);
        assert_eq!(a[1].tokens, vec![1, 2, 3]);
    }

    #[test]
    fn python_rounding_and_median() {
        assert_eq!(round2(1.005), 1.0); // 1.005 is 1.00499999999999989... in binary
        assert_eq!(round2(0.125), 0.12); // an exact tie goes to even
        assert_eq!(round2(2.675), 2.67);
        assert_eq!(median(vec![0.3, 0.1, 0.2, 0.4]), 0.25);
        assert_eq!(median(vec![]), 0.0);
    }
}
