#!/usr/bin/env bash
# Writes tests/fixtures/perplexity/llama_perplexity.json: llama-perplexity's figures for the two
# cached real models over tests/fixtures/imatrix/corpus.txt (chunks of 256 tokens, the first 6),
# which `synaptix perplexity` must reproduce (crates/cli/tests/real_models.rs).
#
#   scripts/reference/make_perplexity_fixture.sh LLAMA_CPP_DIR
#
# LLAMA_CPP_DIR is a llama.cpp tree (../shared/peer/llamacpp.sh's source) with llama-perplexity
# built PORTABLE in build-portable/ (every SIMD path off, as scripts/reference/make_model_goldens.py
# describes), so that its logits are the ones synaptix reproduces bit for bit:
#
#   cmake -B build-portable -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=OFF \
#     -DGGML_AVX=OFF -DGGML_AVX2=OFF -DGGML_FMA=OFF -DGGML_F16C=OFF -DGGML_AVX512=OFF \
#     -DGGML_AVX_VNNI=OFF -DGGML_SSE42=OFF -DGGML_BMI2=OFF -DGGML_LLAMAFILE=OFF
#   cmake --build build-portable -j --target llama-perplexity
#
# Flash attention off (synaptix's CPU attention is llama.cpp's without it).
set -euo pipefail
if [ $# -ne 1 ]; then
  echo "usage: $0 LLAMA_CPP_DIR" >&2
  exit 2
fi
bin=$(cd "$1" && pwd)/build-portable/bin
here=$(cd "$(dirname "$0")/../.." && pwd)
models=${SYNAPTIX_MODELS:-$HOME/.cache/synaptix/models}
corpus=$here/tests/fixtures/imatrix/corpus.txt
out=$here/tests/fixtures/perplexity/llama_perplexity.json
version=$(LD_LIBRARY_PATH=$bin "$bin/llama-perplexity" --version 2>&1 | sed -n 's/^version: //p' | head -1)
{
  echo "{"
  echo "  \"producer\": \"llama-perplexity (portable build, version $version) -c 256 --chunks 6 -b 256 -fa off -t 2\","
  echo "  \"text\": \"tests/fixtures/imatrix/corpus.txt\","
  first=1
  for m in gemma-3-270m-q4_k_m.gguf qwen2.5-coder-0.5b-instruct-q4_k_m.gguf; do
    log=$(LD_LIBRARY_PATH=$bin "$bin/llama-perplexity" -m "$models/$m" -f "$corpus" -c 256 --chunks 6 \
      -b 256 -fa off -t 2 2>&1)
    chunks=$(echo "$log" | grep -o '\[[0-9]*\][0-9.]*' | sed 's/\[[0-9]*\]//' | paste -sd, -)
    final=$(echo "$log" | sed -n 's/.*Final estimate: PPL = \([0-9.]*\) +\/- \([0-9.]*\).*/\1 \2/p')
    [ $first = 1 ] || echo "  ,"
    first=0
    echo "  \"$m\": {\"chunk_perplexity\": [$chunks], \"perplexity\": ${final% *}, \"error\": ${final#* }}"
  done
  echo "}"
} > "$out"
cat "$out"
