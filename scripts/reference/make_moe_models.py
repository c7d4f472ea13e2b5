#!/usr/bin/env python3
"""Tiny mixture-of-experts GGUF files and transformers' outputs on them.

    python3 scripts/reference/make_moe_models.py

Needs the environment of make_hf_models.py (torch, transformers, tokenizers) and gguf-py
(`pip install gguf`), whose writer lays out the files; the tensor names, shapes and q/k row
order are llama.cpp's (`convert_hf_to_gguf.py`), written here from its conventions, not by
synaptix. The byte-level BPE tokenizer of make_hf_models.py travels as
`tokenizer.huggingface.json`.

| file | transformers class | what it covers |
|---|---|---|
| mixtral-tiny.gguf | MixtralForCausalLM | `llama` with `llama.expert_count` 4, 2 used; q/k rows permuted |
| qwen3moe-tiny.gguf | Qwen3MoeForCausalLM | `qwen3moe`: QK-norm, head_dim 32, expert width 48 ≠ dense 96, renormalised top-2 of 8 |
| qwen2moe-tiny.gguf | Qwen2MoeForCausalLM | `qwen2moe`: q/k/v biases, top-2 of 4 not renormalised, a shared expert (width 80) behind a sigmoid gate |

Matrices are stored F16, norms and routers F32, all holding float16 values (their transformers
model holds the same values in float32). tests/fixtures/moe/<name>.json holds, per prompt: the ids, 8 greedy tokens,
the float32 logits after the prompt and after each generated token, and each step's top-two
margin.

The same two models are also saved as Hugging Face directories (F16) in tests/fixtures/hf/:
qwen3moe-tiny as transformers 5 saves it (each layer's experts fused: `mlp.experts.gate_up_proj`
[E, 2·ff, d], `mlp.experts.down_proj`), mixtral-tiny rewritten in the layout of the published
Mixtral checkpoints (`block_sparse_moe.gate`, `block_sparse_moe.experts.{e}.w1/w2/w3`), which
transformers converts on load (checked here: the same logits). The goldens above serve them.
"""

import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_hf_models as base  # noqa: E402
import gguf  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

ROOT = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(ROOT, "tests", "fixtures", "moe")


def permute(w, n_head):
    """convert_hf_to_gguf's q/k reordering for `llama`: rotate-half pairs to adjacent pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path, arch, model, tok_json, extra_keys, permute_qk):
    cfg = model.config
    sd = {k: v.float().numpy() for k, v in model.state_dict().items()}
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w = gguf.GGUFWriter(path, arch)
    w.add_name(os.path.basename(path)[: -len(".gguf")])
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    for k, v in extra_keys.items():
        w.add_uint32(f"{arch}.{k}", v)
    w.add_bos_token_id(cfg.bos_token_id)
    w.add_eos_token_id(cfg.eos_token_id)
    w.add_string("tokenizer.huggingface.json", tok_json)

    def matrix(name, a):
        w.add_tensor(name, np.ascontiguousarray(a).astype(np.float16))

    def vector(name, a):
        w.add_tensor(name, np.ascontiguousarray(a).astype(np.float32))

    matrix("token_embd.weight", sd["model.embed_tokens.weight"])
    vector("output_norm.weight", sd["model.norm.weight"])
    if "lm_head.weight" in sd and not cfg.tie_word_embeddings:
        matrix("output.weight", sd["lm_head.weight"])
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        b = f"blk.{i}."
        q = sd[p + "self_attn.q_proj.weight"]
        k = sd[p + "self_attn.k_proj.weight"]
        if permute_qk:
            q = permute(q, cfg.num_attention_heads)
            k = permute(k, cfg.num_key_value_heads)
        vector(b + "attn_norm.weight", sd[p + "input_layernorm.weight"])
        matrix(b + "attn_q.weight", q)
        matrix(b + "attn_k.weight", k)
        matrix(b + "attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        matrix(b + "attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        for proj in ("q", "k", "v"):
            if p + f"self_attn.{proj}_proj.bias" in sd:
                vector(b + f"attn_{proj}.bias", sd[p + f"self_attn.{proj}_proj.bias"])
        if p + "self_attn.q_norm.weight" in sd:
            vector(b + "attn_q_norm.weight", sd[p + "self_attn.q_norm.weight"])
            vector(b + "attn_k_norm.weight", sd[p + "self_attn.k_norm.weight"])
        vector(b + "ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        vector(b + "ffn_gate_inp.weight", sd[p + "mlp.gate.weight"])
        gate_up = sd[p + "mlp.experts.gate_up_proj"]  # [E, 2·ff, d]: gate rows, then up rows
        ff = gate_up.shape[1] // 2
        matrix(b + "ffn_gate_exps.weight", gate_up[:, :ff, :])
        matrix(b + "ffn_up_exps.weight", gate_up[:, ff:, :])
        matrix(b + "ffn_down_exps.weight", sd[p + "mlp.experts.down_proj"])
        if p + "mlp.shared_expert_gate.weight" in sd:
            # llama.cpp's shared-expert gate is a vector of n_embd.
            vector(b + "ffn_gate_inp_shexp.weight", sd[p + "mlp.shared_expert_gate.weight"][0])
            matrix(b + "ffn_gate_shexp.weight", sd[p + "mlp.shared_expert.gate_proj.weight"])
            matrix(b + "ffn_up_shexp.weight", sd[p + "mlp.shared_expert.up_proj.weight"])
            matrix(b + "ffn_down_shexp.weight", sd[p + "mlp.shared_expert.down_proj.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def cases(model, tok):
    model.eval()
    out_cases = []
    for prompt in base.PROMPTS:
        ids = tok(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            logits = model(ids).logits[0, -1]
            out = model.generate(
                ids, max_new_tokens=base.N_GEN, min_new_tokens=base.N_GEN, do_sample=False, pad_token_id=0
            )
            steps = model(out[:, :-1]).logits[0, ids.shape[1] - 1 :]
        top2 = torch.topk(steps, 2, dim=-1).values
        out_cases.append(
            {
                "prompt": prompt,
                "prompt_ids": ids[0].tolist(),
                "generated": out[0, ids.shape[1] :].tolist(),
                "logits": [float(x) for x in logits.tolist()],
                "step_logits": [[float(x) for x in row] for row in steps.tolist()],
                "margins": [float(x) for x in (top2[:, 0] - top2[:, 1]).tolist()],
            }
        )
    return out_cases


def to_published_mixtral_layout(d):
    """Rewrites a saved Mixtral's model.safetensors with the names and per-expert tensors of
    the published checkpoints."""
    path = os.path.join(d, "model.safetensors")
    old = load_file(path)
    new = {}
    for k, v in old.items():
        if ".mlp.gate." in k:
            new[k.replace(".mlp.gate.", ".block_sparse_moe.gate.")] = v
        elif k.endswith("mlp.experts.gate_up_proj"):
            prefix = k[: -len("mlp.experts.gate_up_proj")]
            ff = v.shape[1] // 2
            for e in range(v.shape[0]):
                new[f"{prefix}block_sparse_moe.experts.{e}.w1.weight"] = v[e, :ff].clone()
                new[f"{prefix}block_sparse_moe.experts.{e}.w3.weight"] = v[e, ff:].clone()
        elif k.endswith("mlp.experts.down_proj"):
            prefix = k[: -len("mlp.experts.down_proj")]
            for e in range(v.shape[0]):
                new[f"{prefix}block_sparse_moe.experts.{e}.w2.weight"] = v[e].clone()
        else:
            new[k] = v
    save_file(new, path, metadata={"format": "pt"})


def to_f16_values(model):
    """Rounds every parameter to float16 and back (the norms and routers too, which the GGUF
    keeps in F32, because the Hugging Face directories store everything in F16), so that the
    float32 model holds exactly what the files store."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.half().float())


