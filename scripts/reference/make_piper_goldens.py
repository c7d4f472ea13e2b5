#!/usr/bin/env python3
"""Goldens for synaptix's Piper VITS port (models::vits), from onnxruntime running the voice.

Setup (once): python3 -m venv /tmp/piperenv && /tmp/piperenv/bin/pip install piper-tts==1.8.0 onnx numpy
Run:          /tmp/piperenv/bin/python scripts/reference/make_piper_goldens.py [VOICE_DIR]

VOICE_DIR defaults to ~/.cache/synaptix/models/piper-en-us-joe-medium (scripts/fetch-models.sh).
For each case it records the phoneme ids (piper's own phonemizer and id map), the scales, the
durations in frames (the graph's `w_ceil`, with the distance of each unrounded duration to the
next integer, so a reader sees how close a rounding was) and the raw float audio of the graph's
output (before piper's volume normalisation) as little-endian f32 in `tests/fixtures/piper/`.
It also writes `question_piper.wav`: piper's `synthesize_wav` of the second case's text with the
noise off (text to 16-bit WAV, the whole path `synaptix speak` runs).

Two kinds of case:
- noise off (noise_scale = noise_w = 0): the graph is deterministic, run as shipped;
- noise on: the graph's two RandomNormalLike nodes are replaced by inputs fed with the same
  Gaussian sequence synaptix draws (`gaussian_noise` below mirrors models::vits::GaussianNoise:
  SplitMix64, 53-bit uniforms in (0, 1), Box-Muller in f64, both values used, cast to f32),
  first the duration noise [2, phonemes] row-major, then the latent noise [192, frames].
"""

import json
import math
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from piper import PiperVoice, SynthesisConfig
import wave

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "fixtures" / "piper"
MASK64 = (1 << 64) - 1

DP_NOISE = "/dp/RandomNormalLike_output_0"
Z_NOISE = "/RandomNormalLike_output_0"
W_CEIL = "/Ceil_output_0"


def splitmix64(state):
    state = (state + 0x9E3779B97F4A7C15) & MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return state, z ^ (z >> 31)


class GaussianNoise:
    def __init__(self, seed):
        self.state = seed & MASK64
        self.spare = None

    def uniform(self):
        self.state, x = splitmix64(self.state)
        return ((x >> 11) + 0.5) * (1.0 / (1 << 53))

    def next(self):
        if self.spare is not None:
            v, self.spare = self.spare, None
            return v
        u1, u2 = self.uniform(), self.uniform()
        r = math.sqrt(-2.0 * math.log(u1))
        self.spare = r * math.sin(2.0 * math.pi * u2)
        return r * math.cos(2.0 * math.pi * u2)

    def fill(self, shape):
        n = int(np.prod(shape))
        return np.array([self.next() for _ in range(n)], dtype=np.float64).astype(np.float32).reshape(shape)


def with_outputs(model, names):
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for name in names:
        m.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    return m


def noise_as_inputs(model, names):
    """The RandomNormalLike nodes producing `names` removed; each becomes a graph input."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    keep = [n for n in m.graph.node if not (n.op_type == "RandomNormalLike" and n.output[0] in names)]
    del m.graph.node[:]
    m.graph.node.extend(keep)
    for name in names:
        m.graph.input.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    return m


def session(model):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), sess_options=opts, providers=["CPUExecutionProvider"])


def main():
    voice_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else Path.home() / ".cache/synaptix/models/piper-en-us-joe-medium"
    onnx_path = next(voice_dir.glob("*.onnx"))
    voice = PiperVoice.load(onnx_path)
    model = onnx.load(str(onnx_path))

    plain = session(with_outputs(model, [W_CEIL, "/Mul_1_output_0"]))
    dp_fed = session(with_outputs(noise_as_inputs(model, [DP_NOISE]), [W_CEIL]))
    both_fed = session(noise_as_inputs(model, [DP_NOISE, Z_NOISE]))

    cases = [
        ("quick_fox", "The quick brown fox jumped over the lazy dog.", [0.0, 1.0, 0.0], None),
        ("question", "How are you today?", [0.0, 1.3, 0.0], None),
        ("noisy", "Speech synthesis runs on the processor.", [0.667, 1.0, 0.8], 42),
    ]
    OUT.mkdir(parents=True, exist_ok=True)
    golden = {"voice": onnx_path.name, "onnxruntime": ort.__version__, "cases": []}
    for name, text, scales, seed in cases:
        sentences = voice.phonemize(text)
        assert len(sentences) == 1, sentences
        ids = voice.phonemes_to_ids(sentences[0])
        feeds = {
            "input": np.array([ids], dtype=np.int64),
            "input_lengths": np.array([len(ids)], dtype=np.int64),
            "scales": np.array(scales, dtype=np.float32),
        }
        if seed is None:
            audio, w_ceil, w = plain.run(None, feeds)
        else:
            noise = GaussianNoise(seed)
            dp_noise = noise.fill((1, 2, len(ids)))
            _, w_ceil = dp_fed.run(None, {**feeds, DP_NOISE: dp_noise})
            frames = max(int(w_ceil.sum()), 1)
            z_noise = noise.fill((1, 192, frames))
            (audio,) = both_fed.run(None, {**feeds, DP_NOISE: dp_noise, Z_NOISE: z_noise})
            w = None
        audio = audio.reshape(-1).astype("<f4")
        (OUT / f"{name}.f32").write_bytes(audio.tobytes())
        durations = [int(v) for v in w_ceil.reshape(-1)]
        case = {
            "name": name,
            "text": text,
            "phonemes": "".join(sentences[0]),
            "ids": ids,
            "scales": scales,
            "seed": seed,
            "durations": durations,
            "samples": int(audio.size),
            "audio_file": f"{name}.f32",
            "peak": float(np.abs(audio).max()),
        }
        if w is not None:
            frac = w.reshape(-1) - np.floor(w.reshape(-1))
            case["min_distance_to_integer"] = float(np.min(np.minimum(frac, 1 - frac)))
        golden["cases"].append(case)
        print(name, len(ids), "ids", sum(durations), "frames", audio.size, "samples")
    # piper's whole text-to-WAV path (phonemizer, ids, model, normalisation, 16-bit PCM) for one
    # deterministic case, as `synaptix speak` runs it.
    with wave.open(str(OUT / "question_piper.wav"), "wb") as wav:
        config = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0, length_scale=1.3)
        voice.synthesize_wav("How are you today?", wav, syn_config=config)

    # One line per case: the id and duration lists stay readable in a diff.
    cases_text = ",\n  ".join(json.dumps(c, ensure_ascii=False) for c in golden.pop("cases"))
    head = json.dumps(golden, ensure_ascii=False)[:-1]
    (OUT / "vits_goldens.json").write_text(f'{head}, "cases": [\n  {cases_text}\n]}}\n')


if __name__ == "__main__":
    main()
