#!/usr/bin/env bash
# Speech-to-text speed on the CPU: `synaptix transcribe` against CTranslate2 (faster-whisper's
# engine, float32, greedy) on the same model directory, the same features and thread count.
# Prints a Markdown table of medians over RUNS runs (encoder = one 30-second window; decoder =
# the language step plus greedy tokens).
#
#   scripts/bench/transcribe.sh [MODEL_DIR] [WAV] [THREADS] [RUNS]
# Needs: a release build (cargo build --release), `pip install faster-whisper` for the peer.
set -euo pipefail
cd "$(dirname "$0")/../.."
cache=${SYNAPTIX_MODELS:-${XDG_CACHE_HOME:-$HOME/.cache}/synaptix/models}
model=${1:-$cache/whisper-base}
wav=${2:-tests/fixtures/whisper/speech16k.wav}
threads=${3:-2}
runs=${4:-5}
bin=target/release/synaptix
[ -x "$bin" ] || { echo "error: build first: cargo build --release" >&2; exit 1; }

ours=$(mktemp); trap 'rm -f "$ours"' EXIT
for ((i = 0; i < runs; i++)); do
  "$bin" transcribe "$model" "$wav" --no-timestamps --beam-size 1 --json -t "$threads" >>"$ours"
done
python3 - "$model" "$wav" "$threads" "$runs" "$ours" <<'PY'
import json, statistics, sys, time, wave
import numpy as np
model, wav, threads, runs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
ours = [json.loads(line) for line in open(sys.argv[5]) if line.strip()]
enc = statistics.median(o["timings"]["encode_s"] for o in ours)
dec = statistics.median(o["timings"]["decode_s"] for o in ours)
n_tok = len(ours[0]["tokens"])
try:
    import ctranslate2
    from faster_whisper.feature_extractor import FeatureExtractor
except ImportError:
    ctranslate2 = None
peer = None
if ctranslate2 is not None:
    with wave.open(wav) as w:
        assert w.getframerate() == 16000 and w.getsampwidth() == 2 and w.getnchannels() == 1
        x = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float32) / 32768
    m = ctranslate2.models.Whisper(model, device="cpu", compute_type="float32", intra_threads=threads)
    f = FeatureExtractor(feature_size=m.n_mels)(x)
    n = min(3000, f.shape[1] - 1)
    win = np.pad(f[:, :n], ((0, 0), (0, 3000 - n)))
    sv = ctranslate2.StorageView.from_array(np.ascontiguousarray(win[None], dtype=np.float32))
    m.encode(sv)  # warm-up
    e, d = [], []
    for _ in range(runs):
        t = time.perf_counter(); out = m.encode(sv); e.append(time.perf_counter() - t)
        t = time.perf_counter()
        m.detect_language(out)
        r = m.generate(out, [[50258, 50259, 50359, 50363]], beam_size=1)
        d.append(time.perf_counter() - t)
    peer = (statistics.median(e), statistics.median(d), len(r[0].sequences_ids[0]))
print(f"audio {ours[0]['audio_seconds']:.1f} s, {threads} threads, median of {runs} runs\n")
print("| engine | encoder (30 s window) | decoder (language + tokens) | tokens |")
print("|---|---:|---:|---:|")
print(f"| synaptix | {enc:.3f} s | {dec:.3f} s | {n_tok} |")
if peer:
    print(f"| CTranslate2 {ctranslate2.__version__} (float32) | {peer[0]:.3f} s | {peer[1]:.3f} s | {peer[2]} |")
    print(f"| synaptix / CTranslate2 speed | {peer[0] / enc:.2f}× | {peer[1] / dec:.2f}× | |")
PY
