//! Pre-tokenizers of byte-level BPE vocabularies: split text into words before BPE merges.
//!
//! The reference tokenizers (GPT-2, Llama 3, Qwen2) define these splits as regular expressions
//! with Unicode classes and a negative look-ahead (`\s+(?!\S)`). llama.cpp does not run those
//! expressions: it walks the code points with hand-written rules, and for patterns without such
//! a rule it runs `std::regex` over a text in which every non-ASCII code point is replaced by one
//! byte standing for its category. Both deviate from a real regex engine in corner cases (for
//! example a run ending at a segment boundary), so this module follows llama.cpp's rules step by
//! step rather than using a regex crate: the goal is identical token ids.
//!
//! A pre-tokenizer is a list of passes. The text starts as one segment; every pass splits each
//! segment independently, never looking across segment boundaries.

use std::ops::Range;

use crate::unicode::{self, Cat, Class};

/// The pre-tokenizer named by `tokenizer.ggml.pre`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreTokenizer {
    /// llama.cpp's fallback for `default` or a missing name: punctuation runs, then the GPT-2
    /// rules, then digit runs, then groups of three ASCII digits.
    Default,
    /// GPT-2: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`.
    Gpt2,
    /// Every digit alone, then the GPT-2 rules (`starcoder`, `refact`, `command-r`, `smollm`, ...).
    StarCoder,
    /// Llama 3: `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
    /// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`.
    Llama3,
    /// Qwen2: as Llama 3 but every digit alone (`\p{N}` instead of `\p{N}{1,3}`).
    Qwen2,
}

/// The input text decoded into code points, with what the passes need to know about each.
struct Cps {
    cps: Vec<u32>,
    classes: Vec<Class>,
}

/// One segment being split: positions are indices into the code points; `None` stands for "no
/// code point here", which is what the hand-written rules see past either end of the segment.
struct Seg<'a> {
    cps: &'a Cps,
    start: usize,
    end: usize,
    prev_end: usize,
    out: &'a mut Vec<usize>,
}

impl Seg<'_> {
    fn cp(&self, pos: usize) -> Option<u32> {
        (self.start <= pos && pos < self.end).then(|| self.cps.cps[pos])
    }

    fn class(&self, pos: usize) -> Option<Class> {
        (self.start <= pos && pos < self.end).then(|| self.cps.classes[pos])
    }

    fn letter(&self, pos: usize) -> bool {
        self.class(pos).is_some_and(Class::is_letter)
    }

    fn number(&self, pos: usize) -> bool {
        self.class(pos).is_some_and(Class::is_number)
    }

    fn space(&self, pos: usize) -> bool {
        self.class(pos).is_some_and(|c| c.whitespace)
    }

    /// "Anything else": a code point that is neither whitespace, letter nor number. Past the
    /// segment's ends there is no code point, so this is false there.
    fn other(&self, pos: usize) -> bool {
        self.class(pos)
            .is_some_and(|c| !(c.whitespace || c.is_letter() || c.is_number()))
    }

    /// Ends the current word at `end` (an empty word is dropped); returns its length.
    fn emit(&mut self, end: usize) -> usize {
        let len = end - self.prev_end;
        if len > 0 {
            self.out.push(len);
        }
        self.prev_end = end;
        len
    }
}

impl PreTokenizer {
    /// Splits `text` into words, as byte ranges of `text` that cover it in order.
    pub fn split(self, text: &str) -> Vec<Range<usize>> {
        let mut byte_offsets = Vec::with_capacity(text.len() + 1);
        let mut cps = Vec::with_capacity(text.len());
        for (i, c) in text.char_indices() {
            byte_offsets.push(i);
            cps.push(c as u32);
        }
        byte_offsets.push(text.len());
        let classes = cps.iter().map(|&c| unicode::class(c)).collect();
        let cps = Cps { cps, classes };

        let mut segs = vec![cps.cps.len()];
        let passes: &[Pass] = match self {
            PreTokenizer::Default => &[
                Pass::PunctRuns,
                Pass::Gpt2,
                Pass::NumberRuns,
                Pass::AsciiDigitTriples,
            ],
            PreTokenizer::Gpt2 => &[Pass::Gpt2],
            PreTokenizer::StarCoder => &[Pass::EachNumber, Pass::Gpt2],
            PreTokenizer::Llama3 => &[Pass::Llama3 { max_digits: 3 }],
            PreTokenizer::Qwen2 => &[Pass::Llama3 { max_digits: 1 }],
        };
        for pass in passes {
            segs = pass.run(&cps, &segs);
        }

        let mut words = Vec::with_capacity(segs.len());
        let mut at = 0;
        for len in segs {
            words.push(byte_offsets[at]..byte_offsets[at + len]);
            at += len;
        }
        words
    }
}

#[derive(Debug, Clone, Copy)]
enum Pass {
    Gpt2,
    Llama3 {
        max_digits: usize,
    },
    /// `[\p{P}\$\+<=>\^~\|]+` as llama.cpp's `std::regex` sees it (see [`in_punct_run`]).
    PunctRuns,
    /// `\p{N}+`.
    NumberRuns,
    /// `\p{N}`.
    EachNumber,
    /// `[0-9][0-9][0-9]`.
    AsciiDigitTriples,
}

