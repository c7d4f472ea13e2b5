#!/usr/bin/env bash
# On the GPU machine: tg128 A/B runs of one model under several settings, alternating, one line
# per run ("<settings>: <t/s> ± <sd>"). Each setting is one shell word of VAR=VALUE pairs joined
# by spaces; "-" is the default build with nothing set. A setting whose first word is a path to
# another binary (e.g. .dev/bin/synaptix_old) runs that binary instead.
#
#   bash scripts/dev/ab.sh $HOME/m/7b-q8_0.gguf 2 - "SYNAPTIX_ROWS_MIXED=0" \
#       "SYNAPTIX_KERNEL_DEFINES=Q8S_ONE_LOAD=0"
#
# Arguments: the model file, the rounds, then the settings. BENCH_ARGS overrides the bench
# arguments (default: -p 0 -n 128 -r 3), BENCH_DEVICE the device (default: cuda).
set -uo pipefail
cd "$(dirname "$0")/../.."
model=$1 rounds=$2
shift 2
for ((round = 1; round <= rounds; round++)); do
  for setting in "$@"; do
    bin=.dev/bin/synaptix
    read -ra words <<< "$([ "$setting" = - ] && echo "" || echo "$setting")"
    if [ ${#words[@]} -gt 0 ] && [ -x "${words[0]}" ]; then
      bin=${words[0]}
      words=("${words[@]:1}")
    fi
    line=$(env "${words[@]}" "$bin" bench "$model" --device "${BENCH_DEVICE:-cuda}" ${BENCH_ARGS:--p 0 -n 128 -r 3} 2>&1 \
      | grep -E "tg[0-9]+ |rror" | tail -1)
    # The table's last cell holds "mean ± sd".
    value=$(echo "$line" | awk -F'|' '{gsub(/^ +| +$/, "", $(NF-1)); print $(NF-1)}')
    echo "$setting: ${value:-$line}"
  done
done
