//! espeak-ng, opened at run time, used the way Piper's `espeakbridge` uses it: text in, one
//! [`Clause`] per clause out (IPA phonemes, the punctuation that ended the clause, and whether
//! it ended a sentence).
//!
//! The library is found by `dlopen`: `$SYNAPTIX_ESPEAK_LIB` if set, else `libespeak-ng.so.1`
//! (Debian/Ubuntu package `libespeak-ng1`). Its data directory is the library's own default
//! unless `$SYNAPTIX_ESPEAK_DATA` names one (the `espeak-ng-data` directory or its parent).
//! Nothing is linked at build time; a missing library is [`TokenizerError::EspeakNotFound`].
//!
//! espeak-ng keeps global state and is not thread-safe: it is initialised once per process and
//! every call goes through one process-wide mutex.
//!
//! Terminators. Piper calls `espeak_TextToPhonemesWithTerminator` (espeak-ng 1.52), which
//! reports the clause type espeak-ng's reader found. When the loaded library has it, it is used
//! the same way. Older libraries (Debian 12 ships 1.51) only have `espeak_TextToPhonemes`, which
//! returns the phonemes and advances the text pointer; the terminator is then recovered from the
//! text each call consumed (see `infer_end`), which gives the same clauses, terminators and
//! sentence ends as 1.52 on everything tested (tests/fixtures/piper/phonemes.json). The
//! phonemes themselves are the library's: 1.51 and 1.52 differ on a few vowels.

use std::borrow::Cow;
use std::ffi::{c_char, c_int, c_void, CStr, CString, OsString};
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use crate::error::{Result, TokenizerError};

/// Environment variable naming the espeak-ng shared library to open (a path or a soname).
pub const LIB_ENV: &str = "SYNAPTIX_ESPEAK_LIB";
/// Environment variable naming espeak-ng's data directory.
pub const DATA_ENV: &str = "SYNAPTIX_ESPEAK_DATA";
/// What is opened without [`LIB_ENV`].
pub const DEFAULT_LIB: &str = "libespeak-ng.so.1";

/// One clause as espeak-ng reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Clause {
    /// IPA, words separated by spaces; `(en)`-style language-switch flags are left in (Piper
    /// removes them later).
    pub phonemes: String,
    /// `.`, `?`, `!`, `,`, `:`, `;`, or empty (no punctuation, an ellipsis, a paragraph break,
    /// punctuation that needs no following space such as `。`).
    pub terminator: String,
    /// Whether espeak-ng's clause type is a sentence end (`.`, `?`, `!`, their Unicode kin, a
    /// paragraph break, the end of the text).
    pub end_of_sentence: bool,
}

/// Where [`Clause::terminator`] and [`Clause::end_of_sentence`] come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TerminatorSource {
    /// `espeak_TextToPhonemesWithTerminator` (espeak-ng 1.52 and later), as Piper.
    Library,
    /// Recovered from the text each `espeak_TextToPhonemes` call consumed (espeak-ng 1.51).
    Inferred,
}

/// The loaded library.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EspeakInfo {
    /// `espeak_Info`'s version string, e.g. `1.51`.
    pub version: String,
    /// What was given to dlopen.
    pub library: String,
    pub terminators: TerminatorSource,
}

/// The library's version and how terminators are found. Loads and initialises espeak-ng on
/// first use.
pub fn info() -> Result<EspeakInfo> {
    Ok(engine()?.info.clone())
}

/// `text` read by espeak-ng with voice `voice` (an espeak-ng voice name such as `en-us`), one
/// [`Clause`] per clause, as Piper's `espeakbridge.get_phonemes` returns them. Empty text gives
/// one empty clause, as in Piper.
///
/// Errors: the library cannot be loaded or initialised, the voice is unknown, the text contains
/// a NUL character.
pub fn clauses(voice: &str, text: &str) -> Result<Vec<Clause>> {
    engine()?.clauses(voice, text, false)
}

/// As [`clauses`], but with the terminators always recovered from the consumed text, even when
/// the library could report them. For checking that recovery against a 1.52 library.
#[doc(hidden)]
pub fn clauses_inferred(voice: &str, text: &str) -> Result<Vec<Clause>> {
    engine()?.clauses(voice, text, true)
}

// ---------------------------------------------------------------------------------------------
// The library.

type TextToPhonemesFn = unsafe extern "C" fn(*mut *const c_void, c_int, c_int) -> *const c_char;
type TextToPhonemesWithTerminatorFn =
    unsafe extern "C" fn(*mut *const c_void, c_int, c_int, *mut c_int) -> *const c_char;
type SetVoiceByNameFn = unsafe extern "C" fn(*const c_char) -> c_int;
type InfoFn = unsafe extern "C" fn(*mut *const c_char) -> *const c_char;
type InitializePathFn = unsafe extern "C" fn(*const c_char);
type NgInitializeFn = unsafe extern "C" fn(*mut *mut c_void) -> u32;
type InitializeOutputFn = unsafe extern "C" fn(c_int, c_int, *const c_char) -> u32;
type StatusMessageFn = unsafe extern "C" fn(u32, *mut c_char, usize);
type ClearErrorContextFn = unsafe extern "C" fn(*mut *mut c_void);

