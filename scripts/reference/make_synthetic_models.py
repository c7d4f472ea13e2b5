#!/usr/bin/env python3
"""Tiny random-weight models for the architectures no real model here covers (llama, qwen3),
plus llama.cpp's outputs on them.

    scripts/reference/make_synthetic_models.py LLAMA_CPP_DIR

LLAMA_CPP_DIR: llama.cpp built portable (see make_model_goldens.py). Writes
tests/fixtures/synthetic/<arch>-tiny.gguf and <arch>-tiny.json (prompt ids, 16 greedy tokens
and the full first-step logits). Weights are seeded noise stored in many formats at once
(F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, and K-quant blocks with random payloads), so one
small file exercises every executed type. Needs `pip install gguf numpy`.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import quantize

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests", "fixtures", "synthetic")
sys.path.insert(0, HERE)
from make_model_goldens import build_reference  # noqa: E402

N_EMBD, N_FF, N_LAYER, N_HEAD, N_HEAD_KV, N_CTX = 128, 256, 2, 4, 2, 256
HEAD_DIM = N_EMBD // N_HEAD
N_GEN = 16
PROMPTS = [[1, 70, 80, 90, 100, 110, 120], [1] + [(i * 37) % 250 + 3 for i in range(40)]]


def vocab():
    tokens = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
    tokens += ["\u2581w%d" % i for i in range(300 - len(tokens))]
    types = [2, 3, 3] + [6] * 256 + [1] * (len(tokens) - 259)
    scores = [0.0] * 259 + [-float(i) for i in range(len(tokens) - 259)]
    return tokens, types, scores


def kquant_blocks(rng, rows, cols, qtype):
    """Random K-quant blocks with modest f16 scales (gguf-py cannot quantize K types)."""
    block_bytes = {T.Q2_K: 84, T.Q3_K: 110, T.Q4_K: 144, T.Q5_K: 176, T.Q6_K: 210}[qtype]
    n_blocks = rows * cols // 256
    raw = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    d = np.float16(0.002).view(np.uint16)
    dmin = np.float16(0.001).view(np.uint16)
    for b in raw:
        if qtype in (T.Q4_K, T.Q5_K):
            b[0:2] = np.frombuffer(struct.pack("<H", d), np.uint8)
            b[2:4] = np.frombuffer(struct.pack("<H", dmin), np.uint8)
        elif qtype == T.Q2_K:
            b[80:82] = np.frombuffer(struct.pack("<H", d), np.uint8)
            b[82:84] = np.frombuffer(struct.pack("<H", dmin), np.uint8)
        else:  # Q3_K, Q6_K: d is the last two bytes
            b[-2:] = np.frombuffer(struct.pack("<H", d), np.uint8)
    return raw.reshape(rows, cols // 256 * block_bytes)


def add(w, rng, name, rows, cols, qtype, scale=0.08):
    x = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
    if qtype == T.F32:
        w.add_tensor(name, x)
    elif qtype == T.F16:
        w.add_tensor(name, x.astype(np.float16))
    elif qtype in (T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K):
        w.add_tensor(name, kquant_blocks(rng, rows, cols, qtype), raw_dtype=qtype)
    else:
        # gguf-py takes quantized data as rows of bytes.
        w.add_tensor(name, quantize(x, qtype).view(np.uint8).reshape(rows, -1), raw_dtype=qtype)


def write_model(path, arch):
    rng = np.random.default_rng(1234 if arch == "llama" else 4321)
    w = gguf.GGUFWriter(path, arch)
    w.add_name(arch + "-tiny")
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    if arch == "llama":
        w.add_rope_dimension_count(HEAD_DIM)
    w.add_file_type(1)
    tokens, types, scores = vocab()
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_scores(scores)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_space_prefix(True)
    n_vocab = len(tokens)
    add(w, rng, "token_embd.weight", n_vocab, N_EMBD, T.F16, 1.0)
    add(w, rng, "output.weight", n_vocab, N_EMBD, T.Q8_0)
    w.add_tensor("output_norm.weight", (1.0 + 0.1 * rng.standard_normal(N_EMBD)).astype(np.float32))
    kv = N_HEAD_KV * HEAD_DIM
    # Per layer formats, so that every executed type appears once.
    formats = [
        dict(q=T.Q8_0, k=T.F16, v=T.Q4_0, o=T.Q5_1, gate=T.Q4_1, up=T.Q5_0, down=T.Q4_K),
        dict(q=T.BF16, k=T.Q5_0, v=T.F32, o=T.Q8_0, gate=T.Q5_1, up=T.Q4_0, down=T.Q6_K),
    ]
    if arch == "qwen3":
        formats[0]["down"], formats[1]["down"] = T.Q2_K, T.Q3_K
        formats[1]["up"] = T.Q5_1
    for i, f in enumerate(formats):
        p = "blk.%d." % i
        for norm in ("attn_norm", "ffn_norm"):
            w.add_tensor(p + norm + ".weight", (1.0 + 0.1 * rng.standard_normal(N_EMBD)).astype(np.float32))
        if arch == "qwen3":
            for norm in ("attn_q_norm", "attn_k_norm"):
                w.add_tensor(p + norm + ".weight", (1.0 + 0.1 * rng.standard_normal(HEAD_DIM)).astype(np.float32))
        add(w, rng, p + "attn_q.weight", N_EMBD, N_EMBD, f["q"])
        add(w, rng, p + "attn_k.weight", kv, N_EMBD, f["k"])
        add(w, rng, p + "attn_v.weight", kv, N_EMBD, f["v"])
        add(w, rng, p + "attn_output.weight", N_EMBD, N_EMBD, f["o"])
        add(w, rng, p + "ffn_gate.weight", N_FF, N_EMBD, f["gate"])
        add(w, rng, p + "ffn_up.weight", N_FF, N_EMBD, f["up"])
        add(w, rng, p + "ffn_down.weight", N_EMBD, N_FF, f["down"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    os.makedirs(OUT, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        exe = build_reference(sys.argv[1], tmp)
        for arch in ("llama", "qwen3"):
            model = os.path.join(OUT, arch + "-tiny.gguf")
            write_model(model, arch)
            cases = []
            for ids in PROMPTS:
                prompt_file = os.path.join(tmp, "prompt.txt")
                logits_file = os.path.join(tmp, "logits.f32")
                with open(prompt_file, "w") as f:
                    f.write("ids:" + ",".join(map(str, ids)))
                out = subprocess.run([exe, model, prompt_file, str(N_GEN), logits_file],
                                     check=True, capture_output=True, text=True).stdout
                result = json.loads(out)
                logits = np.fromfile(logits_file, dtype="<f4")
                cases.append({"prompt_ids": result["prompt_ids"], "generated": result["generated"],
                              "logits": [float(v) for v in logits]})
            with open(os.path.join(OUT, arch + "-tiny.json"), "w") as f:
                json.dump({"model": arch + "-tiny.gguf", "cases": cases}, f)
            print(arch, os.path.getsize(model), "bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
