#!/usr/bin/env bash
# Makes NVRTC loadable without a CUDA toolkit: fetches the `nvidia-cuda-nvrtc` wheel from the
# Python package registry (cached), unpacks its libraries and prints the folder to put on
# LD_LIBRARY_PATH. Compiling kernels needs no GPU.
#
#   export LD_LIBRARY_PATH="$(scripts/nvrtc.sh):$LD_LIBRARY_PATH"
set -euo pipefail
dir=${SYNAPTIX_NVRTC_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/synaptix/nvrtc}
lib="$dir/nvidia/cu13/lib"
if [ ! -f "$lib/libnvrtc.so.13" ]; then
  mkdir -p "$dir"
  python3 -m pip download --no-deps --progress-bar on -d "$dir/wheel" "nvidia-cuda-nvrtc>=13,<14" >&2
  python3 - "$dir" <<'PY'
import glob, sys, zipfile
d = sys.argv[1]
wheel = sorted(glob.glob(d + "/wheel/nvidia_cuda_nvrtc-*.whl"))[-1]
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if "/lib/" in name:
            z.extract(name, d)
PY
  # NVRTC loads its builtins library by the short soname.
  for f in "$lib"/libnvrtc-builtins.so.13.*; do ln -sf "$(basename "$f")" "$lib/libnvrtc-builtins.so.13"; done
fi
echo "$lib"
