#!/usr/bin/env bash
# The whole test suite, as CI runs it: fetch (or reuse) the real models and NVRTC, check
# formatting, then every test of the workspace in the release profile (real models need
# optimised code).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-models.sh
# NVRTC from the package registry: every CUDA kernel is compiled for sm_80/sm_90/sm_120 even on
# machines without a GPU (GPU tests themselves skip with a message there).
LD_LIBRARY_PATH="$(scripts/nvrtc.sh)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH SYNAPTIX_REQUIRE_NVRTC=1
cargo fmt --all -- --check
scripts/espeak.sh
cargo test --release --workspace "$@"
# GPU tests skip themselves without a GPU; say so where everyone reads it.
if ! target/release/synaptix devices | grep -q '^gpu '; then
  echo "NOTE: no usable GPU here: the CUDA parity tests were skipped (kernels were compiled with NVRTC)."
fi
