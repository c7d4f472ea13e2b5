//! Text to Piper phoneme ids, as `piper-tts` 1.8.0 computes them for espeak voices
//! (`PiperVoice.phonemize` then `phonemes_to_ids`).
//!
//! A phoneme is one Unicode code point of espeak-ng's IPA after NFD decomposition (so `ç`
//! becomes `c` and a combining cedilla), with Piper's punctuation kept: each clause's terminator,
//! followed by a space after `,` `:` `;`. A config's `vowel_clusters` merge listed sequences
//! back into one phoneme. `[[ ... ]]` in the text passes phonemes through untouched (one code
//! point each, not decomposed).
//!
//! Not reproduced: for the Arabic voice (`ar`) Piper first adds diacritics with its own model
//! (`tashkeel`); here the text goes to espeak-ng as it is.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use serde_json::Value;
use unicode_normalization::UnicodeNormalization;

use crate::error::{Result, TokenizerError};
use crate::espeak;

/// Phoneme ids for one sentence.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PhonemeIds {
    /// BOS, PAD, then each known phoneme's ids followed by PAD's, then EOS: the model's input.
    pub ids: Vec<i64>,
    /// Phonemes the voice's `phoneme_id_map` lacks, in order of appearance (with repeats). They
    /// were left out of `ids`, as Piper leaves them out (with a logged warning).
    pub missing: Vec<String>,
}

/// Text to phonemes and phonemes to ids for one Piper voice, from its `*.onnx.json` config.
///
/// Loading the config does not touch espeak-ng: [`PiperPhonemizer::ids`] and
/// [`PiperPhonemizer::raw_phonemes`] work without it; [`PiperPhonemizer::sentences`] loads it on
/// first use.
#[derive(Debug, Clone)]
pub struct PiperPhonemizer {
    espeak_voice: String,
    id_map: HashMap<String, Vec<i64>>,
    /// Sequences of phonemes merged into one, and the longest one's length.
    vowel_clusters: Option<(HashSet<Vec<String>>, usize)>,
}

impl PiperPhonemizer {
    /// Piper's padding symbol, written after BOS and after every phoneme.
    pub const PAD: &'static str = "_";
    /// Piper's beginning-of-sentence symbol.
    pub const BOS: &'static str = "^";
    /// Piper's end-of-sentence symbol.
    pub const EOS: &'static str = "$";

