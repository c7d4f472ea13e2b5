#!/usr/bin/env bash
# On the GPU machine: the planned first call of the next session: the kernels' tests, the models'
# parity (1.5B Q4_K_M, 7B Q8_0, and 0.5B in IQ4_NL and IQ4_XS), then the README's table. No
# experiment is built (docs/cuda.md, the twenty-ninth pass); add the next one's A/B runs
# (`ab.sh`) after the table. Needs the binaries from gpu_build.sh in .dev/bin and about 7
# minutes; writes its logs to $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
r=$(cat .dev/build_root); mkdir -p "$(dirname "$r")"; ln -sfn "$PWD" "$r"
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
t0=$(date +%s)
M=${MODELS_DIR:-$HOME/m}
O=${OUT:-/tmp}
bash scripts/dev/gpu_prep.sh > /dev/null 2>&1
PREP_MODELS="0.5b" PREP_QUANTS="iq4_nl iq4_xs" bash scripts/dev/gpu_prep.sh > /dev/null 2>&1
echo "prep $(( $(date +%s) - t0 )) s"
.dev/bin/gpu_parity > "$O/gpu_parity.txt" 2>&1; grep -E "test result|FAILED|panicked" "$O/gpu_parity.txt" | head -8
SYNAPTIX_CUDA_PARITY_MODELS=$M/1.5b-q4_k_m.gguf:$M/7b-q8_0.gguf:$M/0.5b-iq4_nl.gguf:$M/0.5b-iq4_xs.gguf \
  .dev/bin/cuda_parity > "$O/cuda_parity.txt" 2>&1
grep -E "test result|FAILED|panicked" "$O/cuda_parity.txt" | head -5
echo "tests $(( $(date +%s) - t0 )) s"
bash scripts/dev/table.sh
echo "total $(( $(date +%s) - t0 )) s"
