#!/usr/bin/env python3
"""Writes tests/fixtures/piper/phonemes.json: Piper's text -> phonemes -> ids, for synaptix's
`PiperPhonemizer` (crates/tokenizer/src/piper.rs) and espeak-ng bridge (espeak.rs).

Setup (once): python3 -m venv /tmp/piperenv && /tmp/piperenv/bin/pip install piper-tts==1.8.0
Run:          /tmp/piperenv/bin/python scripts/reference/make_piper_phoneme_goldens.py [CONFIG]

CONFIG defaults to the voice config of scripts/fetch-models.sh's piper-en-us-joe-medium
(~/.cache/synaptix/models/piper-en-us-joe-medium/en_US-joe-medium.onnx.json, or under
$SYNAPTIX_MODELS).

For each text it records:
- `parts`: the text parts Piper hands to espeak-ng (the text split around `[[ ... ]]` blocks),
  each with piper's `espeakbridge.get_phonemes` clauses [phonemes, terminator, end_of_sentence]
  (espeak-ng 1.52, linked into piper's wheel), and the phoneme strings the system's
  libespeak-ng.so.1 (Debian 12: 1.51) gives through `espeak_TextToPhonemes`;
- `same_in_espeak_1_51`: whether those phoneme strings are identical for every clause (they
  differ on a few vowels between the two versions);
- `sentences`: `PiperVoice.phonemize(text)`;
- `ids`: `phonemes_to_ids` of each sentence with the config's map, and `missing`: the phonemes
  the map lacks (Piper skips them with a warning).
`punctuation_cases` holds texts whose clause ends are easy to get wrong (a hand-written list,
then 300 seeded random mixtures of words, punctuation and whitespace), with only piper's
[terminator, end_of_sentence] per clause. The espeak-ng version strings of both libraries are
recorded at the top.
"""

import ctypes
import importlib.metadata
import json
import os
import random
import sys
from pathlib import Path


from piper import espeakbridge
from piper.config import PiperConfig
from piper.phoneme_ids import phonemes_to_ids
from piper.phonemize_espeak import ESPEAK_DATA_DIR
from piper.voice import _PHONEME_BLOCK_PATTERN, PiperVoice

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fixtures" / "piper" / "phonemes.json"

TEXTS = [
    ("plain", "The quick brown fox jumped over the lazy dog."),
    ("comma_exclamation_question", "Hello, world! How are you today?"),
    ("semicolon_colon_money", "Dr. Smith paid $4.50 for coffee; it was worth it: really."),
    ("numbers_date", "723 people attended the meeting on Tuesday, March 3rd."),
    ("ellipsis", "Wait... what?"),
    ("no_final_punctuation", "She sells sea shells by the sea shore"),
    ("quotes", '"I can\'t believe it," she said. "It\'s not butter!"'),
    ("time_parentheses", "It's 10:30 a.m. in New York (EST)."),
    ("abbreviations", "Mr. and Mrs. Jones moved to the U.S.A. in 1999, e.g. for work."),
    ("question_exclamation_run", "Really?! You did that? Amazing!"),
    ("dashes", "An em dash \u2014 like this \u2014 and an en dash \u2013 too."),
    ("paragraphs", "First line.\n\nSecond paragraph without punctuation\n\nThird"),
    ("raw_block", "Say [[ h\u0259l\u02c8o\u028a ]] to the phonemes, [[w\u02c8\u025c\u02d0ld]]!"),
    ("raw_block_first", "[[ \u02c8\u00e6 ]] then text. And more"),
    ("raw_unknown_phoneme", "Snow [[ m\u00e6n\u2603 ]] here."),
    ("percent_fraction_list", "Numbers: 1, 2, 3; then 4.5% and 1/2."),
    ("unicode_ellipsis_quotes", "\u201cWell\u2026\u201d he paused. \u00bfQu\u00e9?"),
    ("empty", ""),
]

# Where espeak-ng's clause reader is easy to get wrong: only the clauses' (terminator,
# end_of_sentence) are recorded (`punctuation_cases`).
PUNCTUATION_TEXTS = [
    "Hello. A",
    "Hello. ",
    "Hello.\n\n",
    "Hi.\n\nthere",
    "Hi,\n\nthere",
    "Hi\n \nthere",
    "Hi\n\u2029\nthere",
    "What?! Yes",
    "a,. b",
    "a.? B",
    "Hmm...? What",
    "Wait..., no",
    "x\u2026 y",
    "A\u3002B",
    "a\u2029 b",
    "a\u2029b",
    'He said "hi." Then left.',
    "(Hello.) Bye",
    "Hi. ?\nfoo",
    "etc. and more",
    "1. 2. 3.",
    "U.S.A.'s",
    "i..'",
    "Hello,world",
    "x:y",
    "a -- b",
    "a \u2014 b",
    "Mr. Smith and Mrs. Jones",
    "ok.\u00a0",
    "Hi!\u00a0there",
    "\uff01\uff1f ok",
    "\u00bfQu\u00e9? \u00a1S\u00ed!",
    "a.\u00ad B",
    "naive \u00b7\n\u2029... ",
    "\u201cQuoted,\u201d he said \u2018twice.\u2019 Then",
    "Tab\tseparated.\tWords",
    "Line one\r\n\r\nLine two",
    " ".join(["word"] * 200),
]


def models_dir() -> Path:
    if os.environ.get("SYNAPTIX_MODELS"):
        return Path(os.environ["SYNAPTIX_MODELS"])
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "synaptix" / "models"


