#!/usr/bin/env bash
# On the GPU machine: the planned first call of the next session: the kernels' tests on this
# build, then A/B runs of the experiment under test (docs/cuda.md, the latest pass). Needs the
# binaries from gpu_build.sh in .dev/bin; about 5 minutes on a fresh machine.
set -uo pipefail
cd "$(dirname "$0")/../.."
r=$(cat .dev/build_root); mkdir -p "$(dirname "$r")"; ln -sfn "$PWD" "$r"
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
t0=$(date +%s)
PREP_MODELS="0.5b 1.5b 7b" PREP_QUANTS="q8_0" bash scripts/dev/gpu_prep.sh > /dev/null 2>&1
echo "prep $(( $(date +%s) - t0 )) s"
M=${MODELS_DIR:-$HOME/m}
.dev/bin/gpu_parity 2>&1 | grep -E "test result|FAILED|panicked" | head -5
echo "tests $(( $(date +%s) - t0 )) s"
# The exact one-pass attention by fused multiply-adds (ATTN_FAST, built off) against the default;
# gpu_parity again with it on (the decode attention tests compare its bits).
NEW="SYNAPTIX_KERNEL_DEFINES=ATTN_FAST=1"
env "$NEW" .dev/bin/gpu_parity attention 2>&1 | grep -E "test result|FAILED|panicked" | head -5
bash scripts/dev/ab.sh $M/1.5b-q8_0.gguf 2 - "$NEW"
bash scripts/dev/ab.sh $M/7b-q8_0.gguf 2 - "$NEW"
bash scripts/dev/ab.sh $M/0.5b-q8_0.gguf 2 - "$NEW"
echo "total $(( $(date +%s) - t0 )) s"
