//! A GGUF vocabulary and the tokenizer llama.cpp builds from it.
//!
//! Loading follows llama.cpp's `llama_vocab::impl::load` rule for rule, because its side effects
//! change token ids: tokens whose text looks like an end-of-turn or fill-in-the-middle marker are
//! promoted to control tokens (so `</s>` written in a prompt becomes one token when special
//! tokens are parsed), user-defined tokens are split out of the text even when special tokens are
//! not parsed, and so on.

use std::collections::HashMap;

use aho_corasick::AhoCorasick;
use synaptix_bundle::GgufFile;

use crate::bpe::{self, Merges};
use crate::byte_level;
use crate::error::{Result, TokenizerError};
use crate::pretokenize::PreTokenizer;
use crate::spm::{self, SpmVocab};

/// Token attributes, the bit set llama.cpp derives from `tokenizer.ggml.token_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TokenAttr(u16);

impl TokenAttr {
    pub const UNDEFINED: TokenAttr = TokenAttr(0);
    pub const UNKNOWN: TokenAttr = TokenAttr(1 << 0);
    pub const UNUSED: TokenAttr = TokenAttr(1 << 1);
    pub const NORMAL: TokenAttr = TokenAttr(1 << 2);
    pub const CONTROL: TokenAttr = TokenAttr(1 << 3);
    pub const USER_DEFINED: TokenAttr = TokenAttr(1 << 4);
    pub const BYTE: TokenAttr = TokenAttr(1 << 5);
    /// Strip whitespace left of the token when splitting it out of text.
    pub const LSTRIP: TokenAttr = TokenAttr(1 << 7);
    /// Strip whitespace right of the token when splitting it out of text.
    pub const RSTRIP: TokenAttr = TokenAttr(1 << 8);

    /// The GGUF token type (`tokenizer.ggml.token_type`) as an attribute.
    pub fn from_token_type(t: i64) -> TokenAttr {
        match t {
            1 => TokenAttr::NORMAL,
            2 => TokenAttr::UNKNOWN,
            3 => TokenAttr::CONTROL,
            4 => TokenAttr::USER_DEFINED,
            5 => TokenAttr::UNUSED,
            6 => TokenAttr::BYTE,
            _ => TokenAttr::UNDEFINED,
        }
    }

    pub fn contains(self, other: TokenAttr) -> bool {
        self.0 & other.0 == other.0
    }

    pub fn intersects(self, other: TokenAttr) -> bool {
        self.0 & other.0 != 0
    }

    pub fn bits(self) -> u16 {
        self.0
    }

    fn set(&mut self, other: TokenAttr, on: bool) {
        if on {
            self.0 |= other.0;
        } else {
            self.0 &= !other.0;
        }
    }
}

impl std::ops::BitOr for TokenAttr {
    type Output = TokenAttr;
    fn bitor(self, rhs: TokenAttr) -> TokenAttr {
        TokenAttr(self.0 | rhs.0)
    }
}

/// Which algorithm turns text fragments into ids.
#[derive(Debug)]
pub(crate) enum Algorithm {
    /// `llama`: SentencePiece-style merges by score with byte fallback.
    Spm,
    /// `gpt2`: byte-level BPE by merge rank after pre-tokenization.
    Bpe {
        pre: PreTokenizer,
        merges: Merges,
        /// Llama 3: a pre-tokenized word that is a token as a whole is taken without merging.
        ignore_merges: bool,
    },
}

#[derive(Debug)]
pub(crate) struct TokenData {
    pub text: Box<str>,
    pub score: f32,
    pub attr: TokenAttr,
}

/// The special token ids llama.cpp tracks.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SpecialIds {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub sep: Option<u32>,
    pub pad: Option<u32>,
    pub mask: Option<u32>,
    pub fim_pre: Option<u32>,
    pub fim_suf: Option<u32>,
    pub fim_mid: Option<u32>,
    pub fim_pad: Option<u32>,
    pub fim_rep: Option<u32>,
    pub fim_sep: Option<u32>,
}

/// Selects one of the [`SpecialIds`] fields, so that lists of keys or names can say which.
type Slot = fn(&mut SpecialIds) -> &mut Option<u32>;

