#!/usr/bin/env python3
"""Transformers' greedy tokens for a `.symb` directory, to compare with `synaptix run`.

    python3 scripts/reference/symb_vs_transformers.py SYMB_DIR HF_DIR N PROMPT...

Loads the Hugging Face model in HF_DIR (the checkpoint the .symb directory was written from)
in float32, replaces every weight by the values the .symb files mean (read here from the
format's description: INT4 groups, INT8, FP16 or FP32, told apart by header and size), and
prints one JSON line per prompt: the prompt ids, N greedy tokens, and each step's top-two
margin (random-looking near-ties are where float rounding may choose the other token).

Needs torch, transformers and numpy (the environment of make_hf_models.py).
"""

import json
import os
import struct
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

LAYER_FILES = {
    "self_attn.q_proj.weight": "attn_q",
    "self_attn.k_proj.weight": "attn_k",
    "self_attn.v_proj.weight": "attn_v",
    "self_attn.o_proj.weight": "attn_o",
    "self_attn.q_proj.bias": "attn_q_bias",
    "self_attn.k_proj.bias": "attn_k_bias",
    "self_attn.v_proj.bias": "attn_v_bias",
    "mlp.gate_proj.weight": "mlp_gate",
    "mlp.up_proj.weight": "mlp_up",
    "mlp.down_proj.weight": "mlp_down",
    "input_layernorm.weight": "norm_attn",
    "post_attention_layernorm.weight": "norm_mlp",
}


def read_symb(path, shape):
    raw = open(path, "rb").read()
    numel = int(np.prod(shape))
    if len(raw) >= 20:
        groups, group, n, d0, d1 = struct.unpack("<5I", raw[:20])
        dims_ok = (d0, d1) == (shape[0], shape[1] if len(shape) == 2 else 1)
        if n == numel and dims_ok and group > 0 and groups == -(-numel // group):
            if len(raw) == 20 + 4 * groups + (numel + 1) // 2:
                scales = np.frombuffer(raw[20 : 20 + 4 * groups], np.float32)
                packed = np.frombuffer(raw[20 + 4 * groups :], np.uint8)
                codes = np.empty(packed.size * 2, np.int32)
                codes[0::2] = packed >> 4
                codes[1::2] = packed & 15
                codes = np.pad(codes, (0, groups * group - codes.size), constant_values=8)
                values = (codes[: groups * group] - 8).reshape(groups, group) * scales[:, None]
                return values.reshape(-1)[:numel].reshape(shape).astype(np.float32)
    if len(raw) == 2 * numel:
        return np.frombuffer(raw, np.float16).astype(np.float32).reshape(shape)
    if len(raw) == 4 * numel:
        return np.frombuffer(raw, np.float32).reshape(shape).copy()
    if len(raw) == 4 + numel:
        scale = np.frombuffer(raw[:4], np.float32)[0]
        return (np.frombuffer(raw[4:], np.int8).astype(np.float32) * scale).reshape(shape)
    raise ValueError(f"{path}: {len(raw)} bytes fit no encoding of {shape}")


def main():
    symb, hf, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    prompts = sys.argv[4:]
    cfg = json.load(open(os.path.join(symb, "config.symb.json")))
    pattern = cfg.get("layer_dir_pattern", "layers/layer_{:02d}")
    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(hf)
    with torch.no_grad():
        for key, p in model.state_dict().items():
            if key == "model.embed_tokens.weight":
                f = cfg.get("embedding_file", "embeddings.symb")
            elif key == "lm_head.weight":
                if cfg.get("tie_word_embeddings"):
                    continue
                f = cfg.get("lm_head_file", "lm_head.symb")
            elif key == "model.norm.weight":
                f = "final_norm.symb"
            else:
                parts = key.split(".")
                f = os.path.join(pattern.format(int(parts[2])), LAYER_FILES[".".join(parts[3:])] + ".symb")
            p.copy_(torch.from_numpy(read_symb(os.path.join(symb, f), tuple(p.shape))))
    for prompt in prompts:
        ids = tok(prompt, return_tensors="pt").input_ids
        seq = ids
        tokens, margins = [], []
        past = None
        step_input = ids
        for _ in range(n):
            with torch.no_grad():
                out = model(step_input, past_key_values=past, use_cache=True)
            past = out.past_key_values
            logits = out.logits[0, -1]
            top = torch.topk(logits, 2)
            tokens.append(int(top.indices[0]))
            margins.append(round(float(top.values[0] - top.values[1]), 4))
            step_input = top.indices[:1].view(1, 1)
            seq = torch.cat([seq, step_input], 1)
        print(json.dumps({"prompt": prompt, "prompt_ids": ids[0].tolist(), "tokens": tokens, "margins": margins}))


if __name__ == "__main__":
    main()
