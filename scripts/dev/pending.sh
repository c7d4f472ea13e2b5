#!/usr/bin/env bash
# On the GPU machine: the first call of the next session (see docs/cuda.md, the latest pass's
# "Next"): correctness of the build on the kernels' and the models' tests, then the README's table
# on this build (the twenty-fifth pass's table ran before 7B Q8_0's final kernel rule). Needs the
# binaries from gpu_build.sh in .dev/bin and about 7 minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
r=$(cat .dev/build_root); mkdir -p "$(dirname "$r")"; ln -sfn "$PWD" "$r"
t0=$(date +%s)
PREP_MODELS="0.5b 1.5b 7b" PREP_QUANTS="q8_0 q4_k_m" bash scripts/dev/gpu_prep.sh > /dev/null 2>&1
echo "prep $(( $(date +%s) - t0 )) s"
M=${MODELS_DIR:-$HOME/m}
.dev/bin/gpu_parity 2>&1 | grep -E "test result|FAILED|panicked" | head -5
SYNAPTIX_CUDA_PARITY_MODELS=$M/1.5b-q8_0.gguf:$M/7b-q8_0.gguf .dev/bin/cuda_parity 2>&1 \
  | grep -E "test result|FAILED|panicked" | head -5
echo "tests $(( $(date +%s) - t0 )) s"
bash scripts/dev/table.sh
echo "total $(( $(date +%s) - t0 )) s"