    /// Reads a Piper voice config (`en_US-joe-medium.onnx.json`).
    ///
    /// Errors: unreadable file, not JSON, `phoneme_type` other than `espeak`, missing
    /// `espeak.voice` or `phoneme_id_map`, a map without `^`, `$` and `_`, ids that are not
    /// integers.
    pub fn from_config_file(path: impl AsRef<Path>) -> Result<PiperPhonemizer> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| TokenizerError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        PiperPhonemizer::from_config_str(&text, &path.display().to_string())
    }

    /// As [`PiperPhonemizer::from_config_file`], from the JSON text; `origin` names it in errors.
    pub fn from_config_str(json: &str, origin: &str) -> Result<PiperPhonemizer> {
        let value: Value = serde_json::from_str(json).map_err(|e| TokenizerError::PiperConfig {
            path: origin.to_string(),
            problem: format!("not valid JSON: {e}"),
        })?;
        PiperPhonemizer::from_config(&value, origin)
    }

    /// As [`PiperPhonemizer::from_config_file`], from the parsed JSON.
    pub fn from_config(config: &Value, origin: &str) -> Result<PiperPhonemizer> {
        let bad = |problem: String| TokenizerError::PiperConfig {
            path: origin.to_string(),
            problem,
        };
        if !config.is_object() {
            return Err(bad("not a JSON object".into()));
        }
        // Piper's default when the field is absent.
        match config.get("phoneme_type") {
            None => {}
            Some(Value::String(t)) if t == "espeak" => {}
            Some(Value::String(t)) => {
                return Err(TokenizerError::UnsupportedPhonemeType(t.clone()))
            }
            Some(other) => return Err(bad(format!("`phoneme_type` is not a string: {other}"))),
        }
        let espeak_voice = config
            .get("espeak")
            .and_then(|e| e.get("voice"))
            .and_then(Value::as_str)
            .ok_or_else(|| bad("`espeak.voice` is missing or not a string".into()))?
            .to_string();

        let map = config
            .get("phoneme_id_map")
            .and_then(Value::as_object)
            .ok_or_else(|| bad("`phoneme_id_map` is missing or not an object".into()))?;
        let mut id_map = HashMap::with_capacity(map.len());
        for (phoneme, ids) in map {
            let ids = ids
                .as_array()
                .and_then(|a| a.iter().map(Value::as_i64).collect::<Option<Vec<i64>>>())
                .ok_or_else(|| {
                    bad(format!(
                        "`phoneme_id_map` entry {phoneme:?} is not a list of integers"
                    ))
                })?;
            id_map.insert(phoneme.clone(), ids);
        }
        for symbol in [Self::PAD, Self::BOS, Self::EOS] {
            if !id_map.contains_key(symbol) {
                return Err(bad(format!("`phoneme_id_map` has no `{symbol}`")));
            }
        }

        // A list of phoneme lists; empty or absent means none.
        let vowel_clusters = match config.get("vowel_clusters") {
            None | Some(Value::Null) => None,
            Some(v) => {
                let lists = v
                    .as_array()
                    .and_then(|a| {
                        a.iter()
                            .map(|c| {
                                c.as_array()?
                                    .iter()
                                    .map(|p| p.as_str().map(str::to_string))
                                    .collect::<Option<Vec<String>>>()
                            })
                            .collect::<Option<Vec<Vec<String>>>>()
                    })
                    .ok_or_else(|| {
                        bad("`vowel_clusters` is not a list of lists of strings".into())
                    })?;
                let longest = lists.iter().map(Vec::len).max().unwrap_or(0);
                (!lists.is_empty()).then(|| (lists.into_iter().collect(), longest))
            }
        };

        Ok(PiperPhonemizer {
            espeak_voice,
            id_map,
            vowel_clusters,
        })
    }

    /// The espeak-ng voice the config names (`espeak.voice`, e.g. `en-us`).
    pub fn espeak_voice(&self) -> &str {
        &self.espeak_voice
    }

    /// The config's `phoneme_id_map`.
    pub fn id_map(&self) -> &HashMap<String, Vec<i64>> {
        &self.id_map
    }

    /// Text to phonemes, one list per sentence (`PiperVoice.phonemize`). Each text part outside
    /// `[[ ... ]]` goes to espeak-ng; a sentence ends where espeak-ng ends one; a raw block
    /// joins the current sentence, with a space before or after it where the text has one; a
    /// trailing empty sentence is dropped.
    ///
    /// Errors: espeak-ng cannot be loaded, does not know the voice, or the text has a NUL.
    pub fn sentences(&self, text: &str) -> Result<Vec<Vec<String>>> {
        let parts = split_phoneme_blocks(text);
        let mut sentences: Vec<Vec<String>> = Vec::new();
        let mut after_raw = false;
        for (i, part) in parts.iter().enumerate() {
            if part.starts_with("[[") {
                after_raw = true;
                if sentences.is_empty() {
                    sentences.push(Vec::new());
                }
                let last = sentences.len() - 1;
                let current = &mut sentences[last];
                if i > 0 && parts[i - 1].ends_with(' ') {
                    current.push(" ".to_string());
                }
                current.extend(block_phonemes(part));
                if i + 1 < parts.len() && parts[i + 1].starts_with(' ') {
                    current.push(" ".to_string());
                }
                continue;
            }

            let mut part_sentences = self.espeak_sentences(part)?.into_iter();
            if after_raw {
                // The text right after a raw block continues its sentence.
                if let (Some(first), Some(current)) = (part_sentences.next(), sentences.last_mut())
                {
                    current.extend(first);
                }
            }
            sentences.extend(part_sentences);
            after_raw = false;
        }
        if sentences.last().is_some_and(Vec::is_empty) {
            sentences.pop();
        }
        Ok(sentences)
    }

    /// A phoneme string given directly (no espeak-ng), as the inside of a `[[ ... ]]` block:
    /// surrounding whitespace removed, then one phoneme per code point, not decomposed.
    pub fn raw_phonemes(phonemes: &str) -> Vec<String> {
        phonemes
            .trim_matches(py_is_space)
            .chars()
            .map(String::from)
            .collect()
    }

    /// One sentence's phonemes to ids (`phonemes_to_ids`): BOS, PAD, each phoneme's ids then
    /// PAD's, EOS. Phonemes missing from the map are skipped and listed in
    /// [`PhonemeIds::missing`].
    pub fn ids(&self, phonemes: &[String]) -> PhonemeIds {
        let pad = &self.id_map[Self::PAD];
        let mut out = PhonemeIds::default();
        out.ids.extend_from_slice(&self.id_map[Self::BOS]);
        out.ids.extend_from_slice(pad);
        for phoneme in phonemes {
            match self.id_map.get(phoneme) {
                Some(ids) => {
                    out.ids.extend_from_slice(ids);
                    out.ids.extend_from_slice(pad);
                }
                None => out.missing.push(phoneme.clone()),
            }
        }
        out.ids.extend_from_slice(&self.id_map[Self::EOS]);
        out
    }

    /// `EspeakPhonemizer.phonemize`: espeak-ng's clauses grouped into sentences.
    fn espeak_sentences(&self, text: &str) -> Result<Vec<Vec<String>>> {
        let mut sentences = Vec::new();
        let mut sentence: Vec<String> = Vec::new();
        for clause in espeak::clauses(&self.espeak_voice, text)? {
            let mut phonemes = remove_language_flags(&clause.phonemes);
            phonemes.push_str(&clause.terminator);
            if matches!(clause.terminator.as_str(), "," | ":" | ";") {
                phonemes.push(' ');
            }
            sentence.extend(phonemes.nfd().map(String::from));
            if clause.end_of_sentence {
                sentences.push(self.merge_vowel_clusters(std::mem::take(&mut sentence)));
            }
        }
        if !sentence.is_empty() {
            sentences.push(self.merge_vowel_clusters(sentence));
        }
        Ok(sentences)
    }

    /// Replaces each listed cluster by one phoneme, longest match first, left to right.
    fn merge_vowel_clusters(&self, phonemes: Vec<String>) -> Vec<String> {
        let Some((clusters, longest)) = &self.vowel_clusters else {
            return phonemes;
        };
        let mut out = Vec::with_capacity(phonemes.len());
        let mut i = 0;
        while i < phonemes.len() {
            let longest_here = (*longest).min(phonemes.len() - i);
            let matched = (2..=longest_here)
                .rev()
                .find(|&n| clusters.contains(&phonemes[i..i + n]));
            match matched {
                Some(n) => {
                    out.push(phonemes[i..i + n].concat());
                    i += n;
                }
                None => {
                    out.push(phonemes[i].clone());
                    i += 1;
                }
            }
        }
        out
    }
}

