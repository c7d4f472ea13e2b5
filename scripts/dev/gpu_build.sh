#!/usr/bin/env bash
# Builds what a GPU machine call needs into .dev/bin (see scripts/dev/README.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -p synaptix-cli
cargo test --release --no-run -p synaptix-kernels-cuda -p synaptix-models --message-format=json \
  2>/dev/null > target/testbins.json
cargo build --release -p synaptix-kernels-cuda --examples
mkdir -p .dev/bin
pwd > .dev/build_root  # where the tests look for their fixtures
# The build the figures come from (table.sh prints it).
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . 2>/dev/null || echo -dirty)" > .dev/build_commit
cp target/release/synaptix .dev/bin/
for t in gpu_parity pdl cuda_parity sample_parity gemm_parity gemm_k_parity; do
  f=$(python3 - "$t" <<'PY'
import json, sys
for line in open("target/testbins.json"):
    try:
        j = json.loads(line)
    except ValueError:
        continue
    if j.get("reason") == "compiler-artifact" and j.get("executable") and j["target"]["name"] == sys.argv[1]:
        print(j["executable"])
PY
  )
  f=$(echo "$f" | tail -1)
  [ -n "$f" ] && cp "$f" ".dev/bin/$t"
done
cp target/release/examples/cuda_matvec_bench target/release/examples/cuda_sample_bench \
  target/release/examples/cuda_gemm_bench .dev/bin/ 2>/dev/null || true
strip .dev/bin/* 2>/dev/null || true
du -sh .dev/bin
