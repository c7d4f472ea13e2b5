#!/usr/bin/env bash
# On the GPU machine: the planned first call of the next session (see docs/cuda.md, the latest
# pass's "Next"): the kernels' and the models' tests on this build, then tg128 A/B runs of the
# experiment built since the last call, and the one-pass attention's phases at 7B. The README's table follows in a second call
# (`table.sh`: the twenty-fifth pass's table ran before 7B Q8_0's final kernel rule). Needs the
# binaries from gpu_build.sh in .dev/bin and about 7 minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
r=$(cat .dev/build_root); mkdir -p "$(dirname "$r")"; ln -sfn "$PWD" "$r"
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
t0=$(date +%s)
PREP_MODELS="0.5b 1.5b 7b" PREP_QUANTS="q8_0 q4_k_m" bash scripts/dev/gpu_prep.sh > /dev/null 2>&1
echo "prep $(( $(date +%s) - t0 )) s"
M=${MODELS_DIR:-$HOME/m}
.dev/bin/gpu_parity 2>&1 | grep -E "test result|FAILED|panicked" | head -5
SYNAPTIX_CUDA_PARITY_MODELS=$M/1.5b-q8_0.gguf:$M/7b-q8_0.gguf .dev/bin/cuda_parity 2>&1 \
  | grep -E "test result|FAILED|panicked" | head -5
echo "tests $(( $(date +%s) - t0 )) s"
NI="SYNAPTIX_KERNEL_DEFINES=Q8S_NOINLINE_PROLOGUE=1"
echo "== 7b q8_0"; bash scripts/dev/ab.sh "$M/7b-q8_0.gguf" 2 - "$NI" SYNAPTIX_Q8S_QUAD_KERNEL=none
echo "== 1.5b q8_0"; bash scripts/dev/ab.sh "$M/1.5b-q8_0.gguf" 2 - "$NI"
# Where the one-pass attention's 5.6 us a 7B layer go (KTRACE's phase marks, docs/cuda.md).
SYNAPTIX_PRINTF_FIFO=536870912 SYNAPTIX_KERNEL_DEFINES=KTRACE .dev/bin/synaptix bench "$M/7b-q8_0.gguf" \
  --device cuda -p 0 -n 128 -r 1 2>&1 | grep -E "^KTA? " > /tmp/kt.txt
python3 scripts/dev/kt.py /tmp/kt.txt | grep -E "^(positions|[0-9]|attn|q8s|glu|sum)"
echo "total $(( $(date +%s) - t0 )) s"
