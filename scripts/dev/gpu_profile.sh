#!/usr/bin/env bash
# On the GPU machine: Nsight Compute's view of one launch of each named matvec kernel, run by
# the micro-benchmark on cold copies of one shape (pipe utilisation, issue stalls, shared-memory
# and DRAM throughput), so that a change to the kernel can be aimed before it is measured.
# PROFILE_SPECS: "format:ROWSxCOLS:kernel-name-regex ..." (default: 7B's gate/up on the F16 bulk
# kernel and on the Q8_0 split-copy kernel). Extra environment (SYNAPTIX_BULK=..., etc.) passes
# through to the benchmark. Reports go to $PROFILE_OUT (default /tmp/prof), a digest to stdout.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${PROFILE_OUT:-/tmp/prof}
mkdir -p "$out"
specs=${PROFILE_SPECS:-"f16:18944x3584:matvec_bulk_f16 q8_0:18944x3584:matvec_q8s_bulk"}
for spec in $specs; do
  IFS=: read -r fmt shape kern <<< "$spec"
  report="$out/$fmt-$shape-$kern.txt"
  ncu --target-processes all -k "regex:$kern" -s 5 -c 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section InstructionStats \
    --section WarpStateStats --section MemoryWorkloadAnalysis --section Occupancy \
    --section SchedulerStats \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    .dev/bin/cuda_matvec_bench --formats "$fmt" --shapes "$shape" --iters 10 > "$report" 2>&1 || true
  echo "== $fmt $shape $kern"
  grep -E 'Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Executed Ipc Active|Issue Slots Busy|No Eligible|Active Warps Per Scheduler|Eligible Warps Per Scheduler|Warp Cycles Per Issued Instruction|Achieved Occupancy|Registers Per Thread|Shared Memory Configuration Size|Stall|pipe' "$report" | head -40
  # Issue stalls per issued instruction, largest first (reasons under 0.05 left out).
  grep -E 'issue_stalled_' "$report" | awk '{v=$NF; gsub(",","",v); if (v+0 >= 0.05) print v, $1}' | sort -rn | head -12
done
