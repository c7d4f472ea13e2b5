#!/usr/bin/env python3
"""VAD goldens for `synaptix transcribe --vad-filter`: faster-whisper 1.2.1's Silero VAD (its
`silero_vad_v6.onnx`, run by onnxruntime) on the clips of make_whisper_goldens.py: each 32 ms
chunk's speech probability, the speech chunks of `get_speech_timestamps` (default VadOptions),
and `transcribe(vad_filter=True)` (beam 5, temperature 0, conditioning) segments.

Writes tests/fixtures/whisper/vad.json.

    python3 scripts/reference/make_whisper_vad_goldens.py [MODEL_DIR]
"""

import hashlib
import json
import os
import sys

import numpy as np
from faster_whisper import WhisperModel
from faster_whisper.utils import get_assets_path
from faster_whisper.vad import VadOptions, get_speech_timestamps, get_vad_model

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_whisper_goldens import ASSEMBLED, MODEL, OUT, assemble, read_wav  # noqa: E402


def main():
    vad_path = os.path.join(get_assets_path(), "silero_vad_v6.onnx")
    samples = read_wav(os.path.join(OUT, "speech16k.wav"))
    model = WhisperModel(MODEL, device="cpu", compute_type="float32")
    vad = get_vad_model()
    clips = []
    for name, parts in ASSEMBLED:
        audio = assemble(samples, parts)
        padded = np.pad(audio, (0, 512 - audio.shape[0] % 512))
        probs = vad(padded)
        chunks = get_speech_timestamps(audio, VadOptions())
        segments, _ = model.transcribe(audio, beam_size=5, temperature=0.0, vad_filter=True)
        clips.append({
            "name": name,
            "parts": parts,
            "speech_probs": [round(float(p), 7) for p in probs.reshape(-1)],
            "speech_chunks": chunks,
            "segments": [{"seek": s.seek, "start": s.start, "end": s.end, "tokens": s.tokens,
                          "text": s.text} for s in segments],
        })
        print(name, len(probs.reshape(-1)), "chunks,", chunks)
    sha = hashlib.sha256(open(vad_path, "rb").read()).hexdigest()
    with open(os.path.join(OUT, "vad.json"), "w") as f:
        json.dump({"faster_whisper": "1.2.1", "vad_model_sha256": sha, "clips": clips}, f,
                  ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
