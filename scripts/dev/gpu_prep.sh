#!/usr/bin/env bash
# On the GPU machine: the Qwen2.5 F16 files (random weights, real shapes) and their quantized
# forms in $MODELS_DIR (default $HOME/m). Needs .dev/py with synth_gguf.py, qwen2_tokenizer.json.gz
# and the gguf package unpacked, made here by:
#   mkdir -p .dev/py && cp ../shared/peer/synth_gguf.py ../shared/peer/qwen2_tokenizer.json.gz .dev/py/
#   pip download -q --no-deps --only-binary=:all: -d /tmp/gg gguf && (cd .dev/py && unzip -q -o /tmp/gg/gguf-*.whl)
# PREP_MODELS="0.5b 1.5b 7b"  PREP_QUANTS="f16 q8_0 q4_k_m"
set -euo pipefail
cd "$(dirname "$0")/../.."
M=${MODELS_DIR:-$HOME/m}
mkdir -p "$M"
export PYTHONPATH=$PWD/.dev/py
for s in ${PREP_MODELS:-0.5b 1.5b 7b}; do
  f16=$M/$s-f16.gguf
  [ -s "$f16" ] || python3 .dev/py/synth_gguf.py "qwen2.5-$s" "$f16" .dev/py/qwen2_tokenizer.json.gz >/dev/null
  for q in ${PREP_QUANTS:-f16 q8_0 q4_k_m}; do
    [ "$q" = f16 ] && continue
    [ -s "$M/$s-$q.gguf" ] || .dev/bin/synaptix quantize "$f16" "$M/$s-$q.gguf" --type "$q" >/dev/null
  done
done
ls -la "$M"