def main():
    os.makedirs(OUT, exist_ok=True)
    tokenizer = base.make_tokenizer()
    tmp = os.path.join(OUT, "_tok")
    os.makedirs(tmp, exist_ok=True)
    tokenizer.save(os.path.join(tmp, "tokenizer.json"))
    with open(os.path.join(tmp, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>", "tokenizer_class": "PreTrainedTokenizerFast"}, f)
    tok = base.AutoTokenizer.from_pretrained(tmp)
    tok_json = open(os.path.join(tmp, "tokenizer.json")).read()
    common = dict(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        bos_token_id=0,
        eos_token_id=2,
        tie_word_embeddings=False,
    )

    torch.manual_seed(0)
    cfg = MixtralConfig(
        **common,
        intermediate_size=64,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=None,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    )
    m = MixtralForCausalLM(cfg)
    base.noise(m, False, 6)
    to_f16_values(m)
    specs = [("mixtral-tiny", "llama", m, {"expert_count": 4, "expert_used_count": 2}, True)]

    cfg = Qwen3MoeConfig(
        **common,
        intermediate_size=96,
        moe_intermediate_size=48,
        head_dim=32,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    )
    m = Qwen3MoeForCausalLM(cfg)
    base.noise(m, False, 7)
    to_f16_values(m)
    extra = {"expert_count": 8, "expert_used_count": 2, "expert_feed_forward_length": 48}
    specs.append(("qwen3moe-tiny", "qwen3moe", m, extra, False))

    cfg = Qwen2MoeConfig(
        **common,
        intermediate_size=96,
        moe_intermediate_size=48,
        shared_expert_intermediate_size=80,
        num_experts=4,
        num_experts_per_tok=2,
        norm_topk_prob=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    )
    m = Qwen2MoeForCausalLM(cfg)
    base.noise(m, False, 8)
    to_f16_values(m)
    extra = {
        "expert_count": 4,
        "expert_used_count": 2,
        "expert_feed_forward_length": 48,
        "expert_shared_feed_forward_length": 80,
    }
    specs.append(("qwen2moe-tiny", "qwen2moe", m, extra, False))

    for name, arch, model, extra, perm in specs:
        write_gguf(os.path.join(OUT, name + ".gguf"), arch, model, tok_json, extra, perm)
        got = cases(model, tok)
        d = base.build(name, model, torch.float16, tokenizer)
        if name == "mixtral-tiny":
            to_published_mixtral_layout(d)
        again = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
        for a, b in zip(cases(again, tok), got):
            assert a["generated"] == b["generated"], f"transformers reads {d} differently"
            diff = np.abs(np.array(a["step_logits"]) - np.array(b["step_logits"])).max()
            assert diff < 1e-4, f"transformers reads {d} differently: {diff}"
        with open(os.path.join(OUT, name + ".json"), "w") as f:
            json.dump({"model": name, "cases": got}, f)
        print(name, [c["generated"] for c in got], [min(c["margins"]) for c in got])
    for f in os.listdir(tmp):
        os.remove(os.path.join(tmp, f))
    os.rmdir(tmp)


if __name__ == "__main__":
    main()