impl Pass {
    fn run(self, cps: &Cps, segs: &[usize]) -> Vec<usize> {
        let mut out = Vec::with_capacity(segs.len() * 2);
        let mut start = 0;
        for &len in segs {
            let mut seg = Seg {
                cps,
                start,
                end: start + len,
                prev_end: start,
                out: &mut out,
            };
            match self {
                Pass::Gpt2 => gpt2(&mut seg),
                Pass::Llama3 { max_digits } => llama3(&mut seg, max_digits),
                Pass::PunctRuns => split_matches(&mut seg, |s, p| run_of(s, p, in_punct_run)),
                Pass::NumberRuns => split_matches(&mut seg, |s, p| run_of(s, p, in_number_class)),
                Pass::EachNumber => {
                    split_matches(&mut seg, |s, p| in_number_class(s.cps, p).then_some(p + 1))
                }
                Pass::AsciiDigitTriples => split_matches(&mut seg, |s, p| {
                    (p + 3 <= s.end
                        && s.cps.cps[p..p + 3]
                            .iter()
                            .all(|&c| (b'0' as u32..=b'9' as u32).contains(&c)))
                    .then_some(p + 3)
                }),
            }
            start += len;
        }
        out
    }
}

/// llama.cpp's `std::regex` passes see non-ASCII code points collapsed to one byte per category,
/// with whitespace taking precedence; `\p{P}` inside the brackets becomes that byte plus a list
/// of ASCII punctuation. The effect: ASCII punctuation and symbols except the backtick, and
/// non-ASCII punctuation (not symbols).
fn in_punct_run(cps: &Cps, p: usize) -> bool {
    let c = cps.cps[p];
    if c < 0x80 {
        matches!(c as u8, b'!'..=b'/' | b':'..=b'@' | b'['..=b'^' | b'_' | b'{'..=b'~')
    } else {
        let class = cps.classes[p];
        !class.whitespace && class.cat == Cat::Punctuation
    }
}

/// `\p{N}` through the same collapsing: ASCII digits, or a non-ASCII number.
fn in_number_class(cps: &Cps, p: usize) -> bool {
    let c = cps.cps[p];
    if c < 0x80 {
        (b'0' as u32..=b'9' as u32).contains(&c)
    } else {
        let class = cps.classes[p];
        !class.whitespace && class.cat == Cat::Number
    }
}

/// The end of the longest run of `member`s starting at `p`, if there is at least one.
fn run_of(seg: &Seg, p: usize, member: fn(&Cps, usize) -> bool) -> Option<usize> {
    let mut end = p;
    while end < seg.end && member(seg.cps, end) {
        end += 1;
    }
    (end > p).then_some(end)
}

/// Splits a segment the way iterating over regex matches does: every leftmost match becomes a
/// word, and so does every gap between matches. `matches_at(seg, p)` gives the end of a match
/// starting at `p`.
fn split_matches(seg: &mut Seg, matches_at: impl Fn(&Seg, usize) -> Option<usize>) {
    let mut p = seg.start;
    while p < seg.end {
        match matches_at(seg, p) {
            Some(end) => {
                seg.emit(p);
                seg.emit(end);
                p = end;
            }
            None => p += 1,
        }
    }
    seg.emit(seg.end);
}

const APOSTROPHE: u32 = '\'' as u32;
const SPACE: u32 = ' ' as u32;
const CR: u32 = '\r' as u32;
const LF: u32 = '\n' as u32;

fn is_cr_or_lf(c: Option<u32>) -> bool {
    matches!(c, Some(CR | LF))
}

/// The contraction suffixes after an apostrophe: the length of the match at `pos` (the
/// apostrophe) if there is one. Llama 3 and Qwen2 compare case-insensitively, GPT-2 does not.
/// Only ASCII letters can match: no non-ASCII code point lower-cases to one of these letters.
fn contraction(seg: &Seg, pos: usize, ignore_case: bool) -> Option<usize> {
    if seg.cp(pos) != Some(APOSTROPHE) || pos + 1 >= seg.end {
        return None;
    }
    let fold = |c: Option<u32>| -> Option<u8> {
        let c = u8::try_from(c?).ok()?;
        Some(if ignore_case {
            c.to_ascii_lowercase()
        } else {
            c
        })
    };
    let next = fold(seg.cp(pos + 1));
    if matches!(next, Some(b's' | b't' | b'm' | b'd')) {
        return Some(2);
    }
    if pos + 2 < seg.end {
        let pair = (next, fold(seg.cp(pos + 2)));
        if matches!(
            pair,
            (Some(b'r'), Some(b'e')) | (Some(b'v'), Some(b'e')) | (Some(b'l'), Some(b'l'))
        ) {
            return Some(3);
        }
    }
    None
}

