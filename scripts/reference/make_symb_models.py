#!/usr/bin/env python3
"""Tiny `.symb` model directories (SYNAXIM's INT4 format) and transformers' outputs on them.

    python3 scripts/reference/make_symb_models.py

Needs the environment of make_hf_models.py (torch, transformers, tokenizers, numpy), whose
tokenizer, weight noise and prompts it reuses.

1. Writes tests/fixtures/hf/mistral-tiny/ (MistralForCausalLM, F16, hidden 128 so that every
   matrix row is whole INT4 groups, tied embeddings) and tests/fixtures/hf/mistral-tiny.json
   (transformers' ids, greedy tokens and logits, as make_hf_models.py writes them).
2. Packs mistral-tiny and qwen2-tiny (hidden 64: groups of 128 span two rows; q/k/v biases)
   into tests/fixtures/symb/<name>-int4/ with the packer below, written from the format's
   description (docs/symb.md), not from synaptix: config.symb.json, tokenizer/, and one file
   per tensor, 2-D tensors in INT4, 1-D tensors and final_norm in FP16.
3. Loads each directory's values back (INT4 dequantized, FP16 widened) into the transformers
   model and writes tests/fixtures/symb/<name>-int4.json: ids, 8 greedy tokens and the float32
   logits of the model whose weights are exactly what the files mean, after the prompt and
   after each generated token (with the top-two margin of each step: random weights make
   near-ties, where a float rounding may pick the other token).
"""

import json
import os
import shutil
import struct
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_hf_models as base  # noqa: E402
from transformers import AutoModelForCausalLM, MistralConfig, MistralForCausalLM  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))
HF = os.path.join(ROOT, "tests", "fixtures", "hf")
SYMB = os.path.join(ROOT, "tests", "fixtures", "symb")
GROUP = 128

# transformers' per-layer names -> .symb file names.
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


