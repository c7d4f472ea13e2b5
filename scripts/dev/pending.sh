#!/usr/bin/env bash
# On the GPU machine: the twenty-sixth pass's last call (docs/cuda.md): the kernels' tests and
# the README's table on the build whose weight copies take the L2 evict-first policy outside the
# Q8_0 split-copy kernels (MV_EVICT_FIRST=1, the new default), then tg128 A/B runs of that
# default against MV_EVICT_FIRST=0 on the files the last call did not compare, and cuda_parity
# on 1.5B Q4_K_M. Needs the binaries from gpu_build.sh in .dev/bin and about 6 minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
r=$(cat .dev/build_root); mkdir -p "$(dirname "$r")"; ln -sfn "$PWD" "$r"
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
t0=$(date +%s)
bash scripts/dev/gpu_prep.sh > /dev/null 2>&1
echo "prep $(( $(date +%s) - t0 )) s"
M=${MODELS_DIR:-$HOME/m}
.dev/bin/gpu_parity 2>&1 | grep -E "test result|FAILED|panicked" | head -5
echo "tests $(( $(date +%s) - t0 )) s"
bash scripts/dev/table.sh
OFF="SYNAPTIX_KERNEL_DEFINES=MV_EVICT_FIRST=0"
for m in 0.5b-f16 0.5b-q4_k_m 1.5b-f16 1.5b-q4_k_m 7b-q4_k_m 1.5b-q8_0 0.5b-q8_0 7b-q8_0; do
  echo "== $m"; bash scripts/dev/ab.sh "$M/$m.gguf" 2 - "$OFF"
done
echo "ab $(( $(date +%s) - t0 )) s"
SYNAPTIX_CUDA_PARITY_MODELS=$M/1.5b-q4_k_m.gguf .dev/bin/cuda_parity 2>&1 | grep -E "test result|FAILED|panicked" | head -5
echo "total $(( $(date +%s) - t0 )) s"
