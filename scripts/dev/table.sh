#!/usr/bin/env bash
# On the GPU machine: the README's benchmark table in one call: every Qwen2.5 file (0.5B, 1.5B,
# 7B in F16, Q8_0 and Q4_K_M, made by gpu_prep.sh) through `synaptix bench --device cuda -p 512
# -n 128 -r 3`, one markdown row each with the ratios to llama.cpp's figures on this H200
# (../shared/peer/RESULTS.md: commit 0c1e570, `llama-bench -ngl 99 -fa 1 -p 512 -n 128 -r 3`).
# TABLE_MODELS restricts the rows ("7b-q8_0 1.5b-q8_0"); extra environment passes through.
set -uo pipefail
cd "$(dirname "$0")/../.."
M=${MODELS_DIR:-$HOME/m}
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
echo "build $(cat .dev/build_commit 2>/dev/null || echo '?'), $(date -u +%Y-%m-%d)"
# llama.cpp's pp512 and tg128 (t/s) for each file.
declare -A PEER=(
  [0.5b-f16]="71448 768" [0.5b-q8_0]="40296 933" [0.5b-q4_k_m]="39721 871"
  [1.5b-f16]="41049 431" [1.5b-q8_0]="28704 537" [1.5b-q4_k_m]="22263 575"
  [7b-f16]="21075 198" [7b-q8_0]="10665 254" [7b-q4_k_m]="9142 279"
)
echo "| file | pp512 | ratio | tg128 | ratio |"
echo "|---|---:|---:|---:|---:|"
for m in ${TABLE_MODELS:-0.5b-f16 0.5b-q8_0 0.5b-q4_k_m 1.5b-f16 1.5b-q8_0 1.5b-q4_k_m 7b-f16 7b-q8_0 7b-q4_k_m}; do
  out=$(.dev/bin/synaptix bench "$M/$m.gguf" --device cuda -p 512 -n 128 -r 3 2>&1)
  # The table's last cell holds "mean ± sd".
  pp=$(echo "$out" | grep -E "pp512 " | awk -F'|' '{gsub(/^ +| +$/, "", $(NF-1)); print $(NF-1)}')
  tg=$(echo "$out" | grep -E "tg128 " | awk -F'|' '{gsub(/^ +| +$/, "", $(NF-1)); print $(NF-1)}')
  read -r peer_pp peer_tg <<< "${PEER[$m]:-0 0}"
  ratio() { awk -v a="${1%% *}" -v b="$2" 'BEGIN { if (b > 0 && a > 0) printf "%.3f", a / b; else print "?" }'; }
  echo "| $m | ${pp:-?} | $(ratio "${pp:-0}" "$peer_pp") | ${tg:-?} | $(ratio "${tg:-0}" "$peer_tg") |"
done
