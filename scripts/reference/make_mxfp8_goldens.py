#!/usr/bin/env python3
"""Generate the MXFP8 fixtures under tests/fixtures/quant/ from ml_dtypes' E4M3 / E8M0 types.

Usage (from the repository root):

    pip install numpy ml_dtypes      # made with ml_dtypes 0.7.0
    python3 scripts/reference/make_mxfp8_goldens.py

Writes mxfp8.x.f32 (the input row: little-endian f32, a whole number of 32-value blocks),
mxfp8.bin (its MXFP8 blocks: one E8M0 scale byte, then 32 E4M3 bytes) and mxfp8.f32 (the blocks'
values as ml_dtypes decodes them: element times 2^(scale - 127), NaN for scale 0xFF). The quantizer is the OCP
Microscaling v1.0 reference recipe: shared exponent floor(log2(amax)) - 8 clamped to [-127, 127]
(-127 for an all-zero block), each value divided by 2^shared, clipped to ±448 and converted to
float8_e4m3fn by ml_dtypes (round to nearest, ties to even); a block holding an infinity or a NaN
gets scale 0xFF and zero elements. Deterministic (seeded generator).
"""

from pathlib import Path

import ml_dtypes
import numpy as np

OUT = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "quant"
rng = np.random.default_rng(20261205)

blocks = []
# Normal data at several magnitudes.
for scale in (1.0, 1e-3, 40.0, 3e4, 1e-20, 1e30):
    for _ in range(4):
        blocks.append(rng.standard_normal(32) * scale)
# Values on E4M3's rounding midpoints (ties) and around its binade edges, with the amax fixed so
# that the shared exponent is 0 (amax in [256, 512)).
e4m3_all = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
finite = np.unique(np.abs(e4m3_all[np.isfinite(e4m3_all)]))
mids = (finite[:-1] + finite[1:]) / 2
for chunk in range(0, len(mids), 31):
    b = np.zeros(32)
    part = mids[chunk:chunk + 31]
    b[:len(part)] = part * np.where(np.arange(len(part)) % 2, -1, 1)
    b[31] = 300.0
    blocks.append(b)
# Saturation: values above 448 times the scale (amax up to just under 512 * 2^shared).
blocks.append(np.linspace(-511.9, 511.9, 32))
blocks.append(np.full(32, 460.0))
# Subnormal E4M3 results: a large value fixes the scale, the rest are tiny.
b = rng.standard_normal(32) * 2.0**-8
b[0] = 300.0
blocks.append(b)
# f32-subnormal and extreme-range blocks, an all-zero block, negative zeros.
blocks.append(rng.standard_normal(32) * 1e-42)
blocks.append(rng.standard_normal(32) * 1e38)
blocks.append(np.zeros(32))
b = np.zeros(32)
b[::2] = -0.0
b[5] = 1.0
blocks.append(b)
# Non-finite blocks.
b = rng.standard_normal(32)
b[9] = np.inf
blocks.append(b)
b = rng.standard_normal(32)
b[30] = np.nan
blocks.append(b)

x = np.concatenate(blocks).astype(np.float32)
assert x.size % 32 == 0

out = bytearray()
decoded = []
for blk in x.reshape(-1, 32):
    if not np.all(np.isfinite(blk)):
        out += bytes([0xFF]) + bytes(32)
        decoded.append(np.full(32, np.nan))
        continue
    amax = float(np.max(np.abs(blk.astype(np.float64))))
    shared = -127 if amax == 0 else int(np.clip(np.floor(np.log2(amax)) - 8, -127, 127))
    scaled = np.clip(blk.astype(np.float64) / 2.0**shared, -448.0, 448.0)
    elems = scaled.astype(ml_dtypes.float8_e4m3fn)
    out += bytes([shared + 127]) + elems.tobytes()
    scale = np.array([shared + 127], dtype=np.uint8).view(ml_dtypes.float8_e8m0fnu).astype(np.float64)[0]
    assert scale == 2.0**shared
    decoded.append(elems.astype(np.float64) * scale)

(OUT / "mxfp8.x.f32").write_bytes(x.astype("<f4").tobytes())
(OUT / "mxfp8.bin").write_bytes(bytes(out))
(OUT / "mxfp8.f32").write_bytes(np.concatenate(decoded).astype("<f4").tobytes())
print(f"{x.size // 32} blocks")
