#!/usr/bin/env bash
# espeak-ng for Piper voices: synaptix-tokenizer opens libespeak-ng.so.1 at run time (dlopen) to
# turn text into phonemes, and its tests need it. Installs the Debian/Ubuntu packages
# libespeak-ng1 and espeak-ng-data with apt-get (through sudo when not root) unless the library
# is already there, or SYNAPTIX_ESPEAK_LIB names one that exists.
set -euo pipefail

if [ -n "${SYNAPTIX_ESPEAK_LIB:-}" ] && [ -e "$SYNAPTIX_ESPEAK_LIB" ]; then
  exit 0
fi

have_espeak() {
  local ldconfig
  ldconfig=$(command -v ldconfig || echo /sbin/ldconfig)
  "$ldconfig" -p 2>/dev/null | grep -q 'libespeak-ng\.so\.1 '
}

if have_espeak; then
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "espeak.sh: libespeak-ng.so.1 not found and there is no apt-get: install espeak-ng" \
    "(the library and its data) or set SYNAPTIX_ESPEAK_LIB" >&2
  exit 1
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  sudo=sudo
fi
packages=(libespeak-ng1 espeak-ng-data)
echo "espeak.sh: installing ${packages[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# A fresh image may have no package lists yet.
$sudo apt-get install -y -q "${packages[@]}" ||
  { $sudo apt-get update -q && $sudo apt-get install -y -q "${packages[@]}"; }
if ! have_espeak; then
  echo "espeak.sh: libespeak-ng.so.1 is still missing after installing ${packages[*]}" >&2
  exit 1
fi