/// `espeakCHARS_UTF8`.
const CHARS_UTF8: c_int = 1;
/// `espeakPHONEMES_IPA`.
const PHONEMES_IPA: c_int = 0x02;
/// `ENOUTPUT_MODE_SYNCHRONOUS`: no audio device.
const OUTPUT_SYNCHRONOUS: c_int = 0x0001;
/// `ENS_OK`.
const STATUS_OK: u32 = 0;

// Clause types (espeak-ng's translate.h), as espeakbridge compares them.
const CLAUSE_INTONATION_COMMA: c_int = 0x0000_1000;
const CLAUSE_INTONATION_QUESTION: c_int = 0x0000_2000;
const CLAUSE_INTONATION_EXCLAMATION: c_int = 0x0000_3000;
const CLAUSE_TYPE_CLAUSE: c_int = 0x0004_0000;
const CLAUSE_TYPE_SENTENCE: c_int = 0x0008_0000;
const CLAUSE_PERIOD: c_int = 40 | CLAUSE_TYPE_SENTENCE;
const CLAUSE_COMMA: c_int = 20 | CLAUSE_INTONATION_COMMA | CLAUSE_TYPE_CLAUSE;
const CLAUSE_QUESTION: c_int = 40 | CLAUSE_INTONATION_QUESTION | CLAUSE_TYPE_SENTENCE;
const CLAUSE_EXCLAMATION: c_int = 45 | CLAUSE_INTONATION_EXCLAMATION | CLAUSE_TYPE_SENTENCE;
const CLAUSE_COLON: c_int = 30 | CLAUSE_TYPE_CLAUSE;
const CLAUSE_SEMICOLON: c_int = 30 | CLAUSE_INTONATION_COMMA | CLAUSE_TYPE_CLAUSE;

struct Engine {
    /// Keeps the function pointers below valid.
    _lib: libloading::Library,
    text_to_phonemes: TextToPhonemesFn,
    with_terminator: Option<TextToPhonemesWithTerminatorFn>,
    set_voice_by_name: SetVoiceByNameFn,
    info: EspeakInfo,
}

/// Load failures are remembered (the library is opened once per process), so they are kept in a
/// form that can be handed out again.
#[derive(Debug, Clone)]
enum LoadError {
    NotFound { lib: String, reason: String },
    Symbol { lib: String, symbol: &'static str },
    Init { lib: String, message: String },
}

impl From<LoadError> for TokenizerError {
    fn from(e: LoadError) -> TokenizerError {
        match e {
            LoadError::NotFound { lib, reason } => TokenizerError::EspeakNotFound { lib, reason },
            LoadError::Symbol { lib, symbol } => TokenizerError::EspeakSymbol { lib, symbol },
            LoadError::Init { lib, message } => TokenizerError::EspeakInit { lib, message },
        }
    }
}

static ENGINE: OnceLock<std::result::Result<Mutex<Engine>, LoadError>> = OnceLock::new();

/// The process's engine, locked. A poisoned lock (a panic while holding it) is taken over: the
/// guarded state is espeak-ng's, which a Rust panic cannot have left half-written.
fn engine() -> Result<std::sync::MutexGuard<'static, Engine>> {
    match ENGINE.get_or_init(|| Engine::load().map(Mutex::new)) {
        Ok(m) => Ok(m.lock().unwrap_or_else(|e| e.into_inner())),
        Err(e) => Err(e.clone().into()),
    }
}

/// Copies the symbol's address out of the library. `T` must be the symbol's C type.
///
/// # Safety
/// The caller keeps `lib` alive as long as the returned value is used.
unsafe fn symbol<T: Copy>(
    lib: &libloading::Library,
    lib_name: &str,
    name: &'static str,
) -> std::result::Result<T, LoadError> {
    // SAFETY: the caller names a symbol of type `T`; the value is a plain function pointer.
    match unsafe { lib.get::<T>(name) } {
        Ok(s) => Ok(*s),
        Err(_) => Err(LoadError::Symbol {
            lib: lib_name.to_string(),
            symbol: name,
        }),
    }
}

impl Engine {
    fn load() -> std::result::Result<Engine, LoadError> {
        let lib_os: OsString = std::env::var_os(LIB_ENV)
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| DEFAULT_LIB.into());
        let lib_name = lib_os.to_string_lossy().into_owned();
        // SAFETY: opening a shared library runs its initialisers; the library is espeak-ng (the
        // default soname) or the one the user named in SYNAPTIX_ESPEAK_LIB.
        let lib = unsafe { libloading::Library::new(&lib_os) }.map_err(|e| {
            let mut reason = std::error::Error::source(&e)
                .map(|s| s.to_string())
                .unwrap_or_else(|| e.to_string());
            if let Some(rest) = reason.strip_prefix(&format!("{lib_name}: ")) {
                reason = rest.to_string();
            }
            LoadError::NotFound {
                lib: lib_name.clone(),
                reason,
            }
        })?;

