#!/usr/bin/env bash
# On the GPU machine: the planned first call of the next session: the kernels' and the models'
# tests on this build, then the README's table (no experiment is built yet; see docs/cuda.md,
# the twenty-seventh pass). Needs the binaries from gpu_build.sh in .dev/bin and about 6
# minutes; add the next experiment's A/B runs (`ab.sh`) after the table.
set -uo pipefail
cd "$(dirname "$0")/../.."
r=$(cat .dev/build_root); mkdir -p "$(dirname "$r")"; ln -sfn "$PWD" "$r"
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
t0=$(date +%s)
bash scripts/dev/gpu_prep.sh > /dev/null 2>&1
echo "prep $(( $(date +%s) - t0 )) s"
M=${MODELS_DIR:-$HOME/m}
.dev/bin/gpu_parity 2>&1 | grep -E "test result|FAILED|panicked" | head -5
SYNAPTIX_CUDA_PARITY_MODELS=$M/1.5b-q4_k_m.gguf:$M/7b-q8_0.gguf .dev/bin/cuda_parity 2>&1 \
  | grep -E "test result|FAILED|panicked" | head -5
echo "tests $(( $(date +%s) - t0 )) s"
bash scripts/dev/table.sh
echo "total $(( $(date +%s) - t0 )) s"