/// Piper's `re.split(r"(\[\[.*?\]\])", text)`: text and `[[ ... ]]` blocks alternately (a block
/// does not span a newline), starting and ending with text, which may be empty.
fn split_phoneme_blocks(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut last = 0;
    let mut search = 0;
    while let Some(open) = text[search..].find("[[").map(|o| search + o) {
        let inner = open + 2;
        let line_end = text[inner..].find('\n').map_or(text.len(), |n| inner + n);
        match text[inner..line_end].find("]]") {
            Some(close) => {
                let end = inner + close + 2;
                parts.push(&text[last..open]);
                parts.push(&text[open..end]);
                last = end;
                search = end;
            }
            // No block starts here; the next `[` may start one.
            None => search = open + 1,
        }
    }
    parts.push(&text[last..]);
    parts
}

/// The phonemes of a text part that starts with `[[`: Python's `part[2:-2].strip()`, one per
/// code point. (A part can start with `[[` without being a block, e.g. an unclosed `[[` at the
/// start of the text; Piper reads it the same way.)
fn block_phonemes(part: &str) -> Vec<String> {
    let chars: Vec<char> = part.chars().collect();
    let inner: String = if chars.len() > 4 {
        chars[2..chars.len() - 2].iter().collect()
    } else {
        String::new()
    };
    PiperPhonemizer::raw_phonemes(&inner)
}

/// Python's `str.isspace`: Unicode White_Space plus the ASCII separators U+001C..U+001F.
fn py_is_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Piper's `re.sub(r"\([^)]+\)", "", phonemes)`: drops espeak-ng's language-switch flags such
/// as `(en)` and `(fr)`.
fn remove_language_flags(phonemes: &str) -> String {
    let mut out = String::with_capacity(phonemes.len());
    let mut rest = phonemes;
    while let Some(open) = rest.find('(') {
        let after = &rest[open + 1..];
        // At least one character other than `)` before the closing `)`.
        match after.find(')') {
            Some(close) if close > 0 => {
                out.push_str(&rest[..open]);
                rest = &after[close + 1..];
            }
            _ => {
                out.push_str(&rest[..open + 1]);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_split_like_python() {
        assert_eq!(split_phoneme_blocks("a [[ b ]] c"), ["a ", "[[ b ]]", " c"]);
        assert_eq!(split_phoneme_blocks("[[x]]"), ["", "[[x]]", ""]);
        assert_eq!(
            split_phoneme_blocks("[[a]][[b]]"),
            ["", "[[a]]", "", "[[b]]", ""]
        );
        assert_eq!(split_phoneme_blocks("[[[a]]]"), ["", "[[[a]]", "]"]);
        assert_eq!(split_phoneme_blocks("[[a\n]] b"), ["[[a\n]] b"]);
        assert_eq!(
            split_phoneme_blocks("x [[a\n[[b]]"),
            ["x [[a\n", "[[b]]", ""]
        );
        assert_eq!(split_phoneme_blocks("no blocks"), ["no blocks"]);
    }

    #[test]
    fn block_contents() {
        assert_eq!(block_phonemes("[[ hə ]]"), ["h", "ə"]);
        assert_eq!(block_phonemes("[[]]"), Vec::<String>::new());
        // Unclosed: Python slices two characters off the end anyway.
        assert_eq!(block_phonemes("[[abc"), ["a"]);
        assert_eq!(block_phonemes("[[a"), Vec::<String>::new());
    }

    #[test]
    fn language_flags() {
        assert_eq!(remove_language_flags("(en)hɛloʊ(fr) a"), "hɛloʊ a");
        assert_eq!(remove_language_flags("a () b"), "a () b");
        assert_eq!(remove_language_flags("((a) b"), " b");
        assert_eq!(remove_language_flags("(a b"), "(a b");
        assert_eq!(remove_language_flags("x(\n)y"), "xy");
    }
}
