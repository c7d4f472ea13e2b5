//! GPT-2's byte-level alphabet: every byte gets a printable code point so that a byte-level BPE
//! vocabulary can be stored as text. Printable Latin-1 bytes map to themselves; the other 68
//! bytes (controls, space, DEL, NBSP, soft hyphen) map in order to U+0100, U+0101, ...
//! (so space becomes `Ġ` U+0120 and newline `Ċ` U+010A).

use std::sync::OnceLock;

struct Tables {
    /// byte -> code point.
    to_char: [char; 256],
    /// code point -> byte, for the 256 code points in use (all below U+0144).
    from_char: [Option<u8>; 0x144],
}

fn keeps_itself(b: u8) -> bool {
    matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)
}

fn tables() -> &'static Tables {
    static TABLES: OnceLock<Tables> = OnceLock::new();
    TABLES.get_or_init(|| {
        let mut to_char = ['\0'; 256];
        let mut from_char = [None; 0x144];
        let mut next = 0x100u32;
        for b in 0..=255u8 {
            let cp = if keeps_itself(b) {
                b as u32
            } else {
                let cp = next;
                next += 1;
                cp
            };
            // Every cp is below U+0144, a valid scalar value.
            to_char[b as usize] = char::from_u32(cp).unwrap_or('\0');
            from_char[cp as usize] = Some(b);
        }
        Tables { to_char, from_char }
    })
}

/// The code point standing for `b`.
pub(crate) fn byte_to_char(b: u8) -> char {
    tables().to_char[b as usize]
}

/// The byte a code point stands for, if it is one of the 256 in the alphabet.
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    tables().from_char.get(c as usize).copied().flatten()
}

/// Appends the byte-level encoding of `bytes` to `out`.
pub(crate) fn encode_into(bytes: &[u8], out: &mut String) {
    for &b in bytes {
        out.push(byte_to_char(b));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_known_values() {
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(byte_to_char(b'a'), 'a');
        assert_eq!(byte_to_char(0xAD), '\u{143}');
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(byte_to_char(b)), Some(b));
        }
        assert_eq!(char_to_byte('\u{144}'), None);
        assert_eq!(char_to_byte('€'), None);
    }
}
