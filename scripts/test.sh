#!/usr/bin/env bash
# The whole test suite, as CI runs it: fetch (or reuse) the real models, check formatting,
# then every test of the workspace in the release profile (real models need optimised code).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-models.sh
cargo fmt --all -- --check
cargo test --release --workspace "$@"
