#!/usr/bin/env bash
# On the GPU machine: the first call for the experiments built but not yet measured (see
# docs/cuda.md, the latest pass's "Built after the last machine call"): correctness first, then
# tg128 A/B runs of each against the default, alternating within this one call. Needs the
# binaries from gpu_build.sh in .dev/bin and about 8 minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
r=$(cat .dev/build_root); mkdir -p "$(dirname "$r")"; ln -sfn "$PWD" "$r"
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
t0=$(date +%s)
PREP_MODELS="0.5b 1.5b 7b" PREP_QUANTS="q8_0 q4_k_m" bash scripts/dev/gpu_prep.sh > /dev/null 2>&1
echo "prep $(( $(date +%s) - t0 )) s"
M=${MODELS_DIR:-$HOME/m}
.dev/bin/gpu_parity 2>&1 | grep -E "test result|FAILED|panicked" | head -5
SN="SYNAPTIX_KERNEL_DEFINES=SN_SKIP_IDLE=1"
echo "== 7b q8_0"
bash scripts/dev/ab.sh "$M/7b-q8_0.gguf" 2 - SYNAPTIX_Q8S_FEW=2 SYNAPTIX_Q8S_FEW=3 SYNAPTIX_Q8S_GLU=1 \
  SYNAPTIX_Q8S_POOL=10 SYNAPTIX_Q8S_POOL=25
echo "== 1.5b q8_0"
bash scripts/dev/ab.sh "$M/1.5b-q8_0.gguf" 2 - "$SN" SYNAPTIX_Q8S_GLU=1 SYNAPTIX_Q8S_POOL=10
echo "== 0.5b q8_0"; bash scripts/dev/ab.sh "$M/0.5b-q8_0.gguf" 2 - "$SN"
echo "== 0.5b q4_k_m"; bash scripts/dev/ab.sh "$M/0.5b-q4_k_m.gguf" 2 - "$SN"
echo "total $(( $(date +%s) - t0 )) s"