        // SAFETY (all `symbol` calls): the types are the declarations of espeak-ng's
        // speak_lib.h / espeak_ng.h, and `lib` is stored in the engine with the pointers.
        let text_to_phonemes: TextToPhonemesFn =
            unsafe { symbol(&lib, &lib_name, "espeak_TextToPhonemes")? };
        let with_terminator: Option<TextToPhonemesWithTerminatorFn> =
            unsafe { symbol(&lib, &lib_name, "espeak_TextToPhonemesWithTerminator").ok() };
        let set_voice_by_name: SetVoiceByNameFn =
            unsafe { symbol(&lib, &lib_name, "espeak_SetVoiceByName")? };
        let info_fn: InfoFn = unsafe { symbol(&lib, &lib_name, "espeak_Info")? };
        let initialize_path: InitializePathFn =
            unsafe { symbol(&lib, &lib_name, "espeak_ng_InitializePath")? };
        let initialize: NgInitializeFn =
            unsafe { symbol(&lib, &lib_name, "espeak_ng_Initialize")? };
        let initialize_output: InitializeOutputFn =
            unsafe { symbol(&lib, &lib_name, "espeak_ng_InitializeOutput")? };
        let status_message: StatusMessageFn =
            unsafe { symbol(&lib, &lib_name, "espeak_ng_GetStatusCodeMessage")? };
        let clear_context: ClearErrorContextFn =
            unsafe { symbol(&lib, &lib_name, "espeak_ng_ClearErrorContext")? };