#[derive(Debug)]
pub(crate) struct Vocab {
    pub algorithm: Algorithm,
    pub pre_name: String,
    pub tokens: Vec<TokenData>,
    token_to_id: HashMap<Box<str>, u32>,
    pub special: SpecialIds,
    pub add_bos: bool,
    pub add_eos: bool,
    pub add_space_prefix: bool,
    /// Replace spaces by U+2581 before BPE (SentencePiece-style BPE vocabularies).
    escape_whitespaces: bool,
    /// Detokenization removes spaces before punctuation (`clean_up_tokenization_spaces`).
    clean_spaces: bool,
    /// End-of-generation tokens, sorted.
    pub eog: Vec<u32>,
    /// Control, user-defined and unknown tokens, longest text first: the order in which they
    /// are split out of the text.
    special_order: Vec<u32>,
    /// Finds every occurrence of every token in `special_order` (pattern i is that list's i-th).
    special_matcher: Option<AhoCorasick>,
    /// `token_to_piece` of every token, rendering special tokens.
    pieces: Vec<Box<[u8]>>,
    pub chat_template: Option<String>,
}

// Metadata keys.
const KEY_MODEL: &str = "tokenizer.ggml.model";
const KEY_PRE: &str = "tokenizer.ggml.pre";
const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
const KEY_SCORES: &str = "tokenizer.ggml.scores";
const KEY_TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
const KEY_MERGES: &str = "tokenizer.ggml.merges";

/// Which texts mark which special role when the metadata names no id (llama.cpp's list). When
/// several tokens match, llama.cpp takes whichever its hash map yields first; we take the first
/// name in this order, which gives the same answer for the models we test.
const EOT_NAMES: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_NAMES: &[&str] = &["<|eom_id|>"];
const FIM_PRE_NAMES: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_NAMES: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_NAMES: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_NAMES: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_NAMES: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_NAMES: &[&str] = &["<|file_sep|>"];
/// Texts that end generation.
pub(crate) const EOG_NAMES: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// Pre-tokenizer names and the flags llama.cpp sets with them: (pre-tokenizer,
/// ignore_merges, add_bos default, clean_spaces).
fn pre_tokenizer_for(name: &str) -> Option<(PreTokenizer, bool, bool, bool)> {
    Some(match name {
        "" | "default" => (PreTokenizer::Default, false, false, true),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" => (PreTokenizer::Llama3, true, true, true),
        "dbrx" | "smaug-bpe" => (PreTokenizer::Llama3, false, false, true),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" => {
            (PreTokenizer::Qwen2, false, false, false)
        }
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de"
        | "a.x-4.0" | "mellum" | "modern-bert" | "mpt" => (PreTokenizer::Gpt2, false, false, true),
        "starcoder" => (PreTokenizer::StarCoder, false, false, true),
        _ => return None,
    })
}

impl Vocab {
    pub fn from_gguf(file: &GgufFile) -> Result<Vocab> {
        let model = file
            .get_str(KEY_MODEL)?
            .ok_or(TokenizerError::MissingKey(KEY_MODEL))?
            .to_string();
        let pre_name = file.get_str(KEY_PRE)?.unwrap_or("").to_string();

        // Defaults per model family, overridden by metadata below.
        let mut special = SpecialIds::default();
        let mut add_bos;
        let mut add_eos = false;
        let mut add_space_prefix;
        let clean_spaces;
        let escape_whitespaces;
        let algorithm_kind;
        match model.as_str() {
            "llama" => {
                special.bos = Some(1);
                special.eos = Some(2);
                special.unk = Some(0);
                add_bos = true;
                add_space_prefix = true;
                clean_spaces = false;
                escape_whitespaces = true;
                algorithm_kind = None;
            }
            "gpt2" => {
                special.bos = Some(11);
                special.eos = Some(11);
                let (pre, ignore_merges, bos, clean) = pre_tokenizer_for(&pre_name)
                    .ok_or_else(|| TokenizerError::UnsupportedPreTokenizer(pre_name.clone()))?;
                add_bos = bos;
                add_space_prefix = false;
                clean_spaces = clean;
                escape_whitespaces = false;
                algorithm_kind = Some((pre, ignore_merges));
            }
            other => return Err(TokenizerError::UnsupportedModel(other.to_string())),
        }
        if let Some(v) = file.get_bool("tokenizer.ggml.add_space_prefix")? {
            add_space_prefix = v;
        }

        let texts = file
            .get_str_array(KEY_TOKENS)?
            .ok_or(TokenizerError::MissingKey(KEY_TOKENS))?;
        let n = texts.len();
        if n == 0 {
            return Err(TokenizerError::InvalidKey {
                key: KEY_TOKENS,
                problem: "the token list is empty".into(),
            });
        }
        if n > u32::MAX as usize {
            return Err(TokenizerError::InvalidKey {
                key: KEY_TOKENS,
                problem: format!("{n} tokens do not fit 32-bit ids"),
            });
        }
        let scores = file.get_f64_array(KEY_SCORES)?;
        if let Some(s) = &scores {
            check_len(KEY_SCORES, s.len(), n)?;
        }
        let types = match file.get_array(KEY_TOKEN_TYPE)? {
            None => None,
            Some(values) => {
                check_len(KEY_TOKEN_TYPE, values.len(), n)?;
                let types = values
                    .iter()
                    .map(|v| v.as_i64())
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| TokenizerError::InvalidKey {
                        key: KEY_TOKEN_TYPE,
                        problem: "expected an array of integers".into(),
                    })?;
                Some(types)
            }
        };

