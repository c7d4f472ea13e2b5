# Compile a kernel file with the registry NVRTC into a CUBIN (see scripts/dev/README.md).
# usage: python3 scripts/dev/sass.py kernels/matvec.cu sm_90 out.cubin [extra NVRTC options]
import ctypes, sys, os
src_path, arch, out = sys.argv[1], sys.argv[2], sys.argv[3]
kd = os.path.dirname(src_path)
src = open(src_path).read()
src = src.replace('#include "common.cuh"', open(os.path.join(kd, "common.cuh")).read())
src = src.replace('#include "quant8.cuh"', open(os.path.join(kd, "quant8.cuh")).read())
lib = ctypes.CDLL(os.path.join(os.popen("scripts/nvrtc.sh").read().strip(), "libnvrtc.so.13"))
prog = ctypes.c_void_p()
assert lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"k.cu", 0, None, None) == 0
opts = [b"--std=c++17", b"-default-device", b"-lineinfo", ("--gpu-architecture=" + arch).encode(), b"-Xptxas=-v"] + [a.encode() for a in sys.argv[4:]]
arr = (ctypes.c_char_p * len(opts))(*opts)
r = lib.nvrtcCompileProgram(prog, len(opts), arr)
n = ctypes.c_size_t(); lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
log = ctypes.create_string_buffer(n.value); lib.nvrtcGetProgramLog(prog, log)
sys.stderr.write(log.value.decode())
assert r == 0, r
lib.nvrtcGetCUBINSize(prog, ctypes.byref(n)); buf = ctypes.create_string_buffer(n.value); lib.nvrtcGetCUBIN(prog, buf)
open(out, "wb").write(buf.raw)