        let init_error = |message: String| LoadError::Init {
            lib: lib_name.clone(),
            message,
        };
        let data: Option<PathBuf> = std::env::var_os(DATA_ENV)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from);
        let data_c = match &data {
            Some(dir) => {
                // espeak-ng silently falls back to its default directory when the one given
                // does not exist: check it here so a typo is an error.
                if !dir.is_dir() {
                    return Err(init_error(format!(
                        "{DATA_ENV}={} is not a directory",
                        dir.display()
                    )));
                }
                let bytes = dir.as_os_str().as_encoded_bytes().to_vec();
                Some(
                    CString::new(bytes)
                        .map_err(|_| init_error(format!("{DATA_ENV} contains a NUL character")))?,
                )
            }
            None => None,
        };
        let message = |status: u32| {
            let mut buf = [0 as c_char; 512];
            // SAFETY: the buffer and its length are passed together; espeak-ng writes a
            // NUL-terminated message of at most that length.
            unsafe { status_message(status, buf.as_mut_ptr(), buf.len()) };
            buf[buf.len() - 1] = 0;
            // SAFETY: NUL-terminated above at the latest.
            let text = unsafe { CStr::from_ptr(buf.as_ptr()) };
            let dir = match &data {
                Some(dir) => format!(", data directory {}", dir.display()),
                None => String::new(),
            };
            format!("{} (status 0x{status:08X}{dir})", text.to_string_lossy())
        };

        // SAFETY: the path is NUL-terminated and outlives the call (espeak-ng copies it).
        unsafe { initialize_path(data_c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr())) };
        let mut context: *mut c_void = std::ptr::null_mut();
        // SAFETY: `context` is an out-parameter espeak-ng may set to an allocated error context,
        // freed right after.
        let status = unsafe { initialize(&mut context) };
        if !context.is_null() {
            // SAFETY: `context` came from espeak_ng_Initialize.
            unsafe { clear_context(&mut context) };
        }
        if status != STATUS_OK {
            return Err(init_error(message(status)));
        }
        // SAFETY: synchronous mode opens no audio device; a null device name is allowed.
        let status = unsafe { initialize_output(OUTPUT_SYNCHRONOUS, 0, std::ptr::null()) };
        if status != STATUS_OK {
            return Err(init_error(message(status)));
        }

        // SAFETY: espeak_Info accepts a null out-parameter and returns a static string.
        let version_ptr = unsafe { info_fn(std::ptr::null_mut()) };
        let version = if version_ptr.is_null() {
            String::new()
        } else {
            // SAFETY: a NUL-terminated static string inside the library.
            unsafe { CStr::from_ptr(version_ptr) }
                .to_string_lossy()
                .into_owned()
        };

        Ok(Engine {
            _lib: lib,
            text_to_phonemes,
            with_terminator,
            set_voice_by_name,
            info: EspeakInfo {
                version,
                library: lib_name,
                terminators: if with_terminator.is_some() {
                    TerminatorSource::Library
                } else {
                    TerminatorSource::Inferred
                },
            },
        })
    }

    fn set_voice(&mut self, voice: &str) -> Result<()> {
        let name = CString::new(voice).map_err(|_| TokenizerError::EspeakVoice(voice.into()))?;
        // SAFETY: a NUL-terminated name that outlives the call; espeak-ng copies what it keeps.
        let status = unsafe { (self.set_voice_by_name)(name.as_ptr()) };
        if status != 0 {
            return Err(TokenizerError::EspeakVoice(voice.into()));
        }
        Ok(())
    }

    fn clauses(&mut self, voice: &str, text: &str, force_infer: bool) -> Result<Vec<Clause>> {
        if text.contains('\0') {
            return Err(TokenizerError::TextHasNul);
        }
        // U+0001 starts an espeak-ng embedded command, which can change the library's settings
        // for the rest of the process (`\x01B1` makes it read punctuation names aloud).
        let text: Cow<str> = if text.contains('\u{1}') {
            text.replace('\u{1}', " ").into()
        } else {
            text.into()
        };
        // Piper selects the voice before every text; selecting it again also resets the
        // translator's per-text state the same way.
        self.set_voice(voice)?;
        let result = self.read(&text, force_infer);
        self.reset_reader();
        result
    }

    /// Reads "a" to its end: whatever the last text left pushed back in espeak-ng's reader (a
    /// text ending in `..` leaves a `.`) is read with it, so the next text starts as it would in
    /// a fresh process. Needs a voice to have been selected.
    fn reset_reader(&mut self) {
        let buf = *b"a\0";
        let base = buf.as_ptr() as usize;
        let mut ptr: *const c_void = buf.as_ptr().cast();
        for _ in 0..4 {
            let offset = (ptr as usize).wrapping_sub(base);
            if ptr.is_null() || offset > 1 {
                break;
            }
            // SAFETY: `ptr` points into `buf`, which is NUL-terminated and alive; the returned
            // phonemes are not read.
            unsafe { (self.text_to_phonemes)(&mut ptr, CHARS_UTF8, PHONEMES_IPA) };
        }
    }

    /// The clauses of `text`, the voice already selected.
    fn read(&mut self, text: &str, force_infer: bool) -> Result<Vec<Clause>> {
        // espeak-ng reads the text through a pointer it advances; the buffer is NUL-terminated
        // and is neither moved nor dropped until the loop ends.
        let mut buf = Vec::with_capacity(text.len() + 1);
        buf.extend_from_slice(text.as_bytes());
        buf.push(0);
        let base = buf.as_ptr() as usize;
        // The pointer may stop on the terminating NUL (one more call reads it), never past it.
        let offset = |p: *const c_void| -> Result<usize> {
            (p as usize)
                .checked_sub(base)
                .filter(|&o| o <= text.len())
                .ok_or_else(|| TokenizerError::Espeak("the text pointer left the text".to_string()))
        };

        let with_terminator = if force_infer {
            None
        } else {
            self.with_terminator
        };
        let mut out = Vec::new();
        let mut ptr: *const c_void = buf.as_ptr().cast();
        // The character espeak-ng read ahead and keeps for the next clause.
        let mut carried: Option<char> = None;
        // Every call consumes at least one byte or the final NUL; more calls than that is a loop.
        let max_calls = text.len() + 2;
        while !ptr.is_null() {
            if out.len() >= max_calls {
                return Err(TokenizerError::Espeak(
                    "espeak-ng does not advance through the text".to_string(),
                ));
            }
            let start = offset(ptr)?;
            let mut clause_type: c_int = 0;
            let phonemes_ptr = match with_terminator {
                // SAFETY: `ptr` points into `buf` (NUL-terminated, alive); espeak-ng advances it
                // or sets it to null, and writes the clause type to a live int.
                Some(f) => unsafe { f(&mut ptr, CHARS_UTF8, PHONEMES_IPA, &mut clause_type) },
                // SAFETY: as above.
                None => unsafe { (self.text_to_phonemes)(&mut ptr, CHARS_UTF8, PHONEMES_IPA) },
            };
            if phonemes_ptr.is_null() {
                return Err(TokenizerError::Espeak(
                    "espeak_TextToPhonemes returned no phonemes".to_string(),
                ));
            }
            // SAFETY: a NUL-terminated string in espeak-ng's static buffer, copied before the
            // next call can overwrite it.
            let phonemes = unsafe { CStr::from_ptr(phonemes_ptr) }
                .to_string_lossy()
                .into_owned();

            let at_end = ptr.is_null();
            let end = if at_end { text.len() } else { offset(ptr)? };
            let (terminator, end_of_sentence) = match with_terminator {
                Some(_) => from_clause_type(clause_type),
                None => {
                    let consumed = text.get(start..end).ok_or_else(|| {
                        TokenizerError::Espeak(
                            "the text pointer moved back or stopped inside a character".to_string(),
                        )
                    })?;
                    // Every clause but the last ends with one character read ahead.
                    let (body, lookahead) = match (at_end, consumed.chars().next_back()) {
                        (false, Some(c)) => (&consumed[..consumed.len() - c.len_utf8()], Some(c)),
                        _ => (consumed, None),
                    };
                    let mut source = String::with_capacity(body.len() + 4);
                    source.extend(carried);
                    source.push_str(body);
                    carried = lookahead;
                    infer_end(&source, lookahead, at_end)
                }
            };
            out.push(Clause {
                phonemes,
                terminator: terminator.to_string(),
                end_of_sentence,
            });
        }
        drop(buf);
        Ok(out)
    }
}

/// espeakbridge's mapping: the clause type without its flag bits, compared with the six
/// punctuation types; anything else (an ellipsis, a paragraph, the end of the text, ...) has no
/// terminator.
fn from_clause_type(clause_type: c_int) -> (&'static str, bool) {
    let t = clause_type & 0x000F_FFFF;
    let terminator = match t {
        CLAUSE_PERIOD => ".",
        CLAUSE_QUESTION => "?",
        CLAUSE_EXCLAMATION => "!",
        CLAUSE_COMMA => ",",
        CLAUSE_COLON => ":",
        CLAUSE_SEMICOLON => ";",
        _ => "",
    };
    (terminator, t & CLAUSE_TYPE_SENTENCE == CLAUSE_TYPE_SENTENCE)
}

