//! Byte-pair encoding of one pre-tokenized word by merge rank, as llama.cpp does it.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

/// The merge table: `tokenizer.ggml.merges` entries `"left right"`, ranked by position.
///
/// Merges are looked up by the text of two adjacent symbols. The symbol texts are interned so
/// that a lookup borrows slices of the word instead of allocating a key per candidate pair.
#[derive(Debug, Default)]
pub(crate) struct Merges {
    parts: HashMap<Box<str>, u32>,
    ranks: HashMap<(u32, u32), u32>,
}

impl Merges {
    /// Builds the table; a merge listed twice keeps its first (best) rank. An entry is split at
    /// its first space after the first byte, so a left part may itself start with a space; an
    /// entry without such a space pairs two empty strings, which can never match.
    pub fn new<'a>(entries: impl IntoIterator<Item = &'a str>) -> Merges {
        let mut merges = Merges::default();
        for (rank, entry) in entries.into_iter().enumerate() {
            // Searched as bytes: the first character may be longer than one byte.
            let space = entry
                .as_bytes()
                .iter()
                .skip(1)
                .position(|&b| b == b' ')
                .map(|i| i + 1);
            let (left, right) = match space {
                Some(i) => (&entry[..i], &entry[i + 1..]),
                None => ("", ""),
            };
            let l = merges.intern(left);
            let r = merges.intern(right);
            merges.ranks.entry((l, r)).or_insert(rank as u32);
        }
        merges
    }

    fn intern(&mut self, s: &str) -> u32 {
        let next = self.parts.len() as u32;
        *self.parts.entry(s.into()).or_insert(next)
    }

    pub fn rank(&self, left: &str, right: &str) -> Option<u32> {
        let l = *self.parts.get(left)?;
        let r = *self.parts.get(right)?;
        self.ranks.get(&(l, r)).copied()
    }
}

#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate merge of symbol `left` with its right neighbour `right`.
#[derive(Debug, PartialEq, Eq)]
struct Candidate {
    rank: u32,
    left: usize,
    right: usize,
    /// Combined byte length when queued: if either symbol changed since, the entry is stale.
    len: usize,
}

impl Ord for Candidate {
    /// Max-heap order: the best candidate is the lowest rank, and among equal ranks the
    /// leftmost, which is the order llama.cpp's queue pops them in.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .rank
            .cmp(&self.rank)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Merges `word` (already byte-level encoded) and returns the byte ranges of its final symbols.
pub(crate) fn merge_word(word: &str, merges: &Merges) -> Vec<(usize, usize)> {
    let mut symbols: Vec<Symbol> = Vec::with_capacity(word.len());
    for (i, (start, c)) in word.char_indices().enumerate() {
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

    let text = |s: &Symbol| &word[s.start..s.start + s.len];
    let mut queue = BinaryHeap::new();
    let push = |queue: &mut BinaryHeap<Candidate>, symbols: &[Symbol], left: usize| {
        let Some(right) = symbols[left].next else {
            return;
        };
        let (l, r) = (&symbols[left], &symbols[right]);
        if let Some(rank) = merges.rank(text(l), text(r)) {
            queue.push(Candidate {
                rank,
                left,
                right,
                len: l.len + r.len,
            });
        }
    };
    for i in 0..symbols.len().saturating_sub(1) {
        push(&mut queue, &symbols, i);
    }

    while let Some(c) = queue.pop() {
        let (l, r) = (symbols[c.left], symbols[c.right]);
        // A symbol only grows by absorbing its right neighbour, so the pair is unchanged exactly
        // when both are alive, still adjacent, and of the same combined length.
        if l.len == 0 || r.len == 0 || l.next != Some(c.right) || l.len + r.len != c.len {
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

    symbols
        .iter()
        .filter(|s| s.len > 0)
        .map(|s| (s.start, s.len))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(word: &str, merges: &Merges) -> Vec<String> {
        merge_word(word, merges)
            .into_iter()
            .map(|(s, l)| word[s..s + l].to_string())
            .collect()
    }

    #[test]
    fn merges_by_rank() {
        let m = Merges::new(["l o", "lo w", "e r", "low er"]);
        assert_eq!(pieces("lower", &m), ["lower"]);
        assert_eq!(pieces("lowe", &m), ["low", "e"]);
        assert_eq!(pieces("", &m), Vec::<String>::new());
    }

    #[test]
    fn leftmost_wins_ties() {
        // "aaa": both pairs have the rank of "a a": the left one merges first.
        let m = Merges::new(["a a"]);
        assert_eq!(pieces("aaa", &m), ["aa", "a"]);
    }

    #[test]
    fn entry_split_at_first_space_after_first_byte() {
        let m = Merges::new(["  x"]);
        assert_eq!(m.rank(" ", "x"), Some(0));
        let m = Merges::new(["é x"]);
        assert_eq!(m.rank("é", "x"), Some(0));
        let m = Merges::new(["nospace"]);
        assert_eq!(m.rank("", ""), Some(0));
    }
}