        let mut tokens = Vec::with_capacity(n);
        let mut token_to_id = HashMap::with_capacity(n);
        for (i, text) in texts.iter().enumerate() {
            // llama.cpp renames empty tokens so that every text is unique and non-empty.
            let text: Box<str> = if text.is_empty() {
                format!("[EMPTY_{i}]").into()
            } else {
                (*text).into()
            };
            // A text listed twice maps to its last id, as in llama.cpp.
            token_to_id.insert(text.clone(), i as u32);
            tokens.push(TokenData {
                text,
                score: scores.as_ref().map_or(0.0, |s| s[i] as f32),
                attr: types
                    .as_ref()
                    .map_or(TokenAttr::NORMAL, |t| TokenAttr::from_token_type(t[i])),
            });
        }

        let algorithm = match algorithm_kind {
            None => Algorithm::Spm,
            Some((pre, ignore_merges)) => {
                let merges = file
                    .get_str_array(KEY_MERGES)?
                    .ok_or(TokenizerError::MissingKey(KEY_MERGES))?;
                Algorithm::Bpe {
                    pre,
                    merges: Merges::new(merges),
                    ignore_merges,
                }
            }
        };

        // Special ids: a default outside the vocabulary is dropped; a metadata value outside it
        // is ignored (llama.cpp warns and keeps the default).
        for id in [&mut special.bos, &mut special.eos, &mut special.unk] {
            if id.is_some_and(|v| v as usize >= n) {
                *id = None;
            }
        }
        let keys: [(&str, Slot); 17] = [
            ("tokenizer.ggml.bos_token_id", |s| &mut s.bos),
            ("tokenizer.ggml.eos_token_id", |s| &mut s.eos),
            ("tokenizer.ggml.eot_token_id", |s| &mut s.eot),
            ("tokenizer.ggml.eom_token_id", |s| &mut s.eom),
            ("tokenizer.ggml.unknown_token_id", |s| &mut s.unk),
            ("tokenizer.ggml.seperator_token_id", |s| &mut s.sep),
            ("tokenizer.ggml.padding_token_id", |s| &mut s.pad),
            ("tokenizer.ggml.mask_token_id", |s| &mut s.mask),
            ("tokenizer.ggml.fim_pre_token_id", |s| &mut s.fim_pre),
            ("tokenizer.ggml.fim_suf_token_id", |s| &mut s.fim_suf),
            ("tokenizer.ggml.fim_mid_token_id", |s| &mut s.fim_mid),
            ("tokenizer.ggml.fim_pad_token_id", |s| &mut s.fim_pad),
            ("tokenizer.ggml.fim_rep_token_id", |s| &mut s.fim_rep),
            ("tokenizer.ggml.fim_sep_token_id", |s| &mut s.fim_sep),
            // Deprecated spellings of the first three FIM ids.
            ("tokenizer.ggml.prefix_token_id", |s| &mut s.fim_pre),
            ("tokenizer.ggml.suffix_token_id", |s| &mut s.fim_suf),
            ("tokenizer.ggml.middle_token_id", |s| &mut s.fim_mid),
        ];
        for (key, slot) in keys {
            // A negative id (some converters write -1) means "none": same as absent.
            if let Some(v) = file.get(key).and_then(|v| v.as_i64()) {
                if v >= 0 && (v as u64) < n as u64 {
                    *slot(&mut special) = Some(v as u32);
                }
            }
        }
        if let Some(v) = file.get_bool("tokenizer.ggml.add_bos_token")? {
            add_bos = v;
        }
        if let Some(v) = file.get_bool("tokenizer.ggml.add_eos_token")? {
            add_eos = v;
        }