// ---------------------------------------------------------------------------------------------
// Recovering the terminator from the consumed text (espeak-ng < 1.52).
//
// espeak_TextToPhonemes reads one clause, plus one character past it that its reader keeps
// (`ungot`) for the next clause; the text pointer stops after that character. So each call's
// clause is: the previous call's read-ahead character, then what this call consumed minus its
// own last character (the whole rest of the text for the last call). `infer_end` replays
// espeak-ng's clause reader (ReadClause in readclause.c, the parts that decide where and how a
// clause ends) over exactly those characters and reports how it ended.

/// Clause punctuation: (character, Piper's terminator, sentence end, needs no space after).
/// Measured on espeak-ng 1.52 through Piper's espeakbridge (`"a{c} b"` and `"a{c}b"` for every
/// code point that is not a letter, mark or digit); 1.51 splits at the same characters.
#[rustfmt::skip]
const PUNCTUATION: &[(char, &str, bool, bool)] = &[
    ('\u{0021}', "!", true, false), // exclamation mark
    ('\u{002c}', ",", false, false), // comma
    ('\u{002e}', ".", true, false), // full stop
    ('\u{003a}', ":", false, false), // colon
    ('\u{003b}', ";", false, false), // semicolon
    ('\u{003f}', "?", true, false), // question mark
    ('\u{00a1}', "", false, true), // inverted exclamation mark
    ('\u{00bf}', "", false, true), // inverted question mark
    ('\u{037e}', "?", true, false), // greek question mark
    ('\u{0387}', ";", false, false), // greek ano teleia
    ('\u{055d}', ",", false, false), // armenian comma
    ('\u{0589}', "", true, true), // armenian full stop
    ('\u{060c}', ",", false, false), // arabic comma
    ('\u{061b}', ";", false, false), // arabic semicolon
    ('\u{061f}', "?", true, false), // arabic question mark
    ('\u{06d4}', ".", true, false), // arabic full stop
    ('\u{0700}', "", true, false), // syriac end of paragraph
    ('\u{0701}', ".", true, false), // syriac supralinear full stop
    ('\u{0702}', ",", false, false), // syriac sublinear full stop
    ('\u{0703}', "!", true, false), // syriac supralinear colon
    ('\u{0704}', ".", true, false), // syriac sublinear colon
    ('\u{0706}', ":", false, false), // syriac colon skewed left
    ('\u{0707}', ":", false, false), // syriac colon skewed right
    ('\u{0708}', ";", false, false), // syriac supralinear colon skewed left
    ('\u{0709}', "?", true, false), // syriac sublinear colon skewed right
    ('\u{07f8}', ",", false, false), // nko comma
    ('\u{07f9}', "!", true, false), // nko exclamation mark
    ('\u{0964}', "", true, true), // devanagari danda
    ('\u{0965}', "", true, false), // devanagari double danda
    ('\u{0df4}', "", true, true), // sinhala punctuation kunddaliya
    ('\u{0f0d}', "", true, true), // tibetan mark shad
    ('\u{0f0e}', "", true, false), // tibetan mark nyis shad
    ('\u{0f14}', ",", false, false), // tibetan mark gter tsheg
    ('\u{10fb}', "", true, false), // georgian paragraph separator
    ('\u{1362}', ".", true, false), // ethiopic full stop
    ('\u{1363}', ",", false, false), // ethiopic comma
    ('\u{1364}', ";", false, false), // ethiopic semicolon
    ('\u{1365}', ":", false, false), // ethiopic colon
    ('\u{1366}', ":", false, false), // ethiopic preface colon
    ('\u{1367}', "?", true, false), // ethiopic question mark
    ('\u{1368}', "", true, false), // ethiopic paragraph separator
    ('\u{166e}', ".", true, false), // canadian syllabics full stop
    ('\u{1801}', "", false, true), // mongolian ellipsis
    ('\u{1802}', ",", false, false), // mongolian comma
    ('\u{1803}', ".", true, false), // mongolian full stop
    ('\u{1804}', ":", false, false), // mongolian colon
    ('\u{1808}', ",", false, false), // mongolian manchu comma
    ('\u{1809}', ".", true, false), // mongolian manchu full stop
    ('\u{1944}', "!", true, false), // limbu exclamation mark
    ('\u{1945}', "?", true, false), // limbu question mark
    ('\u{2013}', ";", false, false), // en dash
    ('\u{2014}', ";", false, false), // em dash
    ('\u{2026}', "", false, true), // horizontal ellipsis
    ('\u{2029}', "", true, false), // paragraph separator
    ('\u{203c}', "!", true, false), // double exclamation mark
    ('\u{2047}', "?", true, false), // double question mark
    ('\u{204f}', ";", false, false), // reversed semicolon
    ('\u{22ee}', "", false, true), // vertical ellipsis
    ('\u{22ef}', "", false, true), // midline horizontal ellipsis
    ('\u{22f0}', "", false, true), // up right diagonal ellipsis
    ('\u{22f1}', "", false, true), // down right diagonal ellipsis
    ('\u{2488}', ".", true, false), // digit one full stop
    ('\u{2489}', ".", true, false), // digit two full stop
    ('\u{248a}', ".", true, false), // digit three full stop
    ('\u{248b}', ".", true, false), // digit four full stop
    ('\u{248c}', ".", true, false), // digit five full stop
    ('\u{248d}', ".", true, false), // digit six full stop
    ('\u{248e}', ".", true, false), // digit seven full stop
    ('\u{248f}', ".", true, false), // digit eight full stop
    ('\u{2490}', ".", true, false), // digit nine full stop
    ('\u{2491}', ".", true, false), // number ten full stop
    ('\u{2492}', ".", true, false), // number eleven full stop
    ('\u{2493}', ".", true, false), // number twelve full stop
    ('\u{2494}', ".", true, false), // number thirteen full stop
    ('\u{2495}', ".", true, false), // number fourteen full stop
    ('\u{2496}', ".", true, false), // number fifteen full stop
    ('\u{2497}', ".", true, false), // number sixteen full stop
    ('\u{2498}', ".", true, false), // number seventeen full stop
    ('\u{2499}', ".", true, false), // number eighteen full stop
    ('\u{249a}', ".", true, false), // number nineteen full stop
    ('\u{249b}', ".", true, false), // number twenty full stop
    ('\u{2753}', "?", true, false), // black question mark ornament
    ('\u{2754}', "?", true, false), // white question mark ornament
    ('\u{2755}', "!", true, false), // white exclamation mark ornament
    ('\u{2757}', "!", true, false), // heavy exclamation mark symbol
    ('\u{2762}', "!", true, false), // heavy exclamation mark ornament
    ('\u{2763}', "!", true, false), // heavy heart exclamation mark ornament
    ('\u{2982}', ":", false, false), // z notation type colon
    ('\u{2cf9}', ".", true, false), // coptic old nubian full stop
    ('\u{2cfa}', "?", true, false), // coptic old nubian direct question mark
    ('\u{2cfb}', "?", true, false), // coptic old nubian indirect question mark
    ('\u{2cfe}', ".", true, false), // coptic full stop
    ('\u{2e32}', ",", false, false), // turned comma
    ('\u{2e33}', ".", true, false), // raised dot
    ('\u{2e34}', ",", false, false), // raised comma
    ('\u{2e35}', ";", false, false), // turned semicolon
    ('\u{2e3a}', ";", false, false), // two-em dash
    ('\u{2e3b}', ";", false, false), // three-em dash
    ('\u{2e3c}', ".", true, false), // stenographic full stop
    ('\u{2e41}', ",", false, false), // reversed comma
    ('\u{3001}', "", false, true), // ideographic comma
    ('\u{3002}', "", true, true), // ideographic full stop
    ('\u{a4fe}', ",", false, false), // lisu punctuation comma
    ('\u{a4ff}', ".", true, false), // lisu punctuation full stop
    ('\u{a60d}', ",", false, false), // vai comma
    ('\u{a60e}', ".", true, false), // vai full stop
    ('\u{a60f}', "?", true, false), // vai question mark
    ('\u{a6f3}', ".", true, false), // bamum full stop
    ('\u{a6f4}', ":", false, false), // bamum colon
    ('\u{a6f5}', ",", false, false), // bamum comma
    ('\u{a6f6}', ";", false, false), // bamum semicolon
    ('\u{a6f7}', "?", true, false), // bamum question mark
    ('\u{fe10}', ",", false, false), // presentation form for vertical comma
    ('\u{fe11}', ",", false, false), // presentation form for vertical ideographic comma
    ('\u{fe12}', ".", true, false), // presentation form for vertical ideographic full stop
    ('\u{fe13}', ":", false, false), // presentation form for vertical colon
    ('\u{fe14}', ";", false, false), // presentation form for vertical semicolon
    ('\u{fe15}', "!", true, false), // presentation form for vertical exclamation mark
    ('\u{fe16}', "?", true, false), // presentation form for vertical question mark
    ('\u{fe19}', "", false, true), // presentation form for vertical horizontal ellipsis
    ('\u{fe31}', ";", false, false), // presentation form for vertical em dash
    ('\u{fe32}', ";", false, false), // presentation form for vertical en dash
    ('\u{fe50}', ",", false, false), // small comma
    ('\u{fe51}', ",", false, false), // small ideographic comma
    ('\u{fe52}', ".", true, false), // small full stop
    ('\u{fe54}', ";", false, false), // small semicolon
    ('\u{fe55}', ":", false, false), // small colon
    ('\u{fe56}', "?", true, false), // small question mark
    ('\u{fe57}', "!", true, false), // small exclamation mark
    ('\u{ff01}', "", true, true), // fullwidth exclamation mark
    ('\u{ff0c}', "", false, true), // fullwidth comma
    ('\u{ff0e}', "", true, true), // fullwidth full stop
    ('\u{ff1a}', "", false, true), // fullwidth colon
    ('\u{ff1b}', "", false, true), // fullwidth semicolon
    ('\u{ff1f}', "", true, true), // fullwidth question mark
    ('\u{ff61}', ".", true, false), // halfwidth ideographic full stop
    ('\u{ff64}', ",", false, false), // halfwidth ideographic comma
    ('\u{11143}', "?", true, false), // chakma question mark
    ('\u{1144d}', ",", false, false), // newa comma
    ('\u{12471}', ":", false, false), // cuneiform punctuation sign vertical colon
    ('\u{12472}', ":", false, false), // cuneiform punctuation sign diagonal colon
    ('\u{16af5}', ".", true, false), // bassa vah full stop
    ('\u{1bc9f}', ".", true, false), // duployan punctuation chinook full stop
    ('\u{1da87}', ",", false, false), // signwriting comma
    ('\u{1da88}', ".", true, false), // signwriting full stop
    ('\u{1da89}', ";", false, false), // signwriting semicolon
    ('\u{1da8a}', ":", false, false), // signwriting colon
    ('\u{1e95e}', "!", true, false), // adlam initial exclamation mark
    ('\u{1e95f}', "?", true, false), // adlam initial question mark
    ('\u{1f100}', ".", true, false), // digit zero full stop
    ('\u{1f101}', ",", false, false), // digit zero comma
    ('\u{1f102}', ",", false, false), // digit one comma
    ('\u{1f103}', ",", false, false), // digit two comma
    ('\u{1f104}', ",", false, false), // digit three comma
    ('\u{1f105}', ",", false, false), // digit four comma
    ('\u{1f106}', ",", false, false), // digit five comma
    ('\u{1f107}', ",", false, false), // digit six comma
    ('\u{1f108}', ",", false, false), // digit seven comma
    ('\u{1f109}', ",", false, false), // digit eight comma
    ('\u{1f10a}', ",", false, false), // digit nine comma
];

