#!/usr/bin/env python3
"""IQ4_NL and IQ4_XS dequantization fixtures: tests/fixtures/quant/iq4_{nl,xs}.bin (seeded random
blocks with finite, modest half-precision scales) and .f32 (what gguf-py's
`gguf.quants.dequantize` returns for them).

    python3 scripts/reference/make_iq4_fixtures.py      # gguf 0.19, numpy
"""

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

OUT = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "quant"


def blocks(rng, n_blocks, size):
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    d = (rng.uniform(-1, 1, n_blocks) * 0.02).astype(np.float16)
    raw[:, 0:2] = d.view(np.uint8).reshape(n_blocks, 2)
    return raw


def main():
    rng = np.random.default_rng(44)
    for name, qtype, size, per in (("iq4_nl", T.IQ4_NL, 18, 32), ("iq4_xs", T.IQ4_XS, 136, 256)):
        raw = blocks(rng, 24, size)
        values = dequantize(raw.reshape(-1), qtype).astype(np.float32).reshape(-1)
        assert values.size == 24 * per
        (OUT / f"{name}.bin").write_bytes(raw.tobytes())
        (OUT / f"{name}.f32").write_bytes(values.astype("<f4").tobytes())
        print(name, values.size, float(np.abs(values).max()))


if __name__ == "__main__":
    main()
