#!/usr/bin/env python3
"""Word-timestamp goldens for `synaptix transcribe --word-timestamps`: faster-whisper 1.2.1's
transcribe with `word_timestamps=True` (otherwise its defaults at temperature 0: beam 5, the
previous text as prompt, no VAD) on the clips of make_whisper_goldens.py, float32 on the CPU.

Writes tests/fixtures/whisper/words.json: per clip, the segments (seek, start, end, tokens, text)
and each segment's words (text, start, end, probability).

    python3 scripts/reference/make_whisper_word_goldens.py [MODEL_DIR]
Needs what make_whisper_goldens.py needs (faster-whisper 1.2.1, ctranslate2 4.8.5) and its
committed tests/fixtures/whisper/speech16k.wav.
"""

import json
import os
import sys

from faster_whisper import WhisperModel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_whisper_goldens import ASSEMBLED, MODEL, OUT, assemble, read_wav  # noqa: E402


def main():
    samples = read_wav(os.path.join(OUT, "speech16k.wav"))
    model = WhisperModel(MODEL, device="cpu", compute_type="float32")
    clips = []
    for name, parts in ASSEMBLED:
        audio = assemble(samples, parts)
        segments, info = model.transcribe(audio, beam_size=5, temperature=0.0, vad_filter=False,
                                          word_timestamps=True)
        segments = list(segments)
        clips.append({
            "name": name,
            "parts": parts,
            "language": info.language,
            "segments": [{
                "seek": s.seek,
                "start": s.start,
                "end": s.end,
                "tokens": s.tokens,
                "text": s.text,
                "words": [{"word": w.word, "start": w.start, "end": w.end,
                           "probability": w.probability} for w in s.words],
            } for s in segments],
        })
        print(name, len(segments), "segments,", sum(len(s.words) for s in segments), "words")
    with open(os.path.join(OUT, "words.json"), "w") as f:
        json.dump({"faster_whisper": "1.2.1", "beam_size": 5, "clips": clips}, f, indent=1,
                  ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
