//! Code point classes used by the pre-tokenizers: the Unicode general category (from a table
//! generated for the Unicode version llama.cpp uses, see `tools/gen_unicode_table.py`) and the
//! `White_Space` property.

use crate::unicode_table::CATEGORY_RANGES;

/// Major general category of a code point (the first letter of `Lu`, `Nd`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cat {
    /// `Cn`: no character assigned.
    Unassigned,
    /// `Cc`, `Cf`, `Co`, `Cs`.
    Other,
    Letter,
    Mark,
    Number,
    Punctuation,
    Symbol,
    Separator,
}

/// Category and whitespace of one code point, as the hand-written splitters test them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Class {
    pub cat: Cat,
    pub whitespace: bool,
}

impl Class {
    pub fn is_letter(self) -> bool {
        self.cat == Cat::Letter
    }

    pub fn is_number(self) -> bool {
        self.cat == Cat::Number
    }
}

/// The Unicode `White_Space` property (PropList.txt), which is what llama.cpp calls whitespace.
/// Spelled out rather than taken from `char::is_whitespace` so that it is pinned here together
/// with the category table; note that Python's `str.isspace` differs (it adds U+001C..U+001F).
pub(crate) fn is_whitespace(c: u32) -> bool {
    matches!(
        c,
        0x09..=0x0D
            | 0x20
            | 0x85
            | 0xA0
            | 0x1680
            | 0x2000..=0x200A
            | 0x2028
            | 0x2029
            | 0x202F
            | 0x205F
            | 0x3000
    )
}

pub(crate) fn category(c: u32) -> Cat {
    if c < 0x80 {
        return ASCII_CATS[c as usize];
    }
    // The ranges are sorted by start: the owning range is the last one starting at or before c.
    let idx = CATEGORY_RANGES.partition_point(|&(start, _)| start <= c);
    if idx == 0 {
        Cat::Unassigned
    } else {
        CATEGORY_RANGES[idx - 1].1
    }
}

pub(crate) fn class(c: u32) -> Class {
    Class {
        cat: category(c),
        whitespace: is_whitespace(c),
    }
}

/// ASCII is by far the most common input: a direct table avoids the binary search.
static ASCII_CATS: [Cat; 128] = {
    let mut t = [Cat::Other; 128];
    let mut i = 0;
    while i < 128 {
        let b = i as u8;
        t[i] = if b.is_ascii_alphabetic() {
            Cat::Letter
        } else if b.is_ascii_digit() {
            Cat::Number
        } else if b == b' ' {
            Cat::Separator
        } else if b < 0x20 || b == 0x7F {
            Cat::Other
        } else if matches!(
            b,
            b'$' | b'+' | b'<' | b'=' | b'>' | b'^' | b'`' | b'|' | b'~'
        ) {
            Cat::Symbol
        } else {
            Cat::Punctuation
        };
        i += 1;
    }
    t
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ascii_table_agrees_with_generated_ranges() {
        for c in 0u32..0x80 {
            let idx = CATEGORY_RANGES.partition_point(|&(start, _)| start <= c);
            assert_eq!(
                ASCII_CATS[c as usize],
                CATEGORY_RANGES[idx - 1].1,
                "U+{c:04X}"
            );
        }
    }

    #[test]
    fn spot_checks() {
        assert_eq!(category('é' as u32), Cat::Letter);
        assert_eq!(category('中' as u32), Cat::Letter);
        assert_eq!(category('٣' as u32), Cat::Number);
        assert_eq!(category('½' as u32), Cat::Number);
        assert_eq!(category('\u{0301}' as u32), Cat::Mark);
        assert_eq!(category('€' as u32), Cat::Symbol);
        assert_eq!(category('😀' as u32), Cat::Symbol);
        assert_eq!(category('\u{200D}' as u32), Cat::Other);
        assert_eq!(category('、' as u32), Cat::Punctuation);
        // Assigned in Unicode 15.1 (CJK extension I), unassigned before.
        assert_eq!(category(0x2EBF0), Cat::Letter);
        // Assigned only in Unicode 16: llama.cpp's tables (15.1) leave it unassigned.
        assert_eq!(category(0x0897), Cat::Unassigned);
        assert_eq!(category(0x10FFFF), Cat::Unassigned);
        assert!(is_whitespace(0x3000) && is_whitespace(0x85) && !is_whitespace(0x200B));
    }
}
