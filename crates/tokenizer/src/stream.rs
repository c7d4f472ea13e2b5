//! Turning generated ids into text as they come.

use crate::Tokenizer;

/// Decodes ids one at a time into complete UTF-8 chunks.
///
/// A token may end in the middle of a character (byte-fallback tokens such as `<0xF0>`, or
/// byte-level BPE pieces of an emoji): those bytes are held back until the character is
/// complete. Bytes that can never become valid UTF-8 are replaced by U+FFFD as soon as that is
/// certain, so a bad sequence cannot stall the stream.
///
/// ```no_run
/// # fn demo(tokenizer: &synaptix_tokenizer::Tokenizer, ids: &[u32]) {
/// let mut stream = tokenizer.stream_decoder();
/// for &id in ids {
///     print!("{}", stream.push(id));
/// }
/// print!("{}", stream.finish());
/// # }
/// ```
#[derive(Debug)]
pub struct StreamDecoder<'t> {
    tokenizer: &'t Tokenizer,
    pending: Vec<u8>,
    render_special: bool,
}

impl<'t> StreamDecoder<'t> {
    /// A decoder that renders special tokens as their text, like
    /// [`Tokenizer::token_to_piece`].
    pub fn new(tokenizer: &'t Tokenizer) -> StreamDecoder<'t> {
        StreamDecoder {
            tokenizer,
            pending: Vec::new(),
            render_special: true,
        }
    }

    /// Whether control tokens are rendered as their text (default) or give nothing.
    pub fn render_special(mut self, on: bool) -> StreamDecoder<'t> {
        self.render_special = on;
        self
    }

    /// Adds one id; returns the text that is complete now (empty while a character is still
    /// incomplete). Ids outside the vocabulary add nothing.
    pub fn push(&mut self, id: u32) -> String {
        let piece = if self.render_special {
            self.tokenizer.piece(id)
        } else {
            self.tokenizer.piece_plain(id)
        };
        self.push_bytes(piece.unwrap_or(&[]))
    }

    /// Adds raw bytes; returns the text that is complete now (possibly empty).
    pub fn push_bytes(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        let mut start = 0;
        loop {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(s) => {
                    out.push_str(s);
                    start = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // SAFETY-free: from_utf8 just validated this prefix.
                    out.push_str(
                        std::str::from_utf8(&self.pending[start..start + valid]).unwrap_or(""),
                    );
                    start += valid;
                    match e.error_len() {
                        // Invalid whatever follows: replace it and go on.
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            start += n;
                        }
                        // A character that may still be completed by the next token.
                        None => break,
                    }
                }
            }
        }
        self.pending.drain(..start);
        out
    }

    /// Bytes held back, waiting for the rest of a character.
    pub fn pending(&self) -> &[u8] {
        &self.pending
    }

    /// Ends the stream: an incomplete character left over becomes U+FFFD. Empty when nothing
    /// was pending; the decoder can then be reused.
    pub fn finish(&mut self) -> String {
        let rest = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        rest
    }
}
