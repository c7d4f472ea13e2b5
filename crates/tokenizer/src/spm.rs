//! SentencePiece-style BPE as llama.cpp runs it for `llama` vocabularies: start from single
//! characters and repeatedly merge the adjacent pair whose concatenation is the vocabulary token
//! with the highest score; characters left without a token fall back to `<0xXX>` byte tokens.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::error::TokenizerError;

/// What the algorithm needs from the vocabulary.
pub(crate) trait SpmVocab {
    fn token_id(&self, text: &str) -> Option<u32>;
    fn score(&self, id: u32) -> f32;
    /// The token standing for one raw byte.
    fn byte_token(&self, byte: u8) -> Result<u32, TokenizerError>;
}

#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

#[derive(Debug)]
struct Candidate {
    score: f32,
    left: usize,
    right: usize,
    len: usize,
}

impl Ord for Candidate {
    /// Max-heap order: the highest score first, and among equal scores the leftmost pair, as in
    /// llama.cpp's queue. `total_cmp` keeps the order total even for a NaN score.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Candidate {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Candidate {}

/// Tokenizes `text` (spaces already replaced by U+2581) and appends the ids to `out`.
pub(crate) fn tokenize(
    text: &str,
    vocab: &impl SpmVocab,
    out: &mut Vec<u32>,
) -> Result<(), TokenizerError> {
    let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
    for (i, (start, c)) in text.char_indices().enumerate() {
        symbols.push(Symbol {
            start,
            len: c.len_utf8(),
            prev: i.checked_sub(1),
            next: None,
        });
        if i > 0 {
            symbols[i - 1].next = Some(i);
        }
    }
    if symbols.is_empty() {
        return Ok(());
    }

    let mut queue = BinaryHeap::new();
    let push = |queue: &mut BinaryHeap<Candidate>, symbols: &[Symbol], left: usize| {
        let Some(right) = symbols[left].next else {
            return;
        };
        let (l, r) = (&symbols[left], &symbols[right]);
        // Adjacent symbols are contiguous in the text, so the pair is one slice.
        let len = l.len + r.len;
        if let Some(id) = vocab.token_id(&text[l.start..l.start + len]) {
            queue.push(Candidate {
                score: vocab.score(id),
                left,
                right,
                len,
            });
        }
    };
    for i in 0..symbols.len() - 1 {
        push(&mut queue, &symbols, i);
    }

    while let Some(c) = queue.pop() {
        let (l, r) = (symbols[c.left], symbols[c.right]);
        // Stale if either side was merged away or has grown since the pair was queued.
        if l.len == 0 || r.len == 0 || l.len + r.len != c.len {
            continue;
        }
        symbols[c.left].len += r.len;
        symbols[c.left].next = r.next;
        symbols[c.right].len = 0;
        if let Some(n) = r.next {
            symbols[n].prev = Some(c.left);
        }
        if let Some(p) = symbols[c.left].prev {
            push(&mut queue, &symbols, p);
        }
        push(&mut queue, &symbols, c.left);
    }

    // Every merged symbol is a token by construction; a single character may not be, and then
    // its bytes are emitted as byte tokens.
    let mut at = Some(0);
    while let Some(i) = at {
        let s = symbols[i];
        let piece = &text[s.start..s.start + s.len];
        match vocab.token_id(piece) {
            Some(id) => out.push(id),
            None => {
                for &b in piece.as_bytes() {
                    out.push(vocab.byte_token(b)?);
                }
            }
        }
        at = s.next;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    struct Toy {
        ids: HashMap<&'static str, u32>,
        scores: Vec<f32>,
    }

    impl Toy {
        fn new(tokens: &[(&'static str, f32)]) -> Toy {
            Toy {
                ids: tokens
                    .iter()
                    .enumerate()
                    .map(|(i, (t, _))| (*t, i as u32))
                    .collect(),
                scores: tokens.iter().map(|t| t.1).collect(),
            }
        }
    }

    impl SpmVocab for Toy {
        fn token_id(&self, text: &str) -> Option<u32> {
            self.ids.get(text).copied()
        }
        fn score(&self, id: u32) -> f32 {
            self.scores[id as usize]
        }
        fn byte_token(&self, byte: u8) -> Result<u32, TokenizerError> {
            Ok(1000 + byte as u32)
        }
    }

    #[test]
    fn merges_by_score_and_falls_back_to_bytes() {
        let v = Toy::new(&[
            ("a", 0.0),
            ("b", 0.0),
            ("ab", -1.0),
            ("bc", -0.5),
            ("c", 0.0),
        ]);
        let mut out = Vec::new();
        // "bc" scores higher than "ab": a + bc.
        tokenize("abc", &v, &mut out).unwrap();
        assert_eq!(out, [0, 3]);
        out.clear();
        tokenize("aé", &v, &mut out).unwrap();
        assert_eq!(out, [0, 1000 + 0xC3, 1000 + 0xA9]);
    }
}