        let mut vocab = Vocab {
            algorithm,
            pre_name,
            tokens,
            token_to_id,
            special,
            add_bos,
            add_eos,
            add_space_prefix,
            escape_whitespaces,
            clean_spaces,
            eog: Vec::new(),
            special_order: Vec::new(),
            special_matcher: None,
            pieces: Vec::new(),
            chat_template: file.get_str("tokenizer.chat_template")?.map(str::to_string),
        };
        vocab.detect_special_tokens();
        vocab.build_special_order()?;
        vocab.pieces = (0..n as u32).map(|id| vocab.compute_piece(id)).collect();
        let general_name = file.get_str("general.name")?.unwrap_or("").to_lowercase();
        let arch = file.get_str("general.architecture")?.unwrap_or("");
        vocab.apply_model_specific_attrs(&general_name, arch);
        Ok(vocab)
    }

    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.token_to_id.get(text).copied()
    }

    pub fn attr(&self, id: u32) -> Option<TokenAttr> {
        self.tokens.get(id as usize).map(|t| t.attr)
    }

    fn promote_to_control(&mut self, id: u32) {
        self.tokens[id as usize].attr.set(TokenAttr::CONTROL, true);
    }

    /// The first token, by the order of `names`, whose text is one of them.
    fn find_by_names(&self, names: &[&str]) -> Option<u32> {
        names.iter().find_map(|name| self.token_id(name))
    }

    /// llama.cpp's detection of special roles and end-of-generation tokens by text.
    fn detect_special_tokens(&mut self) {
        let lists: [(&[&str], Slot); 8] = [
            (EOT_NAMES, |s| &mut s.eot),
            (EOM_NAMES, |s| &mut s.eom),
            (FIM_PRE_NAMES, |s| &mut s.fim_pre),
            (FIM_SUF_NAMES, |s| &mut s.fim_suf),
            (FIM_MID_NAMES, |s| &mut s.fim_mid),
            (FIM_PAD_NAMES, |s| &mut s.fim_pad),
            (FIM_REP_NAMES, |s| &mut s.fim_rep),
            (FIM_SEP_NAMES, |s| &mut s.fim_sep),
        ];
        for (names, slot) in lists {
            if slot(&mut self.special).is_none() {
                if let Some(id) = self.find_by_names(names) {
                    *slot(&mut self.special) = Some(id);
                    // Found by its text: make sure it is treated as a control token.
                    self.promote_to_control(id);
                }
            }
        }

        // Control tokens named "unused..." are placeholders.
        for t in &mut self.tokens {
            if t.attr.contains(TokenAttr::CONTROL) && t.text.contains("unused") {
                t.attr.set(TokenAttr::UNUSED, true);
            }
        }

        let mut eog = std::collections::BTreeSet::new();
        let s = self.special;
        eog.extend(s.fim_pad);
        eog.extend(s.fim_rep);
        eog.extend(s.fim_sep);
        for name in EOG_NAMES {
            if let Some(id) = self.token_id(name) {
                eog.insert(id);
                self.promote_to_control(id);
            }
        }
        // gpt-oss: these structural tokens must always be rendered.
        for name in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
            if let Some(id) = self.token_id(name) {
                self.tokens[id as usize].attr = TokenAttr::USER_DEFINED;
            }
        }
        eog.extend(s.eos);
        eog.extend(s.eot);
        eog.extend(s.eom);

        let find = |eog: &std::collections::BTreeSet<u32>, text: &str| {
            eog.iter()
                .copied()
                .find(|&id| self.tokens[id as usize].text.as_ref() == text)
        };
        let has = |eog: &std::collections::BTreeSet<u32>, text: &str| find(eog, text).is_some();
        // o200k_harmony and solar-open end a message with <|end|> but do not stop there.
        let call = has(&eog, "<|call|>") || has(&eog, "<|calls|>");
        let drop_end = call && (has(&eog, "<|return|>") || has(&eog, "<|flush|>"));
        let end_id = find(&eog, "<|end|>");
        // Gemma 4 and PLaMo have an ordinary </s>.
        let normal_s = has(&eog, "<|tool_response>") || has(&eog, "<|plamo:eos|>");
        let s_id = find(&eog, "</s>");
        if let (true, Some(id)) = (drop_end, end_id) {
            eog.remove(&id);
            self.tokens[id as usize].attr = TokenAttr::USER_DEFINED;
        }
        if let (true, Some(id)) = (normal_s, s_id) {
            eog.remove(&id);
            self.tokens[id as usize].attr = TokenAttr::NORMAL;
        }
        self.eog = eog.into_iter().collect();
    }

    fn build_special_order(&mut self) -> Result<()> {
        let kinds = TokenAttr::CONTROL | TokenAttr::USER_DEFINED | TokenAttr::UNKNOWN;
        let mut order: Vec<u32> = (0..self.tokens.len() as u32)
            .filter(|&id| self.tokens[id as usize].attr.intersects(kinds))
            .collect();
        // Longest first so that a token containing another wins. llama.cpp's sort leaves ties
        // unordered; ties only matter for equal-length tokens overlapping in the text.
        order.sort_by(|&a, &b| {
            let la = self.tokens[a as usize].text.len();
            let lb = self.tokens[b as usize].text.len();
            lb.cmp(&la).then(a.cmp(&b))
        });
        self.special_matcher = if order.is_empty() {
            None
        } else {
            let patterns = order
                .iter()
                .map(|&id| self.tokens[id as usize].text.as_bytes());
            Some(
                AhoCorasick::new(patterns).map_err(|e| TokenizerError::InvalidKey {
                    key: KEY_TOKENS,
                    problem: format!("cannot index the special tokens: {e}"),
                })?,
            )
        };
        self.special_order = order;
        Ok(())
    }

    /// llama.cpp sets strip flags for a few model families by name.
    fn apply_model_specific_attrs(&mut self, general_name: &str, arch: &str) {
        let set = |vocab: &mut Vocab, text: &str, attr: TokenAttr, on: bool| {
            if let Some(id) = vocab.token_id(text) {
                vocab.tokens[id as usize].attr.set(attr, on);
            }
        };
        let any = |s: &str, subs: &[&str]| subs.iter().any(|sub| s.contains(sub));
        if any(
            &self.pre_name,
            &["jina-v2-de", "jina-v2-es", "jina-v2-code"],
        ) || any(arch, &["nomic-bert-moe", "jina-bert-v3"])
        {
            set(self, "<mask>", TokenAttr::LSTRIP, true);
        } else if any(general_name, &["phi-3", "phi3"]) {
            for id in self.special_order.clone() {
                self.tokens[id as usize].attr.set(TokenAttr::RSTRIP, true);
            }
            set(self, "</s>", TokenAttr::RSTRIP, true);
            for t in ["<unk>", "<s>", "<|endoftext|>"] {
                set(self, t, TokenAttr::RSTRIP, false);
            }
        } else if any(general_name, &["modern-bert"]) {
            set(self, "[MASK]", TokenAttr::LSTRIP, true);
        }
    }

    /// The bytes a token stands for, special tokens rendered as their text (llama.cpp's
    /// `token_to_piece` with `special = true`).
    fn compute_piece(&self, id: u32) -> Box<[u8]> {
        let t = &self.tokens[id as usize];
        let attr = t.attr;
        let text = t.text.as_ref();
        if attr.intersects(TokenAttr::UNKNOWN | TokenAttr::CONTROL | TokenAttr::USER_DEFINED) {
            return text.as_bytes().into();
        }
        if attr.contains(TokenAttr::NORMAL) {
            let spm_style = matches!(self.algorithm, Algorithm::Spm) || self.escape_whitespaces;
            return if spm_style {
                text.replace('\u{2581}', " ").into_bytes().into()
            } else {
                byte_level_decode(text).into()
            };
        }
        if attr.contains(TokenAttr::BYTE) {
            return [byte_token_value(text)].into();
        }
        // Unused or undefined: nothing to show.
        Box::new([])
    }

    pub fn piece(&self, id: u32) -> Option<&[u8]> {
        self.pieces.get(id as usize).map(|p| &p[..])
    }

    /// Rendering without special tokens: control and unknown tokens give nothing (llama.cpp's
    /// `token_to_piece` with `special = false`).
    pub fn piece_plain(&self, id: u32) -> Option<&[u8]> {
        let attr = self.attr(id)?;
        if attr.intersects(TokenAttr::UNKNOWN | TokenAttr::CONTROL) {
            return Some(&[]);
        }
        self.piece(id)
    }

    /// Splits `text` into raw-text fragments and special tokens, as llama.cpp's
    /// `tokenizer_st_partition`: special tokens are taken longest first; each takes all its
    /// non-overlapping occurrences (leftmost first) in what is still raw text. Control and
    /// unknown tokens are only recognised when `parse_special`; user-defined ones always.
    fn partition<'t>(&self, text: &'t str, parse_special: bool) -> Vec<Fragment<'t>> {
        let Some(matcher) = &self.special_matcher else {
            return vec![Fragment::Text(text)];
        };
        // All occurrences of all special tokens, grouped by the token's place in the order.
        let mut found: Vec<(usize, usize)> = matcher
            .find_overlapping_iter(text)
            .map(|m| (m.pattern().as_usize(), m.start()))
            .collect();
        if found.is_empty() {
            return vec![Fragment::Text(text)];
        }
        found.sort_unstable();

        // Per byte: still raw text, or taken (by a token or by whitespace stripping).
        let bytes = text.as_bytes();
        let mut taken = vec![false; bytes.len()];
        let mut tokens_at: Vec<(usize, u32)> = Vec::new();
        for &(rank, start) in &found {
            let id = self.special_order[rank];
            let data = &self.tokens[id as usize];
            if !parse_special
                && data
                    .attr
                    .intersects(TokenAttr::CONTROL | TokenAttr::UNKNOWN)
            {
                continue;
            }
            let end = start + data.text.len();
            if taken[start..end].iter().any(|&t| t) {
                continue;
            }
            taken[start..end].iter_mut().for_each(|t| *t = true);
            tokens_at.push((start, id));
            if data.attr.contains(TokenAttr::LSTRIP) {
                let mut i = start;
                while i > 0 && !taken[i - 1] && is_c_space(bytes[i - 1]) {
                    i -= 1;
                    taken[i] = true;
                }
            }
            if data.attr.contains(TokenAttr::RSTRIP) {
                let mut i = end;
                while i < bytes.len() && !taken[i] && is_c_space(bytes[i]) {
                    taken[i] = true;
                    i += 1;
                }
            }
        }
        if tokens_at.is_empty() {
            return vec![Fragment::Text(text)];
        }
        tokens_at.sort_unstable();

        let mut fragments = Vec::with_capacity(tokens_at.len() * 2 + 1);
        let mut next_token = tokens_at.iter().peekable();
        let mut i = 0;
        while i < bytes.len() {
            if let Some(&&(start, id)) = next_token.peek() {
                if start == i {
                    fragments.push(Fragment::Token(id));
                    i += self.tokens[id as usize].text.len();
                    next_token.next();
                    continue;
                }
            }
            if taken[i] {
                // Stripped whitespace.
                i += 1;
                continue;
            }
            let run_start = i;
            while i < bytes.len() && !taken[i] {
                i += 1;
            }
            // Token texts are whole UTF-8 sequences, so the run lies on character boundaries.
            fragments.push(Fragment::Text(&text[run_start..i]));
        }
        fragments
    }

    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        let fragments = if text.is_empty() {
            Vec::new()
        } else {
            self.partition(text, parse_special)
        };
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            out.push(
                self.special
                    .bos
                    .ok_or(TokenizerError::MissingSpecialToken("BOS"))?,
            );
        }
        match &self.algorithm {
            Algorithm::Spm => {
                // A space is prefixed to text at the start and after every special token.
                let mut after_special = true;
                for fragment in fragments {
                    match fragment {
                        Fragment::Text(raw) => {
                            let mut s = String::with_capacity(raw.len() + 3);
                            if self.add_space_prefix && after_special {
                                s.push(' ');
                            }
                            s.push_str(raw);
                            let s = s.replace(' ', "\u{2581}");
                            spm::tokenize(&s, self, &mut out)?;
                            after_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(id);
                            after_special = true;
                        }
                    }
                }
            }
            Algorithm::Bpe {
                pre,
                merges,
                ignore_merges,
            } => {
                let mut encoded = String::new();
                for fragment in fragments {
                    match fragment {
                        Fragment::Text(raw) => {
                            let escaped;
                            let raw = if self.escape_whitespaces {
                                escaped = raw.replace(' ', "\u{2581}");
                                escaped.as_str()
                            } else {
                                raw
                            };
                            for word in pre.split(raw) {
                                encoded.clear();
                                byte_level::encode_into(raw[word].as_bytes(), &mut encoded);
                                self.bpe_word(&encoded, merges, *ignore_merges, &mut out);
                            }
                        }
                        Fragment::Token(id) => out.push(id),
                    }
                }
            }
        }
        if add_special && self.add_eos {
            out.push(
                self.special
                    .eos
                    .ok_or(TokenizerError::MissingSpecialToken("EOS"))?,
            );
        }
        Ok(out)
    }

    fn bpe_word(&self, word: &str, merges: &Merges, ignore_merges: bool, out: &mut Vec<u32>) {
        if ignore_merges {
            if let Some(id) = self.token_id(word) {
                out.push(id);
                return;
            }
        }
        for (start, len) in bpe::merge_word(word, merges) {
            let piece = &word[start..start + len];
            match self.token_id(piece) {
                Some(id) => out.push(id),
                None => {
                    // llama.cpp looks each byte of the piece up as a one-byte token; bytes of a
                    // multi-byte character find none and are dropped. With a complete byte-level
                    // vocabulary every symbol is a token and this never happens.
                    for b in piece.as_bytes() {
                        let one = [*b];
                        if let Some(id) = std::str::from_utf8(&one)
                            .ok()
                            .and_then(|s| self.token_id(s))
                        {
                            out.push(id);
                        }
                    }
                }
            }
        }
    }

    /// llama.cpp's `detokenize`: the pieces joined, optionally without the BOS/EOS the
    /// vocabulary adds and with special tokens rendered or not. Ids outside the vocabulary are
    /// skipped.
    pub fn detokenize(&self, ids: &[u32], remove_special: bool, unparse_special: bool) -> Vec<u8> {
        let mut ids = ids;
        // With a space prefix the first piece's leading space is an artefact of encoding.
        let mut remove_space = self.add_space_prefix;
        if remove_special
            && self.add_bos
            && self.special.bos.is_some()
            && ids.first().copied() == self.special.bos
        {
            // llama.cpp keeps the space in this case.
            remove_space = false;
            ids = &ids[1..];
        }
        if remove_special
            && self.add_eos
            && self.special.eos.is_some()
            && ids.last().copied() == self.special.eos
        {
            ids = &ids[..ids.len() - 1];
        }
        let mut text = Vec::new();
        for &id in ids {
            let piece = if unparse_special {
                self.piece(id)
            } else {
                self.piece_plain(id)
            };
            let Some(mut piece) = piece else { continue };
            if remove_space && piece.first() == Some(&b' ') {
                piece = &piece[1..];
            }
            remove_space = false;
            text.extend_from_slice(piece);
        }
        if self.clean_spaces {
            clean_up_spaces(&mut text);
        }
        text
    }
}

