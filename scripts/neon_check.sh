#!/usr/bin/env bash
# Proves the aarch64 NEON kernels on an x86_64 Debian machine: builds synaptix-kernels-cpu for
# aarch64-unknown-linux-gnu, lints it with clippy, and runs its tests (every NEON kernel against
# the scalar reference, bit for bit, plus the ggml golden fixtures) under qemu-user twice: as a
# CPU with the dot-product instructions (`sdot` kernels) and as a Cortex-A72 without them
# (widening-multiply kernels).
#
# Toolchain, all from Debian's archive (installed once, then reused): rustc-web (a current rustc
# for x86_64 hosts) with its aarch64 standard library through multiarch (libstd-rust-web-dev:arm64,
# which brings the arm64 libc the test binaries run on), rust-web-clippy, the aarch64 cross gcc
# as linker, and qemu-user. Cargo is the one on PATH (rustup's), pointed at Debian's rustc.
#
# Usage: scripts/neon_check.sh [--no-clippy] [extra cargo test args, e.g. a test name filter]
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET=aarch64-unknown-linux-gnu
TARGET_DIR=target/aarch64-check
CLIPPY=1
if [[ "${1:-}" == "--no-clippy" ]]; then
  CLIPPY=0
  shift
fi

have_toolchain() {
  [[ -x /usr/bin/rustc && -x /usr/bin/clippy-driver && -x /usr/bin/cargo-clippy ]] &&
    command -v aarch64-linux-gnu-gcc >/dev/null && command -v qemu-aarch64 >/dev/null &&
    [[ -e /lib/ld-linux-aarch64.so.1 ]] &&
    compgen -G "$(/usr/bin/rustc --print target-libdir --target "$TARGET" 2>/dev/null)/libstd-*.rlib" >/dev/null
}

if ! have_toolchain; then
  echo "neon_check: installing the aarch64 toolchain from Debian's archive" >&2
  command -v apt-get >/dev/null || { echo "neon_check: needs a Debian-like system (apt-get)" >&2; exit 1; }
  SUDO=""
  [[ "$(id -u)" == 0 ]] || SUDO=sudo
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    $SUDO dpkg --add-architecture arm64
  fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    rustc-web rust-web-clippy "libstd-rust-web-dev:arm64" gcc-aarch64-linux-gnu \
    libc6-dev-arm64-cross qemu-user >/dev/null
  have_toolchain || { echo "neon_check: toolchain still incomplete after install" >&2; exit 1; }
fi
if ! command -v cargo >/dev/null; then
  DEBIAN_FRONTEND=noninteractive ${SUDO:-} apt-get install -y -qq --no-install-recommends cargo-web >/dev/null
fi

export RUSTC=/usr/bin/rustc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER=qemu-aarch64
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-D warnings"
# The binaries load the multiarch arm64 loader and libc (/lib/ld-linux-aarch64.so.1). A qemu
# prefix of /usr/aarch64-linux-gnu would pair the cross package's loader with the multiarch libc
# of another build, which hangs at the first thread.
unset QEMU_LD_PREFIX
echo "neon_check: $(/usr/bin/rustc --version), $(qemu-aarch64 --version | head -n1)"

if [[ "$CLIPPY" == 1 ]]; then
  /usr/bin/cargo-clippy clippy --release -p synaptix-kernels-cpu --all-targets --target "$TARGET" \
    --target-dir "$TARGET_DIR" -- -D warnings
fi

# `--lib --tests`: doctests would need rustdoc for aarch64, and the crate has none.
run_tests() {
  local cpu=$1 expect_dotprod=$2
  shift 2
  echo "neon_check: tests on an emulated '$cpu' CPU (sdot expected: $expect_dotprod)"
  QEMU_CPU=$cpu SYNAPTIX_EXPECT_DOTPROD=$expect_dotprod \
    cargo test --release -p synaptix-kernels-cpu --target "$TARGET" --target-dir "$TARGET_DIR" \
    --lib --tests "$@"
}
# `max`: every feature qemu emulates, dotprod included. Cortex-A72: Armv8.0, no dotprod.
run_tests max 1 "$@"
run_tests cortex-a72 0 "$@"
echo "neon_check: ok"
