#!/usr/bin/env python3
"""Initial-prompt goldens for `synaptix transcribe --initial-prompt`: faster-whisper 1.2.1's
transcribe with `initial_prompt` (otherwise its defaults at temperature 0: beam 5, the previous
text as prompt, no VAD; and once without conditioning on previous text) on the clips of
make_whisper_goldens.py, float32 on the CPU.

Writes tests/fixtures/whisper/prompt.json: the prompt, its token ids, and per case and clip the
segments (seek, start, end, tokens, text).

    python3 scripts/reference/make_whisper_prompt_goldens.py [MODEL_DIR]
"""

import json
import os
import sys

from faster_whisper import WhisperModel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_whisper_goldens import ASSEMBLED, MODEL, OUT, assemble, read_wav  # noqa: E402

PROMPT = "Speech recognition, and the quick brown fox."


def main():
    samples = read_wav(os.path.join(OUT, "speech16k.wav"))
    model = WhisperModel(MODEL, device="cpu", compute_type="float32")
    tokenizer = model.hf_tokenizer
    prompt_ids = tokenizer.encode(" " + PROMPT.strip(), add_special_tokens=False).ids
    cases = {}
    for key, condition in [("conditioned", True), ("unconditioned", False)]:
        clips = []
        for name, parts in ASSEMBLED:
            audio = assemble(samples, parts)
            segments, _ = model.transcribe(audio, beam_size=5, temperature=0.0, vad_filter=False,
                                           initial_prompt=PROMPT,
                                           condition_on_previous_text=condition)
            clips.append({
                "name": name,
                "parts": parts,
                "segments": [{"seek": s.seek, "start": s.start, "end": s.end, "tokens": s.tokens,
                              "text": s.text} for s in segments],
            })
            print(key, name, " | ".join(s["text"] for s in clips[-1]["segments"])[:160])
        cases[key] = clips
    with open(os.path.join(OUT, "prompt.json"), "w") as f:
        json.dump({"faster_whisper": "1.2.1", "initial_prompt": PROMPT, "prompt_ids": prompt_ids,
                   **cases}, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