impl SpmVocab for Vocab {
    fn token_id(&self, text: &str) -> Option<u32> {
        Vocab::token_id(self, text)
    }

    fn score(&self, id: u32) -> f32 {
        self.tokens[id as usize].score
    }

    fn byte_token(&self, byte: u8) -> Result<u32, TokenizerError> {
        let hex = format!("<0x{byte:02X}>");
        if let Some(id) = self.token_id(&hex) {
            return Ok(id);
        }
        let one = [byte];
        std::str::from_utf8(&one)
            .ok()
            .and_then(|s| self.token_id(s))
            .ok_or(TokenizerError::NoByteToken(byte))
    }
}

enum Fragment<'t> {
    Text(&'t str),
    Token(u32),
}

/// `isspace` in the C locale.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

fn check_len(key: &'static str, len: usize, n_tokens: usize) -> Result<()> {
    if len < n_tokens {
        return Err(TokenizerError::InvalidKey {
            key,
            problem: format!("{len} entries for {n_tokens} tokens"),
        });
    }
    Ok(())
}

/// The byte of a `<0xXX>` token: two hex digits at offset 3, parsed leniently as `strtol`
/// would (stopping at the first non-hex character).
fn byte_token_value(text: &str) -> u8 {
    let digits = text.as_bytes().get(3..5).unwrap_or(&[]);
    let mut v: u32 = 0;
    for &d in digits {
        match (d as char).to_digit(16) {
            Some(x) => v = v * 16 + x,
            None => break,
        }
    }
    v as u8
}

