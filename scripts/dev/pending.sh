#!/usr/bin/env bash
# On the GPU machine: the planned call (docs/cuda.md, twenty-ninth pass): the Q8_0 models, then
# which of the split-copy kernel's early side reads (Q8S_EARLY_SIDE bits, off by default: 1 norm weights, 2
# biases, 4 residual) gain at 7B Q8_0, and an L2 evict-last policy on the one-pass attention's KV
# copies (ATTN_KV_KEEP), and attention_short's softmax by every warp (ATTN_WARP_SOFTMAX), after
# gpu_parity. Needs the binaries from gpu_build.sh in .dev/bin and
# about 7 minutes; writes its logs to $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
r=$(cat .dev/build_root); mkdir -p "$(dirname "$r")"; ln -sfn "$PWD" "$r"
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
t0=$(date +%s)
M=${MODELS_DIR:-$HOME/m}
O=${OUT:-/tmp}
PREP_MODELS="7b" PREP_QUANTS="q8_0" bash scripts/dev/gpu_prep.sh > /dev/null 2>&1
echo "prep $(( $(date +%s) - t0 )) s"
D=SYNAPTIX_KERNEL_DEFINES
.dev/bin/gpu_parity > "$O/gpu_parity.txt" 2>&1; grep -E "test result|FAILED|panicked" "$O/gpu_parity.txt" | head -8
env $D=ATTN_WARP_SOFTMAX=1 .dev/bin/gpu_parity attention > "$O/gpu_parity_ws.txt" 2>&1
grep -E "test result|FAILED|panicked" "$O/gpu_parity_ws.txt" | head -8
echo "tests $(( $(date +%s) - t0 )) s"
bash scripts/dev/ab.sh "$M/7b-q8_0.gguf" 2 - "$D=Q8S_EARLY_SIDE=7" "$D=Q8S_EARLY_SIDE=1" \
  "$D=Q8S_EARLY_SIDE=6" "$D=Q8S_EARLY_SIDE=15" "$D=ATTN_WARP_SOFTMAX=1" "$D=ATTN_KV_KEEP=1"
echo "total $(( $(date +%s) - t0 )) s"