#[derive(Debug, Clone, Copy, PartialEq)]
struct Punct {
    terminator: &'static str,
    sentence: bool,
    optional_space: bool,
}

fn punct(c: char) -> Option<Punct> {
    PUNCTUATION
        .binary_search_by(|e| e.0.cmp(&c))
        .ok()
        .map(|i| Punct {
            terminator: PUNCTUATION[i].1,
            sentence: PUNCTUATION[i].2,
            optional_space: PUNCTUATION[i].3,
        })
}

/// espeak-ng's `iswspace`: Unicode White_Space without the no-break spaces (U+00A0, U+2007,
/// U+202F) and the ASCII separators U+001C..U+001F (measured through Piper's espeakbridge).
fn is_space(c: char) -> bool {
    c.is_whitespace() && !matches!(c, '\u{a0}' | '\u{2007}' | '\u{202f}' | '\u{1c}'..='\u{1f}')
}

/// espeak-ng's `iswalnum`.
fn is_alnum(c: char) -> bool {
    c.is_alphanumeric()
}

/// Characters espeak-ng's clause reader skips (its default `chars_ignore`: soft hyphen, zero-width
/// non-joiner and joiner).
fn is_ignored(c: char) -> bool {
    matches!(c, '\u{ad}' | '\u{200c}' | '\u{200d}')
}

