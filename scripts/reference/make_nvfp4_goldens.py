#!/usr/bin/env python3
"""Generate the NVFP4 fixtures under tests/fixtures/quant/ from ml_dtypes' E2M1 / E4M3 types.

Usage (from the repository root):

    pip install numpy ml_dtypes      # made with ml_dtypes 0.7.0
    python3 scripts/reference/make_nvfp4_goldens.py

Writes nvfp4.x.f32 (one tensor's values: little-endian f32, whole 64-value blocks), nvfp4.bin
(its NVFP4 blocks in synaptix's layout: the tensor's f32 scale, four E4M3 micro-block scales,
32 bytes of E2M1 nibbles with element 2i in the low nibble of byte i) and nvfp4.f32 (the values
ml_dtypes decodes from them: (e2m1 * e4m3) * tensor scale). The recipe, in f32 arithmetic:
tensor scale amax / (6 * 448) over the finite values; micro-block scale e4m3(amax / 6 / tensor
scale) (clipped to 448, ties to even); values e2m1(x / (e4m3 * tensor scale)) clipped to ±6;
a micro-block holding an infinity or a NaN gets scale byte 0x7F and zero values, one whose scale
is zero gets zero values. Deterministic (seeded generator).
"""

from pathlib import Path

import ml_dtypes
import numpy as np

OUT = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "quant"
rng = np.random.default_rng(20261205)
f32 = np.float32

micro = []
for scale in (1.0, 1e-3, 40.0, 3e-6, 100.0):
    for _ in range(4):
        micro.append(rng.standard_normal(16) * scale)
# E2M1 midpoints and saturation relative to the block's largest value (which sets the scale).
grid = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6])
mids = (grid[:-1] + grid[1:]) / 2
b = np.zeros(16)
b[: len(mids)] = mids
b[len(mids): 2 * len(mids)] = -mids
b[15] = 6.0
micro.append(b)
micro.append(np.linspace(-7.0, 7.0, 16))
micro.append(np.zeros(16))
b = np.zeros(16)
b[3] = -0.0
b[4] = 1e-30
micro.append(b)
b = rng.standard_normal(16)
b[2] = np.inf
micro.append(b)
b = rng.standard_normal(16)
b[11] = np.nan
micro.append(b)
while len(micro) % 4:
    micro.append(rng.standard_normal(16) * 0.5)

x = np.concatenate(micro).astype(f32)
finite = x[np.isfinite(x)]
amax = f32(np.max(np.abs(finite))) if finite.size else f32(0)
ts = f32(amax / f32(6.0 * 448.0)) if amax > 0 else f32(1.0)

out = bytearray()
decoded = []
for blk in x.reshape(-1, 64):
    scales = bytearray()
    codes = np.zeros(64, dtype=np.uint8)
    vals = np.zeros(64)
    for m in range(4):
        mb = blk[16 * m: 16 * m + 16]
        if not np.all(np.isfinite(mb)):
            scales.append(0x7F)
            vals[16 * m: 16 * m + 16] = np.nan
            continue
        mamax = f32(np.max(np.abs(mb)))
        s = f32(f32(mamax / f32(6.0)) / ts)
        e4 = np.array([min(s, f32(448.0))], dtype=f32).astype(ml_dtypes.float8_e4m3fn)
        scales.append(int(e4.view(np.uint8)[0]))
        eff = f32(f32(e4.astype(f32)[0]) * ts)
        if eff == 0:
            continue
        q = np.clip((mb / eff).astype(f32), -6.0, 6.0).astype(ml_dtypes.float4_e2m1fn)
        codes[16 * m: 16 * m + 16] = q.view(np.uint8) & 15
        vals[16 * m: 16 * m + 16] = (q.astype(np.float64) * float(e4.astype(np.float64)[0])) * float(ts)
    out += ts.tobytes() + bytes(scales) + bytes(codes[0::2] | (codes[1::2] << 4))
    decoded.append(vals)

(OUT / "nvfp4.x.f32").write_bytes(x.astype("<f4").tobytes())
(OUT / "nvfp4.bin").write_bytes(bytes(out))
(OUT / "nvfp4.f32").write_bytes(np.concatenate(decoded).astype("<f4").tobytes())
print(f"{x.size // 64} blocks, tensor scale {ts!r}")