def pack_int4(t):
    """The INT4 file of a float32 array, and the values it stands for."""
    flat = t.astype(np.float32).reshape(-1)
    numel = flat.size
    groups = -(-numel // GROUP)
    padded = np.zeros(groups * GROUP, dtype=np.float32)
    padded[:numel] = flat
    g = padded.reshape(groups, GROUP)
    amax = np.abs(g).max(axis=1)
    scales = np.where(amax > 0, amax / np.float32(7.0), np.float32(1.0)).astype(np.float32)
    q = np.clip(np.round(g / scales[:, None]), -8, 7).astype(np.int32)  # ties to even
    codes = (q + 8).astype(np.uint8).reshape(-1)[:numel]
    if codes.size % 2:
        codes = np.concatenate([codes, np.zeros(1, dtype=np.uint8)])
    packed = (codes[0::2] << 4) | codes[1::2]
    dims = (t.shape[0], t.shape[1] if t.ndim == 2 else 1)
    data = struct.pack("<5I", groups, GROUP, numel, *dims) + scales.tobytes() + packed.tobytes()
    values = (q.astype(np.float32) * scales[:, None]).reshape(-1)[:numel]
    return data, values.reshape(t.shape)


def write_symb(src_dir, name, model, rope_theta):
    out = os.path.join(SYMB, name + "-int4")
    shutil.rmtree(out, ignore_errors=True)
    cfg = model.config
    n_layers = cfg.num_hidden_layers
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    tied = bool(cfg.tie_word_embeddings)
    source = os.path.relpath(src_dir, ROOT)
    config = {
        "model_name": source.split("/")[-1],
        "model_type": "dense",
        "source_model": source,
        "grrn_version": "0.1.0",
        "engine_name": "SYNAXIM",
        "architecture": "dense",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_layers": n_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": head_dim,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rope_theta": rope_theta,
        "rms_norm_eps": cfg.rms_norm_eps,
        "tie_word_embeddings": tied,
        "layer_types": ["full_attention"] * n_layers,
        "num_experts": 1,
        "num_experts_per_tok": 1,
        "moe_layer_indices": [],
        "quantization": {"method": "int4", "group_size": GROUP, "symmetric": True},
        "hidden_act": cfg.hidden_act,
        "gate_alpha": 0.5,
        "gate_scale": 0.0039,
        "memory_lambda": 0.995,
        "embedding_file": "embeddings.symb",
        "lm_head_file": "lm_head.symb",
        "layer_dir_pattern": "layers/layer_{:02d}",
        "tokenizer_dir": "tokenizer",
    }
    os.makedirs(os.path.join(out, "tokenizer"))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(src_dir, f), os.path.join(out, "tokenizer", f))
    meant = {}
    for key, t in model.state_dict().items():
        if key == "lm_head.weight" and tied:
            continue
        if key == "model.embed_tokens.weight":
            path = "embeddings.symb"
        elif key == "lm_head.weight":
            path = "lm_head.symb"
        elif key == "model.norm.weight":
            path = "final_norm.symb"
        else:
            parts = key.split(".")
            layer = int(parts[2])
            path = "layers/layer_%02d/%s.symb" % (layer, LAYER_FILES[".".join(parts[3:])])
        arr = t.float().numpy()
        if arr.ndim == 1 or path == "final_norm.symb":
            data = arr.astype(np.float16).tobytes()
            values = arr.astype(np.float16).astype(np.float32)
        else:
            data, values = pack_int4(arr)
        full = os.path.join(out, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as f:
            f.write(data)
        meant[key] = values
    with open(os.path.join(out, "config.symb.json"), "w") as f:
        json.dump(config, f, indent=2)
    return out, meant


def reference_with(src_dir, meant):
    """base.reference's cases for the model in src_dir with its weights replaced by `meant`."""
    tok = base.AutoTokenizer.from_pretrained(src_dir)
    m = AutoModelForCausalLM.from_pretrained(src_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        for key, p in m.state_dict().items():
            if key in meant:
                p.copy_(torch.from_numpy(meant[key]))
    if m.config.tie_word_embeddings:
        assert m.lm_head.weight.data_ptr() == m.model.embed_tokens.weight.data_ptr()
    cases = []
    for prompt in base.PROMPTS:
        ids = tok(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            logits = m(ids).logits[0, -1]
            out = m.generate(
                ids, max_new_tokens=base.N_GEN, min_new_tokens=base.N_GEN, do_sample=False, pad_token_id=0
            )
            # The logits after the prompt and after each generated token but the last, from
            # one pass over the whole sequence: what a teacher-forced decode must give.
            steps = m(out[:, :-1]).logits[0, ids.shape[1] - 1 :]
        top2 = torch.topk(steps, 2, dim=-1).values
        cases.append(
            {
                "prompt": prompt,
                "prompt_ids": ids[0].tolist(),
                "generated": out[0, ids.shape[1] :].tolist(),
                "logits": [float(x) for x in logits.tolist()],
                "step_logits": [[float(x) for x in row] for row in steps.tolist()],
                "margins": [float(x) for x in (top2[:, 0] - top2[:, 1]).tolist()],
            }
        )
    return cases


def main():
    os.makedirs(SYMB, exist_ok=True)
    tokenizer = base.make_tokenizer()
    cfg = MistralConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        bos_token_id=0,
        eos_token_id=2,
        sliding_window=None,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    torch.manual_seed(0)
    m = MistralForCausalLM(cfg)
    base.noise(m, False, 5)
    d = base.build("mistral-tiny", m, torch.float16, tokenizer)
    cases = base.reference(d)
    with open(os.path.join(HF, "mistral-tiny.json"), "w") as f:
        json.dump({"model": "mistral-tiny", "cases": cases}, f)
    print("mistral-tiny", [c["generated"] for c in cases])

    for name, theta in (("mistral-tiny", 10000.0), ("qwen2-tiny", 1000000.0)):
        src = os.path.join(HF, name)
        model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
        out, meant = write_symb(src, name, model, theta)
        cases = reference_with(src, meant)
        with open(os.path.join(SYMB, name + "-int4.json"), "w") as f:
            json.dump({"model": name + "-int4", "cases": cases}, f)
        print(name + "-int4", [c["generated"] for c in cases])


if __name__ == "__main__":
    main()
