#!/usr/bin/env python3
"""Generate the audio fixtures under tests/fixtures/audio/ for crates/audio.

Usage (from the repository root):

    pip install numpy faster-whisper==1.2.1    # goldens were made with numpy 2.4.6
    python3 scripts/reference/make_mel_goldens.py

Deterministic: re-running rewrites byte-identical files (fixed formulas, a seeded numpy
generator, no timestamps). Only numpy, faster_whisper and the standard library are used.

Writes
  chirp16k.wav                 16 kHz mono 16-bit PCM, 1.3 s: 0.1 s of digital silence, then a
                               linear chirp 100 Hz -> 6 kHz, tones at 440 Hz and 3 kHz and
                               seeded Gaussian noise, with a short fade-in.
  chirp16k_mel80.bin           little-endian f32 [80][frames]: faster_whisper's
                               FeatureExtractor(feature_size=80)(x), x = the WAV's int16 / 32768.0
                               as float32 (default padding=160).
  chirp16k_mid1600_mel128.bin  FeatureExtractor(feature_size=128) of x[8000:9600].
  chirp16k_mid30_mel80.bin     FeatureExtractor(feature_size=80) of x[8000:8030]: the padded
                               signal (190 samples) is shorter than the 200-sample reflection, so
                               numpy reflects more than once.
  stereo44k_24bit.wav          44.1 kHz stereo 24-bit PCM, 0.5 s: left 0.5*sin(2*pi*440*t),
                               right 0.25*sin(2*pi*1000*t + 0.3) - 0.2*sin(2*pi*97*t), each
                               rounded to round(v * 8388607).
  audio_goldens.json           shapes of the mel goldens and, for the stereo file, its frame
                               count and the expected mono value ((L + R) / 2 / 2^23 in f64,
                               stored as f32) at a few indices.
"""

import json
import os
import struct
import wave

import numpy as np
from faster_whisper.feature_extractor import FeatureExtractor

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fixtures", "audio")


def chirp_signal():
    sr = 16000
    n = int(1.3 * sr)  # 20800
    t = np.arange(n, dtype=np.float64) / sr
    f0, f1, dur = 100.0, 6000.0, 1.3
    chirp = 0.3 * np.sin(2 * np.pi * (f0 * t + 0.5 * (f1 - f0) / dur * t * t))
    tones = 0.2 * np.sin(2 * np.pi * 440.0 * t) + 0.1 * np.sin(2 * np.pi * 3000.0 * t + 1.0)
    noise = np.random.default_rng(20240611).normal(0.0, 0.01, n)
    x = chirp + tones + noise
    env = np.clip((t - 0.1) / 0.05, 0.0, 1.0)  # silence for 0.1 s, then a 50 ms fade-in
    x = x * env
    q = np.clip(np.round(x * 32767.0), -32768, 32767).astype("<i2")
    return sr, q


def write_wav_int16(path, sr, q):
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sr)
        w.writeframes(q.tobytes())


def read_wav_int16(path):
    with wave.open(path, "rb") as w:
        assert w.getnchannels() == 1 and w.getsampwidth() == 2
        return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")


def stereo_signal():
    sr = 44100
    n = sr // 2  # 22050 frames
    t = np.arange(n, dtype=np.float64) / sr
    left = 0.5 * np.sin(2 * np.pi * 440.0 * t)
    right = 0.25 * np.sin(2 * np.pi * 1000.0 * t + 0.3) - 0.2 * np.sin(2 * np.pi * 97.0 * t)
    li = np.round(left * 8388607.0).astype(np.int64)
    ri = np.round(right * 8388607.0).astype(np.int64)
    return sr, li, ri


def write_wav_int24_stereo(path, sr, li, ri):
    inter = np.empty(2 * len(li), dtype=np.int64)
    inter[0::2] = li
    inter[1::2] = ri
    u = (inter & 0xFFFFFF).astype(np.uint32)  # two's complement in 24 bits
    raw = bytearray()
    for v in u.tolist():
        raw += struct.pack("<I", v)[:3]
    with wave.open(path, "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(3)
        w.setframerate(sr)
        w.writeframes(bytes(raw))


def main():
    os.makedirs(OUT, exist_ok=True)
    meta = {}

    sr, q = chirp_signal()
    wav = os.path.join(OUT, "chirp16k.wav")
    write_wav_int16(wav, sr, q)
    x = read_wav_int16(wav).astype(np.float32) / np.float32(32768.0)
    assert x.dtype == np.float32

    cases = [
        ("chirp16k_mel80.bin", 0, len(x), 80),
        ("chirp16k_mid1600_mel128.bin", 8000, 1600, 128),
        ("chirp16k_mid30_mel80.bin", 8000, 30, 80),
    ]
    meta["mel"] = []
    for name, offset, count, n_mels in cases:
        samples = x[offset : offset + count]
        mel = FeatureExtractor(feature_size=n_mels)(samples)
        mel = np.ascontiguousarray(mel, dtype="<f4")
        mel.tofile(os.path.join(OUT, name))
        meta["mel"].append({"file": name, "offset": offset, "samples": count, "n_mels": n_mels,
                            "frames": int(mel.shape[1])})
        print(f"{name}: {len(samples)} samples -> {mel.shape}, min {mel.min():.6f} max {mel.max():.6f}")

    sr, li, ri = stereo_signal()
    write_wav_int24_stereo(os.path.join(OUT, "stereo44k_24bit.wav"), sr, li, ri)
    mono = ((li.astype(np.float64) / 8388608.0 + ri.astype(np.float64) / 8388608.0) / 2.0).astype(np.float32)
    idx = sorted(set([0, 1, 2, 3, 100, 1000, 4410, 11025, 22049] + list(range(7, 22050, 1531))))
    meta["stereo"] = {
        "file": "stereo44k_24bit.wav",
        "sample_rate": sr,
        "channels": 2,
        "frames": int(len(li)),
        "left_int24_head": [int(v) for v in li[:4]],
        "right_int24_head": [int(v) for v in ri[:4]],
        "mono": [[i, float(mono[i])] for i in idx],
    }
    print(f"stereo44k_24bit.wav: {len(li)} frames, mono[1000] = {mono[1000]!r}")

    with open(os.path.join(OUT, "audio_goldens.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
