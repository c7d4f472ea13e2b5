#!/usr/bin/env python3
"""tests/fixtures/hf/qwen2-tiny-sharded: qwen2-tiny saved again by transformers in shards of at
most 100 kB (`model-0000N-of-0000M.safetensors` and `model.safetensors.index.json`), with its
tokenizer files. The goldens of qwen2-tiny (tests/fixtures/hf/qwen2-tiny.json) apply to it.

    python3 scripts/reference/make_sharded_model.py

Needs the environment of make_hf_models.py.
"""

import os
import shutil

import torch
from transformers import AutoModelForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
HF = os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests", "fixtures", "hf")


def main():
    src = os.path.join(HF, "qwen2-tiny")
    out = os.path.join(HF, "qwen2-tiny-sharded")
    shutil.rmtree(out, ignore_errors=True)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)
    model.save_pretrained(out, max_shard_size="100KB")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(src, f), os.path.join(out, f))
    print(sorted(os.listdir(out)))


if __name__ == "__main__":
    main()
