#!/usr/bin/env bash
# On the GPU machine: the planned first call of this session (docs/cuda.md, twenty-ninth pass):
# Q8_0 models, then the side inputs read early (Q8S_EARLY_SIDE, on by default) against the old
# reads, an L2 evict-last policy on them (Q8S_SIDE_KEEP) and on the attention's KV copies
# (ATTN_KV_KEEP) at 7B Q8_0, then the kernels' tests and 7B's parity. Needs the binaries from
# gpu_build.sh in .dev/bin and about 8 minutes; writes its logs to $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
r=$(cat .dev/build_root); mkdir -p "$(dirname "$r")"; ln -sfn "$PWD" "$r"
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
t0=$(date +%s)
M=${MODELS_DIR:-$HOME/m}
O=${OUT:-/tmp}
PREP_QUANTS="q8_0" bash scripts/dev/gpu_prep.sh > /dev/null 2>&1
echo "prep $(( $(date +%s) - t0 )) s"
bash scripts/dev/ab.sh "$M/7b-q8_0.gguf" 2 - "SYNAPTIX_KERNEL_DEFINES=Q8S_EARLY_SIDE=0" \
  "SYNAPTIX_KERNEL_DEFINES=Q8S_SIDE_KEEP=1" "SYNAPTIX_KERNEL_DEFINES=ATTN_KV_KEEP=1" \
  "SYNAPTIX_KERNEL_DEFINES=Q8S_SIDE_KEEP=1,ATTN_KV_KEEP=1 SYNAPTIX_L2_PERSIST_KIB=16384"
echo "ab $(( $(date +%s) - t0 )) s"
.dev/bin/gpu_parity > "$O/gpu_parity.txt" 2>&1; grep -E "test result|FAILED|panicked" "$O/gpu_parity.txt" | head -8
echo "gpu_parity $(( $(date +%s) - t0 )) s"
SYNAPTIX_CUDA_PARITY_MODELS=$M/7b-q8_0.gguf timeout 150 .dev/bin/cuda_parity > "$O/cuda_parity.txt" 2>&1
grep -E "test result|FAILED|panicked" "$O/cuda_parity.txt" | head -5
echo "total $(( $(date +%s) - t0 )) s"