/// espeak-ng's `IsBracket`: brackets, quotes, and U+2014..U+201F.
fn is_bracket(c: char) -> bool {
    matches!(
        c,
        '(' | ')'
            | '['
            | ']'
            | '{'
            | '}'
            | '<'
            | '>'
            | '"'
            | '\''
            | '`'
            | '\u{ab}'
            | '\u{bb}'
            | '\u{300a}'
            | '\u{300b}'
            | '\u{e03c}'
            | '\u{2014}'..='\u{201f}'
    )
}

/// The characters espeak-ng's reader takes, with its one-character push-back.
struct Reader {
    chars: Vec<char>,
    pos: usize,
    ungot: Option<char>,
    /// Whether the text ends after `chars` (which then end with the terminating NUL). If not,
    /// what follows is unknown: the reader never got there.
    text_ends: bool,
}

impl Reader {
    /// `GetC`; `None` past the characters espeak-ng is known to have read.
    fn get(&mut self) -> Option<char> {
        if let Some(c) = self.ungot.take() {
            return Some(c);
        }
        match self.chars.get(self.pos) {
            Some(&c) => {
                self.pos += 1;
                Some(c)
            }
            None if self.text_ends => Some('\0'),
            None => None,
        }
    }

    /// `UngetC`: one slot, and pushing back NUL pushes back nothing.
    fn unget(&mut self, c: char) {
        self.ungot = (c != '\0').then_some(c);
    }

    /// `Eof`.
    fn eof(&self) -> bool {
        self.ungot.is_none() && self.text_ends && self.pos >= self.chars.len()
    }
}

/// How espeak-ng ended a clause, from what it read for it.
///
/// - `source`: the clause's characters as espeak-ng read them (the previous clause's read-ahead
///   character, then this call's consumed text without its own read-ahead character);
/// - `lookahead`: the read-ahead character, `None` for the text's last clause;
/// - `at_end`: whether this was the text's last clause.
///
/// Returns Piper's (terminator, end of sentence).
fn infer_end(source: &str, lookahead: Option<char>, at_end: bool) -> (&'static str, bool) {
    let mut chars: Vec<char> = source.chars().collect();
    chars.extend(lookahead);
    if at_end {
        chars.push('\0');
    }
    let mut reader = Reader {
        chars,
        pos: 0,
        ungot: None,
        text_ends: at_end,
    };
    match replay(&mut reader) {
        Some(end) => end,
        // The reader would have gone on: the clause was cut because espeak-ng's buffer filled
        // (no terminator, not a sentence end), or the replay and espeak-ng disagree.
        None => ("", at_end),
    }
}