class SystemEspeak:
    """The system's libespeak-ng.so.1 through espeak_TextToPhonemes (no terminators)."""

    def __init__(self, voice: str):
        self.lib = ctypes.CDLL("libespeak-ng.so.1")
        self.lib.espeak_Info.restype = ctypes.c_char_p
        if self.lib.espeak_Initialize(2, 0, None, 0x8000) <= 0:
            raise RuntimeError("system espeak-ng failed to initialise")
        self.lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        self.lib.espeak_TextToPhonemes.restype = ctypes.c_char_p
        self.lib.espeak_TextToPhonemes.argtypes = [
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.c_int,
            ctypes.c_int,
        ]
        self.voice = voice

    def version(self) -> str:
        return self.lib.espeak_Info(None).decode()

    def phonemes(self, text: str) -> list:
        if self.lib.espeak_SetVoiceByName(self.voice.encode()) != 0:
            raise RuntimeError(f"system espeak-ng has no voice {self.voice}")
        buf = ctypes.create_string_buffer(text.encode())
        ptr = ctypes.c_void_p(ctypes.addressof(buf))
        out = []
        while ptr.value:
            out.append(self.lib.espeak_TextToPhonemes(ctypes.byref(ptr), 1, 2).decode())
        return out


def random_punctuation_texts(count: int, seed: int = 1) -> list:
    """Words, punctuation (ASCII and Unicode), spaces and blank lines thrown together."""
    rng = random.Random(seed)
    words = ["hello", "World", "Dr", "Mr", "etc", "the", "A", "I", "x", "3", "42", "3.5",
             "U.S.A", "e.g", "it's", "caf\u00e9", "Qu\u00e9", "don't", "OK", "ok", "i", "b"]
    marks = [".", ",", "?", "!", ":", ";", "...", "..", "?!", ",.", ".?", "\u2026", "\u2014",
             "\u2013", "-", "--", '"', "'", "(", ")", "[", "]", "\u201c", "\u201d", "\u2019",
             "\u00ab", "\u00bb", "\u3002", "\uff01", "\u3001", "\u2029", "\u2028", "\u00bf",
             "\u00a1", "%", "$", "/", "&", "*", "\u00b7", "\u0964", '."', ".)", '?"', "\u00ad",
             "\u00a0", "\u202f", "\r\n"]
    spaces = [" ", "  ", "\n", "\n\n", " \n ", "\t", "", "", " \n\n \n", "\u3000"]
    texts = []
    for _ in range(count):
        text = ""
        for _ in range(rng.randint(1, 14)):
            r = rng.random()
            text += rng.choice(words if r < 0.5 else marks if r < 0.8 else spaces)
            if rng.random() < 0.5:
                text += rng.choice(spaces)
        texts.append(text)
    return texts


def bridge_clauses(voice: str, text: str) -> list:
    espeakbridge.set_voice(voice)
    clauses = [list(c) for c in espeakbridge.get_phonemes(text)]
    # Some texts (one ending in "..", say) leave a character pushed back in espeak-ng's reader,
    # which the next text would start with; reading "a" to its end clears it (synaptix does the
    # same after every text).
    espeakbridge.get_phonemes("a")
    return clauses


def main() -> None:
    config_path = (
        Path(sys.argv[1])
        if len(sys.argv) > 1
        else models_dir() / "piper-en-us-joe-medium" / "en_US-joe-medium.onnx.json"
    )
    with open(config_path, encoding="utf-8") as f:
        config = PiperConfig.from_dict(json.load(f))
    # phonemize needs no ONNX session.
    voice = PiperVoice(session=None, config=config)

    espeakbridge.initialize(str(ESPEAK_DATA_DIR))
    bridge = ctypes.CDLL(espeakbridge.__file__)
    bridge.espeak_Info.restype = ctypes.c_char_p
    system = SystemEspeak(config.espeak_voice)

    cases = []
    for name, text in TEXTS:
        parts = []
        for part in _PHONEME_BLOCK_PATTERN.split(text):
            if part.startswith("[["):
                continue
            clauses = bridge_clauses(config.espeak_voice, part)
            parts.append(
                {
                    "text": part,
                    "clauses": clauses,
                    "system_phonemes": system.phonemes(part),
                }
            )
        same = all(
            [c[0] for c in p["clauses"]] == p["system_phonemes"] for p in parts
        )
        sentences = voice.phonemize(text)
        id_map = config.phoneme_id_map
        cases.append(
            {
                "name": name,
                "text": text,
                "parts": parts,
                "same_in_espeak_1_51": same,
                "sentences": sentences,
                "ids": [phonemes_to_ids(s, id_map) for s in sentences],
                "missing": [[p for p in s if p not in id_map] for s in sentences],
            }
        )

    punctuation_cases = [
        {"text": t, "clauses": [[c[1], c[2]] for c in bridge_clauses(config.espeak_voice, t)]}
        for t in PUNCTUATION_TEXTS + random_punctuation_texts(300)
    ]

    try:
        rel_config = str(config_path.resolve().relative_to(models_dir().resolve()))
    except ValueError:
        rel_config = str(config_path)
    golden = {
        "piper_tts": importlib.metadata.version("piper-tts"),
        "espeak_ng_piper": bridge.espeak_Info(None).decode(),
        "espeak_ng_system": system.version(),
        "config": rel_config,
        "voice": config.espeak_voice,
        "cases": cases,
        "punctuation_cases": punctuation_cases,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False, indent=1)
        f.write("\n")
    same = sum(c["same_in_espeak_1_51"] for c in cases)
    print(f"wrote {OUT}: {len(cases)} texts, {same} with the same phonemes in the system espeak-ng")


if __name__ == "__main__":
    main()