/// A byte-level BPE token's text back to bytes. A character outside the byte alphabet cannot
/// come from encoding; llama.cpp then writes a marker with the character's bytes and the whole
/// token text, which is reproduced for identical output.
fn byte_level_decode(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for c in text.chars() {
        match byte_level::char_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                out.extend_from_slice(b"[UNK_BYTE_0x");
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(text.as_bytes());
                out.push(b']');
            }
        }
    }
    out
}

/// `clean_up_tokenization_spaces` as llama.cpp applies it to detokenized BPE text: drop the
/// space before `?!.,`, around a lone `'`, and before the contractions `'s 'm 're 've`.
fn clean_up_spaces(text: &mut Vec<u8>) {
    // Pass 1: " ?", " !", " .", " ,".
    let mut out: Vec<u8> = Vec::with_capacity(text.len());
    for (i, &x) in text.iter().enumerate() {
        if i > 0 && text[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            out.pop();
        }
        out.push(x);
    }
    // Pass 2: " ' " becomes "'". llama.cpp works in place and blanks the space after the
    // apostrophe with a NUL, so the character after that space never counts as preceded by a
    // space; `t` is mutated the same way to keep that.
    let mut t = std::mem::take(&mut out);
    let mut i = 0;
    while i < t.len() {
        let x = t[i];
        if i > 0 && x == b'\'' && i + 1 < t.len() && t[i - 1] == b' ' && t[i + 1] == b' ' {
            out.pop();
            out.push(x);
            t[i + 1] = 0;
            i += 2;
            continue;
        }
        out.push(x);
        i += 1;
    }
    // Pass 3: " 's", " 'm", " 're", " 've" lose their space.
    let t = std::mem::take(&mut out);
    for (i, &x) in t.iter().enumerate() {
        if i > 0 && t[i - 1] == b' ' && x == b'\'' && i + 1 < t.len() {
            let x1 = t[i + 1];
            let x2 = t.get(i + 2).copied();
            let drop = matches!(x1, b's' | b'm')
                || (i + 2 < t.len() && matches!((x1, x2), (b'r', Some(b'e')) | (b'v', Some(b'e'))));
            if drop {
                out.pop();
            }
        }
        out.push(x);
    }
    *text = out;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_token_values() {
        assert_eq!(byte_token_value("<0x0A>"), 10);
        assert_eq!(byte_token_value("<0xFF>"), 255);
        assert_eq!(byte_token_value("<0x"), 0);
    }

    #[test]
    fn clean_spaces_like_llama_cpp() {
        let run = |s: &str| {
            let mut v = s.as_bytes().to_vec();
            clean_up_spaces(&mut v);
            String::from_utf8(v).unwrap()
        };
        assert_eq!(run("Hello , world !"), "Hello, world!");
        assert_eq!(run("a ' b"), "a'b");
        assert_eq!(
            run("it 's I 'm we 're they 've you 'll don 't"),
            "it's I'm we're they've you 'll don 't"
        );
        assert_eq!(run(" ."), ".");
        // The space after a removed " ' " no longer counts for the next apostrophe.
        assert_eq!(run("a ' ' b"), "a'' b");
    }

    #[test]
    fn byte_level_decode_marks_foreign_chars() {
        assert_eq!(byte_level_decode("Ġhi"), b" hi");
        assert_eq!(
            byte_level_decode("a€"),
            b"a[UNK_BYTE_0xe282aca\xe2\x82\xac]"
        );
    }
}