/// ReadClause's end-of-clause decisions. `None`: no end before the characters run out.
fn replay(r: &mut Reader) -> Option<(&'static str, bool)> {
    let mut c2 = r.get()?;
    let mut any_alnum = false;
    while !r.eof() {
        let mut c1 = c2;
        c2 = r.get()?;
        if r.eof() {
            c2 = ' ';
        }
        if is_ignored(c1) {
            continue;
        }
        if is_alnum(c1) {
            any_alnum = true;
        }

        if c1 == '\n' {
            // Two newlines (whitespace between them skipped) end a paragraph.
            let mut newlines = 0;
            while !r.eof() && is_space(c2) {
                if c2 == '\n' {
                    newlines += 1;
                }
                c2 = r.get()?;
            }
            if newlines > 0 {
                r.unget(c2);
                return Some(("", true));
            }
        }

        if c1 == '.' && c2 == '.' {
            // Three or more dots are an ellipsis.
            let mut next = r.get()?;
            while next == '.' {
                c1 = '\u{2026}';
                c2 = ' ';
                next = r.get()?;
            }
            if c1 == '\u{2026}' {
                c2 = next;
            } else {
                r.unget(next);
            }
        }

        let Some(kind) = punct(c1) else {
            continue;
        };
        // A run of punctuation counts as its first character.
        while punct(c2).is_some() {
            c2 = r.get()?;
        }
        if !(is_space(c2)
            || kind.optional_space
            || is_bracket(c2)
            || c2 == '?'
            || r.eof()
            || c2 == '\u{1}')
        {
            continue;
        }

        let mut is_end = true;
        let mut newlines = 0;
        let mut next = c2;
        while is_space(next) && !r.eof() {
            if next == '\n' {
                newlines += 1;
            }
            next = r.get()?;
        }
        if newlines == 0 {
            if c1 == '.' {
                if next == '\'' {
                    // "U.S.A.'s" (espeak-ng 1.52; 1.51 reads no further). Past the known
                    // characters it cannot have been an `s`: the clause did end here.
                    if let Some(after) = r.get() {
                        if after == 's' {
                            is_end = false;
                        }
                        r.unget(after);
                    }
                }
                if next.is_lowercase() {
                    // Probably an abbreviation.
                    is_end = false;
                }
            }
            if !any_alnum {
                is_end = false;
            }
        }
        if is_end {
            r.unget(next);
            return Some(if newlines > 1 {
                ("", true)
            } else {
                (kind.terminator, kind.sentence)
            });
        }
        if !r.eof() && is_space(c2) {
            r.unget(next);
        }
    }
    // The end of the text.
    Some(("", true))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn punctuation_table_is_sorted() {
        assert!(PUNCTUATION.windows(2).all(|w| w[0].0 < w[1].0));
    }

    #[test]
    fn inferred_ends() {
        // "Hello, world! How are you today?" as espeak-ng 1.51 consumes it.
        assert_eq!(infer_end("Hello, ", Some('w'), false), (",", false));
        assert_eq!(infer_end("world! ", Some('H'), false), ("!", true));
        assert_eq!(infer_end("How are you today?", None, true), ("?", true));
        // An ellipsis, then a question mark run.
        assert_eq!(infer_end("Wait... ", Some('w'), false), ("", false));
        assert_eq!(infer_end("Hmm...? ", Some('W'), false), ("", false));
        assert_eq!(infer_end("What?! ", Some('Y'), false), ("?", true));
        assert_eq!(infer_end("a,. ", Some('b'), true), (",", false));
        // No final punctuation; a paragraph; a clause cut for length.
        assert_eq!(infer_end("She sells", None, true), ("", true));
        assert_eq!(infer_end("Hi.\n\n", Some('t'), false), ("", true));
        assert_eq!(infer_end("Hi\n \n", Some('t'), false), ("", true));
        assert_eq!(infer_end("a long clause ", Some('x'), false), ("", false));
        // Punctuation then a quote or bracket read ahead.
        assert_eq!(infer_end("\"Hello,", Some('"'), false), (",", false));
        assert_eq!(infer_end("(Hello.", Some(')'), false), (".", true));
        // Needs no space after.
        assert_eq!(infer_end("A\u{3002}", Some('B'), false), ("", true));
        // A paragraph separator is punctuation, though also whitespace.
        assert_eq!(infer_end("a\u{2029} ", Some('b'), false), ("", true));
        // A dot before a lower-case word ends nothing (only seen in a cut clause).
        assert_eq!(infer_end("etc. ", Some('a'), false), ("", false));
        // Punctuation read ahead by the previous clause, then a newline.
        assert_eq!(infer_end("?\n", Some('f'), false), ("?", true));
        assert_eq!(infer_end("", None, true), ("", true));
    }

    #[test]
    fn clause_types() {
        assert_eq!(from_clause_type(CLAUSE_PERIOD | 0x0040_0000), (".", true));
        assert_eq!(from_clause_type(CLAUSE_COMMA), (",", false));
        // An ellipsis: a semicolon that needs no space after.
        assert_eq!(
            from_clause_type(CLAUSE_SEMICOLON | 0x0000_8000 | 0x0020_0000),
            ("", false)
        );
        // End of text: a period with the EOF type bit.
        assert_eq!(from_clause_type(CLAUSE_PERIOD | 0x0001_0000), ("", true));
    }
}
