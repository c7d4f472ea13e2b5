#!/usr/bin/env python3
"""Generate the quantization fixtures under tests/fixtures/quant/.

Usage (from the repository root):

    pip install gguf numpy        # fixtures were made with gguf 0.19.0
    python3 scripts/reference/make_quant_fixtures.py
    scripts/reference/make_vecdot_goldens.sh LLAMA_CPP_DIR   # then ggml's goldens

Deterministic: re-running rewrites byte-identical files (seeded numpy generators, no
timestamps).

For each of the 13 weight types the kernels dequantize, writes
  <type>.bin  raw ggml blocks (n elements),
  <type>.f32  little-endian f32 values that gguf.quants.dequantize returns for them.
Types gguf-py can quantize (F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) are quantized from seeded
random data; the k-quants, which gguf-py only dequantizes, are seeded random block bytes with
finite, modest half-precision scales (plus one all-0xFF and one all-zero super-block).

Also writes an activation-quantization case: acts_q8_0.x.f32 (input row) and acts_q8_0.bin (gguf's
Q8_0 quantization of it, which is ggml's quantize_row_q8_0_ref: x * (1/d), round half away from
zero).

Inputs for the dot-product goldens (outputs come from ggml itself, see make_vecdot_goldens.sh):
  dot_x.f32       a seeded DOT_M x DOT_X_COLS activation matrix (each case uses the first k
                  columns of every row), with rounding ties, a zero block, tiny and large values;
  dot_<type>.bin  a weight matrix of n rows x k columns for each of the 13 weight types (random
                  blocks with random finite half scales for the quantized types; gguf-py
                  conversions of random values for F16 / BF16);
  dot_cases.txt   one line "type n k m" per case, read by ggml_vecdot_reference.c.

index.json lists every file with its type and element count (the "dot" entries also name the
golden files the C harness writes: dot_<type>.acts.bin, dot_<type>.out.f32, <type>.ggml.f32).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

OUT = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "quant"

# Byte offsets of the half-precision scale fields inside each k-quant super-block.
K_LAYOUT = {
    T.Q2_K: (84, [80, 82]),
    T.Q3_K: (110, [108]),
    T.Q4_K: (144, [0, 2]),
    T.Q5_K: (176, [0, 2]),
    T.Q6_K: (210, [208]),
}

# Block size and half-scale offsets of the 32-element block types.
LEGACY_LAYOUT = {
    T.Q4_0: (18, [0]),
    T.Q4_1: (20, [0, 2]),
    T.Q5_0: (22, [0]),
    T.Q5_1: (24, [0, 2]),
    T.Q8_0: (34, [0]),
}

# Dot-product cases: n weight rows (not a multiple of 8, so row groups have a tail) and k columns
# (float rows not a multiple of 8; 27 blocks of 32 = 3 groups of 8 plus 3; 3 super-blocks).
DOT_ROWS = 19
DOT_M = 4
DOT_X_COLS = 1024
DOT_COLS_FLOAT = 203
DOT_COLS_LEGACY = 27 * 32
DOT_COLS_K = 3 * 256

FILE_NAMES = {
    T.F32: "f32", T.F16: "f16", T.BF16: "bf16",
    T.Q4_0: "q4_0", T.Q4_1: "q4_1", T.Q5_0: "q5_0", T.Q5_1: "q5_1", T.Q8_0: "q8_0",
    T.Q2_K: "q2_k", T.Q3_K: "q3_k", T.Q4_K: "q4_k", T.Q5_K: "q5_k", T.Q6_K: "q6_k",
}


def float_specials() -> np.ndarray:
    # Values that exercise rounding and the edges of the half / bfloat16 ranges. No signalling
    # NaNs: conversions may quiet them differently.
    return np.array([
        0.0, -0.0, 1.0, -1.0, 65504.0, -65504.0, 65520.0, 1e-8, -3e-6, 6.1e-5, 5.96e-8,
        np.inf, -np.inf, np.nan, 1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11, 3.0e38, 1.0e-40,
    ], dtype=np.float32)


def random_data(rng: np.random.Generator, n: int) -> np.ndarray:
    # Mixed scales per block so block maxima differ; a zero block checks d = 0.
    x = rng.standard_normal(n).astype(np.float32)
    x *= np.repeat(rng.uniform(0.01, 4.0, n // 32).astype(np.float32), 32)
    x[64:96] = 0.0
    return x


def float_fixture(qtype: T, rng: np.random.Generator) -> bytes:
    x = np.concatenate([float_specials(), rng.standard_normal(46).astype(np.float32) * 3])
    if qtype == T.F32:
        return x.tobytes()
    with np.errstate(over="ignore"):  # 3e38 overflows half to inf on purpose
        return np.asarray(quantize(x, qtype)).tobytes()


def random_blocks(rng: np.random.Generator, size: int, scale_offsets: list[int],
                  n_blocks: int) -> np.ndarray:
    blocks = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for off in scale_offsets:
        # |scale| in [2^-14, 1): finite normal halves of modest magnitude, either sign.
        mag = rng.uniform(-14.0, 0.0, n_blocks)
        val = (np.sign(rng.uniform(-1, 1, n_blocks)) * np.exp2(mag)).astype(np.float16)
        blocks[:, off:off + 2] = val.view(np.uint8).reshape(n_blocks, 2)
    return blocks


def kquant_fixture(qtype: T, rng: np.random.Generator, n_blocks: int = 4) -> bytes:
    size, scale_offsets = K_LAYOUT[qtype]
    blocks = random_blocks(rng, size, scale_offsets, n_blocks)
    # Block 1: every byte 0xFF apart from the scales (largest quants, extreme packed scales).
    keep = {o for off in scale_offsets for o in (off, off + 1)}
    for i in range(size):
        if i not in keep:
            blocks[1, i] = 0xFF
    # Block 2: all quant and scale bytes zero.
    for i in range(size):
        if i not in keep:
            blocks[2, i] = 0
    return blocks.tobytes()


def dot_activations(rng: np.random.Generator) -> np.ndarray:
    """The DOT_M x DOT_X_COLS activation matrix of the dot-product goldens."""
    x = random_data(rng, DOT_M * DOT_X_COLS).reshape(DOT_M, DOT_X_COLS)
    # Row 0, block 0: amax 127 makes d = 1, so x = n + 0.5 are exact rounding ties (Q8_0 / Q8_1
    # round them away from zero; Q8_K, with max = -127, to even).
    x[0, :32] = np.linspace(-15.5, 15.5, 32, dtype=np.float32)
    x[0, 0] = -127.0
    # Row 0: ties of the half rounding (1 + 2^-11 and 1 + 3 * 2^-11), values near the half
    # subnormal range, and one largest-magnitude element that is positive.
    x[0, 40:46] = [1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11, 3e-8, -1e-6, 6.1e-5, 2.0 ** -25]
    x[0, 300] = 25.0
    # Row 1: a zero super-block (Q8_K d = 0) that is also 8 zero Q8_0 blocks, then a super-block
    # of subnormal values so small that 1 / d (Q8_0) and 127 / max (Q8_K) overflow to infinity.
    x[1, 256:512] = 0.0
    x[1, 512:768] = (rng.standard_normal(256) * 1e-39).astype(np.float32)
    # Row 2: very different magnitudes from block to block.
    x[2] *= np.repeat(np.exp2(rng.uniform(-12, 6, DOT_X_COLS // 32)), 32).astype(np.float32)
    # Row 3: one tiny block and one block with a single non-zero element.
    x[3, 96:128] *= np.float32(1e-30)
    x[3, 128:160] = 0.0
    x[3, 140] = -0.75
    return x.astype(np.float32)


def dot_weights(qtype: T, rng: np.random.Generator) -> tuple[bytes, int]:
    """A DOT_ROWS-row weight matrix of `qtype`; returns its bytes and the row length k."""
    n = DOT_ROWS
    if qtype in (T.F32, T.F16, T.BF16):
        k = DOT_COLS_FLOAT
        w = (rng.standard_normal(n * k) * 0.3).astype(np.float32)
        w[::37] *= np.float32(1e-3)
        raw = w.tobytes() if qtype == T.F32 else np.asarray(quantize(w, qtype)).tobytes()
        return raw, k
    if qtype in K_LAYOUT:
        size, offs = K_LAYOUT[qtype]
        k = DOT_COLS_K
        return random_blocks(rng, size, offs, n * k // 256).tobytes(), k
    size, offs = LEGACY_LAYOUT[qtype]
    k = DOT_COLS_LEGACY
    return random_blocks(rng, size, offs, n * k // 32).tobytes(), k


def write(name: str, data: bytes) -> None:
    (OUT / name).write_bytes(data)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    entries = []
    for i, (qtype, fname) in enumerate(FILE_NAMES.items()):
        rng = np.random.default_rng(1000 + i)
        if qtype in (T.F32, T.F16, T.BF16):
            raw = float_fixture(qtype, rng)
            source = "quantized" if qtype != T.F32 else "values"
        elif qtype in K_LAYOUT:
            raw = kquant_fixture(qtype, rng)
            source = "random_blocks"
        else:
            raw = np.asarray(quantize(random_data(rng, 256), qtype)).tobytes()
            source = "quantized"
        block_len, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
        assert len(raw) % block_bytes == 0
        n = len(raw) // block_bytes * block_len
        values = dequantize(np.frombuffer(raw, dtype=np.uint8), qtype).astype(np.float32)
        assert values.size == n
        write(f"{fname}.bin", raw)
        write(f"{fname}.f32", values.astype("<f4").tobytes())
        entries.append({
            "dtype": fname, "n": n, "bin": f"{fname}.bin", "f32": f"{fname}.f32",
            "source": source,
        })

    rng = np.random.default_rng(7)
    x = random_data(rng, 512)
    # Exact ties at the rounding boundary of one block: amax 127 gives d = 1, id = 1.
    x[128:160] = np.linspace(-15.5, 15.5, 32, dtype=np.float32)
    x[128] = -127.0
    acts = np.asarray(quantize(x, T.Q8_0)).tobytes()
    write("acts_q8_0.x.f32", x.astype("<f4").tobytes())
    write("acts_q8_0.bin", acts)

    rng = np.random.default_rng(2024)
    write("dot_x.f32", dot_activations(rng).astype("<f4").tobytes())
    dots = []
    lines = []
    for i, (qtype, fname) in enumerate(FILE_NAMES.items()):
        raw, k = dot_weights(qtype, np.random.default_rng(3000 + i))
        block_len, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
        assert len(raw) == DOT_ROWS * k // block_len * block_bytes
        write(f"dot_{fname}.bin", raw)
        lines.append(f"{fname} {DOT_ROWS} {k} {DOT_M}\n")
        dots.append({
            "dtype": fname, "rows": DOT_ROWS, "cols": k, "m": DOT_M, "w": f"dot_{fname}.bin",
            "acts": f"dot_{fname}.acts.bin", "out": f"dot_{fname}.out.f32",
            "ggml_f32": f"{fname}.ggml.f32",
        })
    write("dot_cases.txt", "".join(lines).encode())

    index = {
        "generator": "scripts/reference/make_quant_fixtures.py",
        "gguf_version": getattr(gguf, "__version__", None) or _gguf_version(),
        "weights": entries,
        "acts": [{"dtype": "q8_0", "n": int(x.size), "x": "acts_q8_0.x.f32",
                  "bin_ref": "acts_q8_0.bin"}],
        "dot_x": {"file": "dot_x.f32", "rows": DOT_M, "cols": DOT_X_COLS},
        "dots": dots,
        "dot_generator": "scripts/reference/make_vecdot_goldens.sh",
    }
    (OUT / "index.json").write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
    total = sum(p.stat().st_size for p in OUT.iterdir())
    print(f"wrote {len(list(OUT.iterdir()))} files, {total} bytes, to {os.path.relpath(OUT)}")


def _gguf_version() -> str:
    try:
        from importlib.metadata import version
        return version("gguf")
    except Exception:  # noqa: BLE001 - version is informative only
        return "unknown"


if __name__ == "__main__":
    main()
