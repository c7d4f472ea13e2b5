#!/usr/bin/env bash
# On the GPU machine: the planned first call of the next session (docs/cuda.md, the
# twenty-eighth pass), most important first: the kernels' tests (IQ4_NL and IQ4_XS new) and the
# models' parity on IQ4_NL and IQ4_XS files, then tg128 A/B runs of the output projection beside
# the attention at 7B Q8_0 and that experiment's model parity. Needs the binaries from
# gpu_build.sh in .dev/bin and about 7 minutes; writes its logs to $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
r=$(cat .dev/build_root); mkdir -p "$(dirname "$r")"; ln -sfn "$PWD" "$r"
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
t0=$(date +%s)
M=${MODELS_DIR:-$HOME/m}
O=${OUT:-/tmp}
PREP_MODELS="0.5b" PREP_QUANTS="q8_0 iq4_nl iq4_xs" bash scripts/dev/gpu_prep.sh > /dev/null 2>&1
echo "prep 0.5b $(( $(date +%s) - t0 )) s"
.dev/bin/gpu_parity > "$O/gpu_parity.txt" 2>&1; grep -E "test result|FAILED|panicked" "$O/gpu_parity.txt" | head -8
.dev/bin/gemm_k_parity dequantized > "$O/gemm_k.txt" 2>&1; grep -E "test result|FAILED|panicked" "$O/gemm_k.txt" | head -4
SYNAPTIX_CUDA_PARITY_MODELS=$M/0.5b-iq4_nl.gguf:$M/0.5b-iq4_xs.gguf .dev/bin/cuda_parity > "$O/cuda_parity_iq4.txt" 2>&1
grep -E "test result|FAILED|panicked" "$O/cuda_parity_iq4.txt" | head -5
for q in q8_0 iq4_nl iq4_xs; do echo "0.5b-$q: $(.dev/bin/synaptix bench $M/0.5b-$q.gguf --device cuda -p 512 -n 128 -r 2 2>&1 | grep -E 'pp512|tg128' | awk -F'|' '{print $(NF-1)}' | tr '\n' ' ')"; done
echo "tests $(( $(date +%s) - t0 )) s"
PREP_MODELS="7b" PREP_QUANTS="q8_0" bash scripts/dev/gpu_prep.sh > /dev/null 2>&1
echo "prep 7b $(( $(date +%s) - t0 )) s"
bash scripts/dev/ab.sh "$M/7b-q8_0.gguf" 2 - SYNAPTIX_Q8S_BESIDE=24 SYNAPTIX_Q8S_BESIDE=16
echo "ab $(( $(date +%s) - t0 )) s"
SYNAPTIX_Q8S_BESIDE=24 SYNAPTIX_CUDA_PARITY_MODELS=$M/7b-q8_0.gguf .dev/bin/cuda_parity 2>&1 \
  | grep -E "test result|FAILED|panicked" | head -5
bash scripts/dev/ab.sh "$M/7b-q8_0.gguf" 1 - SYNAPTIX_Q8S_BESIDE=grid
echo "total $(( $(date +%s) - t0 )) s"
