#!/usr/bin/env bash
# Text-to-speech speed on the CPU: `synaptix speak` against onnxruntime running the same Piper
# voice (piper-tts' engine) on the same phoneme ids, the same thread count and the noise off (so
# both produce the same number of samples). Prints a Markdown table of medians over RUNS runs of
# the model time (phonemization and file writing left out) and the real-time factor. Each
# synaptix run is a new process, so onnxruntime is timed both on a new session's first run (the
# like-for-like figure) and on a warm session.
#
#   scripts/bench/speak.sh [VOICE_DIR] [THREADS] [RUNS]
# Needs: a release build (cargo build --release); for the peer `pip install piper-tts` (which
# brings onnxruntime).
set -euo pipefail
cd "$(dirname "$0")/../.."
cache=${SYNAPTIX_MODELS:-${XDG_CACHE_HOME:-$HOME/.cache}/synaptix/models}
voice=${1:-$cache/piper-en-us-joe-medium}
threads=${2:-2}
runs=${3:-5}
bin=target/release/synaptix
[ -x "$bin" ] || { echo "error: build first: cargo build --release" >&2; exit 1; }
text="The quick brown fox jumped over the lazy dog. Speech synthesis runs on the processor \
without any network, one sentence at a time, and each sentence is written as soon as it is done."

ours=$(mktemp); wav=$(mktemp --suffix .wav); trap 'rm -f "$ours" "$wav"' EXIT
for ((i = 0; i < runs; i++)); do
  "$bin" speak "$voice" "$text" -o "$wav" --noise-scale 0 --noise-w 0 --json -t "$threads" >>"$ours"
done
python3 - "$voice" "$threads" "$runs" "$ours" <<'PY'
import glob, json, statistics, sys, time
voice, threads, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ours = [json.loads(line) for line in open(sys.argv[4]) if line.strip()]
audio_s = ours[0]["audio_seconds"]
syn = statistics.median(o["timings"]["synthesis_s"] for o in ours)
rows = [("synaptix", syn)]
try:
    import numpy as np
    import onnxruntime as ort
except ImportError:
    ort = None
if ort is not None:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = ort.InferenceSession(glob.glob(f"{voice}/*.onnx")[0], sess_options=opts,
                                providers=["CPUExecutionProvider"])
    scales = np.array([0.0, 1.0, 0.0], dtype=np.float32)

    def speak_all(sess):
        t = time.perf_counter()
        for s in ours[0]["sentences"]:
            ids = np.array([s["ids"]], dtype=np.int64)
            sess.run(None, {"input": ids, "input_lengths": np.array([ids.shape[1]]), "scales": scales})
        return time.perf_counter() - t

    def new_session():
        return ort.InferenceSession(glob.glob(f"{voice}/*.onnx")[0], sess_options=opts,
                                    providers=["CPUExecutionProvider"])

    # Each synaptix run is a new process: its buffers are touched for the first time. The fair
    # peer is a new session's first run; a warm session's runs are shown too.
    cold = [speak_all(new_session()) for _ in range(runs)]
    warm = [speak_all(sess) for _ in range(runs + 1)][1:]
    rows.append((f"onnxruntime {ort.__version__}, first run of a new session", statistics.median(cold)))
    rows.append((f"onnxruntime {ort.__version__}, warm session", statistics.median(warm)))
print(f"{len(ours[0]['sentences'])} sentences, {audio_s:.2f} s of audio, {threads} threads, median of {runs} runs\n")
print("| engine | model time | real-time factor |")
print("|---|---:|---:|")
for name, t in rows:
    print(f"| {name} | {t:.3f} s | {t / audio_s:.4f} |")
if ort is None:
    print("\n(onnxruntime not installed: pip install piper-tts)")
PY
