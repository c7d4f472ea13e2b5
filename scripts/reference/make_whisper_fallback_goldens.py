#!/usr/bin/env python3
"""Temperature-fallback goldens for `synaptix transcribe --temperature 0,0.2,...`: faster-whisper
1.2.1's transcribe (beam 5, the previous text as prompt, no VAD) once at temperature 0 and once
with its default fallback (temperatures 0, 0.2, 0.4, 0.6, 0.8, 1; best_of 5; compression ratio
threshold 2.4), float32 on the CPU, on the clips of make_whisper_goldens.py and on one clip that
repeats "The quick brown fox" (whose transcript compresses well enough to fall back).

Writes tests/fixtures/whisper/fallback.json: per clip its parts and, for each run, the segments
(seek, start, end, tokens, text, temperature, compression_ratio, avg_logprob). Results sampled
at a temperature above 0 come from CTranslate2's random draws: a test can compare which windows
fell back and the temperature-0 results, not the sampled text.

    python3 scripts/reference/make_whisper_fallback_goldens.py [MODEL_DIR]
"""

import json
import os
import sys

from faster_whisper import WhisperModel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_whisper_goldens import ASSEMBLED, MODEL, OUT, assemble, read_wav  # noqa: E402

FALLBACK = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
# "The quick brown fox" (the clip's first 1.19 s) eight times, a quarter second apart.
REPEATED = ("fox_repeated", [p for _ in range(8) for p in ({"clip": [0, 19000]}, {"zeros": 4000})])


def segments(model, audio, temperature):
    segs, _ = model.transcribe(audio, beam_size=5, vad_filter=False, temperature=temperature)
    return [{"seek": s.seek, "start": s.start, "end": s.end, "tokens": s.tokens, "text": s.text,
             "temperature": s.temperature, "compression_ratio": s.compression_ratio,
             "avg_logprob": s.avg_logprob} for s in segs]


def main():
    samples = read_wav(os.path.join(OUT, "speech16k.wav"))
    model = WhisperModel(MODEL, device="cpu", compute_type="float32")
    clips = []
    for name, parts in ASSEMBLED + [REPEATED]:
        audio = assemble(samples, parts)
        clip = {"name": name, "parts": parts,
                "temperature_0": segments(model, audio, 0.0),
                "fallback": segments(model, audio, FALLBACK)}
        clips.append(clip)
        for key in ("temperature_0", "fallback"):
            print(name, key, [(s["temperature"], round(s["compression_ratio"], 3)) for s in clip[key]])
    with open(os.path.join(OUT, "fallback.json"), "w") as f:
        json.dump({"faster_whisper": "1.2.1", "temperatures": FALLBACK, "best_of": 5,
                   "compression_ratio_threshold": 2.4, "clips": clips}, f, indent=1,
                  ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