/// Whitespace at `pos`: `\s+(?!\S)` leaves the last whitespace code point for the next word
/// when something follows in the segment; otherwise (`\s+`) the whole run is one word.
fn whitespace_or_single(seg: &mut Seg, mut pos: usize) -> usize {
    let mut n = 0;
    while seg.space(pos + n) {
        n += 1;
    }
    if n > 1 && seg.cp(pos + n).is_some() {
        pos += n - 1;
    } else if n > 0 {
        pos += n;
    } else {
        // Nothing matched: the code point is a word by itself.
        pos += 1;
    }
    seg.emit(pos);
    pos
}

fn gpt2(seg: &mut Seg) {
    let mut pos = seg.start;
    while pos < seg.end {
        if let Some(n) = contraction(seg, pos, false) {
            pos += seg.emit(pos + n);
            continue;
        }
        // An optional single space, then a run of one class.
        let lead = usize::from(seg.cp(pos) == Some(SPACE));
        let head = pos + lead;
        let class_test: Option<fn(&Seg, usize) -> bool> = if seg.letter(head) {
            Some(|s, p| s.letter(p))
        } else if seg.number(head) {
            Some(|s, p| s.number(p))
        } else if seg.other(head) {
            Some(|s, p| s.other(p))
        } else {
            None
        };
        if let Some(test) = class_test {
            pos = head;
            while test(seg, pos) {
                pos += 1;
            }
            seg.emit(pos);
            continue;
        }
        pos = whitespace_or_single(seg, pos);
    }
}

fn llama3(seg: &mut Seg, max_digits: usize) {
    let mut pos = seg.start;
    while pos < seg.end {
        if let Some(n) = contraction(seg, pos, true) {
            pos += seg.emit(pos + n);
            continue;
        }
        let cp = seg.cp(pos);
        let class = seg.class(pos);

        // [^\r\n\p{L}\p{N}]?\p{L}+
        if !is_cr_or_lf(cp) && !seg.number(pos) && (seg.letter(pos) || seg.letter(pos + 1)) {
            pos += 1;
            while seg.letter(pos) {
                pos += 1;
            }
            seg.emit(pos);
            continue;
        }

        // \p{N}{1,max_digits}: a long run of digits becomes several words.
        if seg.number(pos) {
            let mut group_start = pos;
            while seg.number(pos) {
                pos += 1;
                if pos - group_start >= max_digits {
                    seg.emit(pos);
                    group_start = pos;
                }
            }
            seg.emit(pos);
            continue;
        }

        // ` ?[^\s\p{L}\p{N}]+[\r\n]*`. llama.cpp tests the code point after an optional space,
        // but requires only that the code point at `pos` exists, so a lone space at the very end
        // of the segment is taken here (the result is the same one-space word as `\s+`).
        let lead = usize::from(cp == Some(SPACE));
        let head_class = if lead == 1 { seg.class(pos + 1) } else { class };
        let head_is_other =
            !head_class.is_some_and(|c| c.whitespace || c.is_letter() || c.is_number());
        if head_is_other && class.is_some() {
            pos += lead;
            while seg.other(pos) {
                pos += 1;
            }
            while is_cr_or_lf(seg.cp(pos)) {
                pos += 1;
            }
            seg.emit(pos);
            continue;
        }

        // \s*[\r\n]+ : whitespace up to and including its last line break.
        let mut n = 0;
        let mut after_last_break = None;
        while seg.space(pos + n) {
            if is_cr_or_lf(seg.cp(pos + n)) {
                after_last_break = Some(pos + n + 1);
            }
            n += 1;
        }
        if let Some(end) = after_last_break {
            pos = end;
            seg.emit(pos);
            continue;
        }

        pos = whitespace_or_single(seg, pos);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(p: PreTokenizer, text: &str) -> Vec<&str> {
        p.split(text).into_iter().map(|r| &text[r]).collect()
    }

    #[test]
    fn gpt2_basics() {
        assert_eq!(
            words(PreTokenizer::Gpt2, "Hello world's  3.14\n\n x"),
            ["Hello", " world", "'s", " ", " 3", ".", "14", "\n\n", " x"]
        );
        assert_eq!(words(PreTokenizer::Gpt2, "DON'T"), ["DON", "'", "T"]);
    }

    #[test]
    fn llama3_basics() {
        assert_eq!(
            words(PreTokenizer::Llama3, "I'm DON'T 1234567 a\n\n  b   "),
            ["I", "'m", " DON", "'T", " ", "123", "456", "7", " a", "\n\n", " ", " b", "   "]
        );
    }

    #[test]
    fn qwen2_digits_alone() {
        assert_eq!(
            words(PreTokenizer::Qwen2, "x=123"),
            ["x", "=", "1", "2", "3"]
        );
    }

    #[test]
    fn default_passes() {
        assert_eq!(
            words(PreTokenizer::Default, "a+b 12345"),
            ["a", "+", "b", " ", "123", "45"]
        );
    }

    #[test]
    fn empty() {
        assert!(PreTokenizer::Gpt2.split("").is_empty());
    }
}
