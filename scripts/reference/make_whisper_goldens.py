#!/usr/bin/env python3
"""Goldens for the Whisper tests: speech synthesized by espeak-ng, transcribed by CTranslate2.

Writes tests/fixtures/whisper/speech16k.wav (16 kHz mono 16-bit: espeak-ng's output resampled
by faster-whisper's decoder, PyAV) and tests/fixtures/whisper/goldens.json: for each clip the
language CTranslate2 detects, the greedy tokens (beam 1, faster-whisper's default suppression,
no timestamps) and the first step's largest logits. Under `timestamped`: faster-whisper's
default timestamp mode (`WhisperModel.transcribe` with beam 1, temperature 0 only, no
conditioning on previous text, no VAD) on the clip and on longer clips assembled from it, each
described by `parts` (sample ranges of the clip and runs of zero samples, concatenated) so that
synaptix's test builds the same samples: the language, the number of windows decoded and
skipped as silence, and every segment's seek, start, end, tokens, text, avg_logprob and
no_speech_prob. Under `timestamped_beam5` the same with faster-whisper's transcribe defaults
but for temperature 0 only (beam 5, conditioning on previous text), and under
`timestamped_beam5_no_condition` beam 5 without conditioning; under `beam5` CTranslate2's
`generate(beam_size=5)` of the clip without timestamps (the tokens, their text and the score).

The features are faster-whisper's FeatureExtractor of the WAV as stored (int16 / 32768), the
first 30-second window as faster-whisper cuts it, so synaptix's test reads the same samples.

Needs: espeak-ng (Debian), `pip install faster-whisper` (ctranslate2 4.x), the model directory
that `scripts/fetch-models.sh whisper-base` assembles. Usage:
    python3 scripts/reference/make_whisper_goldens.py [MODEL_DIR]
"""
import json
import logging
import os
import subprocess
import sys
import tempfile
import wave

import numpy as np
import ctranslate2
from faster_whisper import WhisperModel
from faster_whisper.audio import decode_audio
from faster_whisper.feature_extractor import FeatureExtractor
from faster_whisper.tokenizer import Tokenizer
from faster_whisper.transcribe import get_suppressed_tokens
import tokenizers

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
OUT = os.path.join(ROOT, "tests", "fixtures", "whisper")
CACHE = os.environ.get("SYNAPTIX_MODELS") or os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "synaptix", "models")
MODEL = sys.argv[1] if len(sys.argv) > 1 else os.path.join(CACHE, "whisper-base")

TEXT = ("The quick brown fox jumps over the lazy dog. "
        "Speech recognition runs on the processor without any network. "
        "Seven hundred and twenty three people attended the meeting on Tuesday.")
TOP = 20
CLIP = None  # the clip's length in samples, a "to" of None
# Longer inputs built from the clip: {"clip": [from, to]} takes samples [from, to) of it (to None:
# its end), {"zeros": n} appends n zero samples.
ASSEMBLED = [
    ("speech16k", [{"clip": [0, CLIP]}]),
    # ~51 s: two windows, the second starting at the first one's last timestamp pair.
    ("clip_gap_clip_clip_clip", [{"clip": [0, CLIP]}, {"zeros": 3 * 16000}, {"clip": [0, CLIP]},
                                 {"clip": [0, CLIP]}, {"clip": [0, CLIP]}]),
    # ~65 s: windows ending in a single timestamp, and a last window of silence skipped.
    ("clip_silence_head_silence", [{"clip": [0, CLIP]}, {"zeros": 20 * 16000},
                                   {"clip": [0, 3 * 16000]}, {"zeros": 30 * 16000}]),
]


def synthesize(path):
    with tempfile.TemporaryDirectory() as tmp:
        raw = os.path.join(tmp, "say.wav")
        subprocess.run(["espeak-ng", "-v", "en-us", "-s", "150", "-w", raw, TEXT], check=True)
        audio = decode_audio(raw, sampling_rate=16000)
    pcm = np.clip(np.round(audio * 32768.0), -32768, 32767).astype("<i2")
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(pcm.tobytes())


def read_wav(path):
    with wave.open(path, "rb") as w:
        assert w.getframerate() == 16000 and w.getnchannels() == 1 and w.getsampwidth() == 2
        return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float32) / 32768.0


def assemble(samples, parts):
    out = []
    for part in parts:
        if "zeros" in part:
            out.append(np.zeros(part["zeros"], dtype=np.float32))
        else:
            start, end = part["clip"]
            out.append(samples[start:end])
    return np.concatenate(out).astype(np.float32)


