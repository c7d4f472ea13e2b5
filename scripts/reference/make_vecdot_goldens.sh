#!/usr/bin/env bash
# Writes the ggml dot-product / dequantization goldens into tests/fixtures/quant/.
#
#   scripts/reference/make_vecdot_goldens.sh LLAMA_CPP_DIR
#
# LLAMA_CPP_DIR is a llama.cpp checkout built PORTABLY: ggml with every SIMD option off, so its
# CPU backend runs the plain C reference arithmetic (quantize_row_*_ref, ggml_vec_dot_*_generic,
# the scalar branches of ggml_vec_dot_f16 / _bf16 / _f32) without fused multiply-adds:
#
#   cmake -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
#         -DGGML_AVX=OFF -DGGML_AVX2=OFF -DGGML_AVX_VNNI=OFF -DGGML_FMA=OFF -DGGML_F16C=OFF \
#         -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF \
#         -DGGML_SSE42=OFF -DGGML_BMI2=OFF -DGGML_LLAMAFILE=OFF
#   cmake --build build -j
#
# (the libraries are then in build/bin; no -march / -mfma flags reach the compiler). The inputs
# (dot_x.f32, dot_<type>.bin, dot_cases.txt and the small <type>.bin blocks) come from
# make_quant_fixtures.py, which must run first. Deterministic: re-running rewrites identical files.
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 LLAMA_CPP_DIR" >&2
    exit 2
fi
llama=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
fixtures="$here/../../tests/fixtures/quant"
lib="$llama/build/bin"

cache="$llama/build/CMakeCache.txt"
if [ -f "$cache" ]; then
    for opt in GGML_NATIVE GGML_AVX GGML_AVX2 GGML_FMA GGML_F16C GGML_AVX512 GGML_SSE42 GGML_LLAMAFILE; do
        if ! grep -q "^$opt:BOOL=OFF" "$cache"; then
            echo "error: $cache does not have $opt=OFF; the goldens need a portable build" >&2
            exit 1
        fi
    done
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
gcc -O2 -std=c11 -Wall -Wextra -o "$tmp/ggml_vecdot_reference" "$here/ggml_vecdot_reference.c" \
    -I"$llama/ggml/include" -L"$lib" -lggml-cpu -lggml-base -lggml -Wl,-rpath,"$lib"
"$tmp/ggml_vecdot_reference" "$fixtures"
