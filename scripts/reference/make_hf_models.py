#!/usr/bin/env python3
"""Tiny Hugging Face LLM directories (random weights) and transformers' outputs on them.

    python3 scripts/reference/make_hf_models.py

Writes tests/fixtures/hf/<name>/ (config.json, model.safetensors, tokenizer.json,
tokenizer_config.json, generation_config.json) as `save_pretrained` writes them, and
tests/fixtures/hf/<name>.json: for each prompt, the ids that the directory's tokenizer gives,
transformers' 8 greedy tokens and its float32 logits after the prompt.

| name | class | weights | what it covers |
|---|---|---|---|
| llama-tiny | LlamaForCausalLM | BF16 | q/k rows reordered for GGUF, llama3 RoPE scaling, untied output |
| qwen2-tiny | Qwen2ForCausalLM | BF16 | q/k/v biases, a chat template |
| qwen3-tiny | Qwen3ForCausalLM | F16 | q/k norms, head_dim other than hidden/heads, tied output |
| gemma3-tiny | Gemma3ForCausalLM | F32 | 1 + w norms, sliding window (4) shorter than the prompts, two RoPE bases; config.json in transformers 4's spelling |

Weights are seeded noise with a spread that keeps the logits far from ties. One byte-level BPE
tokenizer (trained here on a few sentences, 320 entries plus specials) serves all four.

Setup: python3 -m venv ref && ref/bin/pip install torch transformers tokenizers safetensors
(transformers 5.25.0 and torch 2.15 made the committed files).
"""

import json
import os
import shutil

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests", "fixtures", "hf")
N_GEN = 8
PROMPTS = [
    "The quick brown fox",
    "Once upon a time, in a land far away, there lived a small model that read safetensors.",
]
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time, in a land far away, there lived a king and a queen.",
    "A small model reads tensors from safetensors files and writes tokens.",
    "def main():\n    print('hello, world')\n",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000.",
] * 4
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def make_tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def noise(model, gemma, seed):
    """Seeded weights with a useful spread: matrices ~ N(0, 4/fan_in), embeddings ~ N(0, 0.05)
    (small, so that a tied output head does not just repeat the input token), norms near their
    identity (1, or 0 for Gemma's 1 + w), biases ~ N(0, 0.1)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                fan_in = p.shape[1]
                std = 0.05 if "embed" in name else 2.0 * fan_in**-0.5
                p.copy_(torch.randn(p.shape, generator=g) * std)
            elif "norm" in name:
                base = 0.0 if gemma else 1.0
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))


def old_style_gemma_config(path, layer_pattern):
    """Rewrites config.json as transformers 4 (and Google's published Gemma 3 checkpoints)
    spell it: rope_theta, rope_local_base_freq and sliding_window_pattern rather than
    rope_parameters and layer_types."""
    with open(path) as f:
        cfg = json.load(f)
    rope = cfg.pop("rope_parameters")
    cfg.pop("layer_types", None)
    cfg.pop("_sliding_window_pattern", None)
    cfg["rope_theta"] = rope["full_attention"]["rope_theta"]
    cfg["rope_local_base_freq"] = rope["sliding_attention"]["rope_theta"]
    cfg["rope_scaling"] = None
    cfg["sliding_window_pattern"] = layer_pattern
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)


def build(name, model, dtype, tokenizer, chat_template=None):
    d = os.path.join(OUT, name)
    shutil.rmtree(d, ignore_errors=True)
    model.to(dtype).save_pretrained(d)
    tokenizer.save(os.path.join(d, "tokenizer.json"))
    tok_cfg = {
        "bos_token": "<|endoftext|>",
        "eos_token": "<|im_end|>",
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    if chat_template:
        tok_cfg["chat_template"] = chat_template
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(tok_cfg, f, indent=2)
    return d


def reference(d):
    tok = AutoTokenizer.from_pretrained(d)
    m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    cases = []
    for prompt in PROMPTS:
        ids = tok(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            logits = m(ids).logits[0, -1]
            out = m.generate(
                ids,
                max_new_tokens=N_GEN,
                min_new_tokens=N_GEN,
                do_sample=False,
                pad_token_id=0,
            )
        cases.append(
            {
                "prompt": prompt,
                "prompt_ids": ids[0].tolist(),
                "generated": out[0, ids.shape[1] :].tolist(),
                "logits": [float(x) for x in logits.tolist()],
            }
        )
    return cases


def main():
    os.makedirs(OUT, exist_ok=True)
    tokenizer = make_tokenizer()
    vocab = tokenizer.get_vocab_size()
    common = dict(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        bos_token_id=0,
        eos_token_id=2,
    )
    specs = []

    torch.manual_seed(0)
    cfg = LlamaConfig(
        **common,
        tie_word_embeddings=False,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 10000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    )
    m = LlamaForCausalLM(cfg)
    noise(m, False, 1)
    specs.append(("llama-tiny", m, torch.bfloat16, None))

    cfg = Qwen2Config(**common, tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    m = Qwen2ForCausalLM(cfg)
    noise(m, False, 2)
    specs.append(("qwen2-tiny", m, torch.bfloat16, CHATML))

    cfg = Qwen3Config(**common, head_dim=32, tie_word_embeddings=True)
    m = Qwen3ForCausalLM(cfg)
    noise(m, False, 3)
    specs.append(("qwen3-tiny", m, torch.float16, None))

    gcommon = dict(common, num_hidden_layers=3, num_key_value_heads=1)
    cfg = Gemma3TextConfig(
        **gcommon,
        head_dim=16,
        query_pre_attn_scalar=16,
        sliding_window=4,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
        tie_word_embeddings=True,
    )
    m = Gemma3ForCausalLM(cfg)
    noise(m, True, 4)
    specs.append(("gemma3-tiny", m, torch.float32, None))

    for name, model, dtype, template in specs:
        d = build(name, model, dtype, tokenizer, template)
        cases = reference(d)
        if name == "gemma3-tiny":
            old_style_gemma_config(os.path.join(d, "config.json"), 3)
            again = reference(d)
            assert again == cases, "transformers reads the old-style config differently"
        with open(os.path.join(OUT, name + ".json"), "w") as f:
            json.dump({"model": name, "cases": cases}, f)
        print(name, [c["generated"] for c in cases])


if __name__ == "__main__":
    main()