class CountWindows(logging.Handler):
    """faster-whisper's debug log: one "Processing segment at" per window decoded, one
    "No speech threshold is met" per window skipped as silence."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.windows = 0
        self.skipped = 0

    def emit(self, record):
        message = record.getMessage()
        if message.startswith("Processing segment at"):
            self.windows += 1
        elif message.startswith("No speech threshold is met"):
            self.skipped += 1


def timestamped(samples, **options):
    """faster-whisper's transcribe of every ASSEMBLED input with `options`."""
    model = WhisperModel(MODEL, device="cpu", compute_type="float32")
    logger = logging.getLogger("faster_whisper")
    logger.setLevel(logging.DEBUG)
    out = []
    for name, parts in ASSEMBLED:
        audio = assemble(samples, parts)
        counter = CountWindows()
        logger.addHandler(counter)
        segments, info = model.transcribe(audio, **options)
        segments = list(segments)
        logger.removeHandler(counter)
        out.append({
            "name": name,
            "parts": parts,
            "samples": int(audio.shape[0]),
            "language": info.language,
            "language_probability": info.language_probability,
            "windows": counter.windows,
            "windows_skipped": counter.skipped,
            "segments": [{
                "seek": s.seek,
                "start": s.start,
                "end": s.end,
                "tokens": s.tokens,
                "text": s.text,
                "avg_logprob": s.avg_logprob,
                "no_speech_prob": s.no_speech_prob,
            } for s in segments],
        })
        print(name, "%.2f s," % (audio.shape[0] / 16000), counter.windows, "windows,",
              counter.skipped, "skipped,", len(segments), "segments")
    return out


def main():
    os.makedirs(OUT, exist_ok=True)
    wav = os.path.join(OUT, "speech16k.wav")
    if not os.path.exists(wav):
        synthesize(wav)
    samples = read_wav(wav)

    model = ctranslate2.models.Whisper(MODEL, device="cpu", compute_type="float32")
    hf = tokenizers.Tokenizer.from_file(os.path.join(MODEL, "tokenizer.json"))
    tok = Tokenizer(hf, True, task="transcribe", language="en")
    with open(os.path.join(MODEL, "config.json")) as f:
        config = json.load(f)
    suppress = list(get_suppressed_tokens(tok, [-1]))
    extra = sorted(set(suppress) - set(config["suppress_ids"]))
    print("faster-whisper suppresses config.suppress_ids plus", extra,
          "; config ids missing from it:", sorted(set(config["suppress_ids"]) - set(suppress)))

    fe = FeatureExtractor(feature_size=model.n_mels)
    features = fe(samples)
    content = features.shape[-1] - 1
    window = features[:, :min(3000, content)]
    window = np.pad(window, ((0, 0), (0, 3000 - window.shape[-1])))
    sv = ctranslate2.StorageView.from_array(np.ascontiguousarray(window[None], dtype=np.float32))
    encoded = model.encode(sv)
    lang_probs = model.detect_language(encoded)[0]
    language = lang_probs[0][0][2:-2]
    prompt = [tok.sot, hf.token_to_id(f"<|{language}|>"), tok.transcribe, tok.no_timestamps]
    result = model.generate(encoded, [prompt], beam_size=1, suppress_blank=True,
                            suppress_tokens=suppress, max_length=448, return_scores=True,
                            return_logits_vocab=True)[0]
    tokens = result.sequences_ids[0]
    first = np.array(result.logits[0][0]) if result.logits else None
    golden = {
        "source": "scripts/reference/make_whisper_goldens.py (ctranslate2 %s, float32)" % ctranslate2.__version__,
        "clips": [{
            "wav": "speech16k.wav",
            "text_spoken": TEXT,
            "language": language,
            "language_probability": lang_probs[0][1],
            "prompt": prompt,
            "tokens": tokens,
            "text": hf.decode(tokens),
        }],
    }
    if first is not None:
        order = np.argsort(-first)[:TOP]
        golden["clips"][0]["first_step_top"] = [[int(i), float(first[i])] for i in order]
    golden["timestamped"] = timestamped(samples, beam_size=1, temperature=0.0,
                                        condition_on_previous_text=False, vad_filter=False,
                                        without_timestamps=False)

    # Beam search: CTranslate2's generate(beam_size=5) (patience 1, length penalty 1, one
    # hypothesis) without timestamps, and faster-whisper's default transcribe (beam 5, previous
    # text as prompt) but for temperature 0 only, with and without conditioning.
    result = model.generate(encoded, [prompt], beam_size=5, suppress_blank=True,
                            suppress_tokens=suppress, max_length=448, return_scores=True)[0]
    golden["beam5"] = {
        "wav": "speech16k.wav",
        "prompt": prompt,
        "beam_size": 5,
        "tokens": result.sequences_ids[0],
        "text": hf.decode(result.sequences_ids[0]),
        "score": result.scores[0],
    }
    golden["timestamped_beam5"] = timestamped(samples, beam_size=5, temperature=0.0,
                                              vad_filter=False)
    golden["timestamped_beam5_no_condition"] = timestamped(
        samples, beam_size=5, temperature=0.0, condition_on_previous_text=False,
        vad_filter=False)
    with open(os.path.join(OUT, "goldens.json"), "w") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")
    print(json.dumps(golden["clips"][0], indent=1)[:1500])


if __name__ == "__main__":
    main()
