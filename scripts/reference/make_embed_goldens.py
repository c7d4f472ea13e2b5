#!/usr/bin/env python3
"""Writes tests/fixtures/embed/goldens.json: all-MiniLM-L6-v2 token ids and sentence embeddings.

    python3 scripts/reference/make_embed_goldens.py [MODEL_DIR]
    (default MODEL_DIR: the cache of scripts/fetch-models.sh, all-minilm-l6-v2)

The reference is sentence-transformers itself (SentenceTransformer(MODEL_DIR, device="cpu")
.encode of the six texts as one padded batch, float32), with an independent float64 numpy
implementation of Hugging Face's BertModel + Pooling + Normalize as a cross-check (the script
fails if they disagree by more than 2e-6). Token ids come from Python's `tokenizers` on the
directory's tokenizer.json (the file's fixed padding off, truncation at
sentence_bert_config.json's max_seq_length, 256, as sentence-transformers sets them) and are
checked against sentence-transformers' own tokenizer.

Setup (PyPI's torch wheel is CUDA-linked: on a machine without a GPU it still needs the nvidia
packages its metadata names to import, about 3 GB, then runs on the CPU):

    python3 -m venv ref && ref/bin/pip install torch sentence-transformers safetensors

Without torch (`--numpy-only`), the goldens come from the numpy implementation alone (it agrees
with sentence-transformers to within 1e-6).
"""

import json
import math
import os
import sys

import numpy as np
from safetensors.numpy import load_file
from tokenizers import Tokenizer

SENTENCES = [
    "A man is playing a guitar.",
    "Someone plays an acoustic guitar on stage.",
    "The quarterly tax report is due next Friday.",
    "Café crème, naïve façade: Zürich's Ångström-level résumé™ — 東京 🙂",
    "How do I reset my password?",
    (
        "The history of the printing press begins in the fifteenth century, when Johannes "
        "Gutenberg combined movable metal type, oil-based inks and a wooden screw press into a "
        "system that could produce books far faster than scribes. Within a few decades presses "
        "had spread to more than two hundred cities across Europe, and millions of volumes were "
        "in circulation. Scholars argue that this sudden abundance of text accelerated the "
        "Reformation, the scientific revolution and the growth of literacy, while printers "
        "themselves became merchants, editors and sometimes censors' targets."
    ),
]


def gelu(x):
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def embed(model_dir, ids, cfg, t, pooling, normalize):
    def p(name):
        return t[name].astype(np.float64)

    def lin(x, name):
        return x @ p(name + ".weight").T + p(name + ".bias")

    eps = cfg["layer_norm_eps"]
    heads = cfg["num_attention_heads"]
    n = len(ids)
    x = (
        p("embeddings.word_embeddings.weight")[ids]
        + p("embeddings.position_embeddings.weight")[:n]
        + p("embeddings.token_type_embeddings.weight")[0]
    )
    x = layer_norm(x, p("embeddings.LayerNorm.weight"), p("embeddings.LayerNorm.bias"), eps)
    d = x.shape[1]
    dh = d // heads
    for i in range(cfg["num_hidden_layers"]):
        pre = f"encoder.layer.{i}."
        q = lin(x, pre + "attention.self.query").reshape(n, heads, dh).transpose(1, 0, 2)
        k = lin(x, pre + "attention.self.key").reshape(n, heads, dh).transpose(1, 0, 2)
        v = lin(x, pre + "attention.self.value").reshape(n, heads, dh).transpose(1, 0, 2)
        s = q @ k.transpose(0, 2, 1) / math.sqrt(dh)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        ctx = (s @ v).transpose(1, 0, 2).reshape(n, d)
        a = lin(ctx, pre + "attention.output.dense") + x
        x = layer_norm(
            a, p(pre + "attention.output.LayerNorm.weight"), p(pre + "attention.output.LayerNorm.bias"), eps
        )
        h = gelu(lin(x, pre + "intermediate.dense"))
        o = lin(h, pre + "output.dense") + x
        x = layer_norm(o, p(pre + "output.LayerNorm.weight"), p(pre + "output.LayerNorm.bias"), eps)
    if pooling.get("pooling_mode_cls_token"):
        e = x[0]
    else:
        e = x.mean(0)
    if normalize:
        e = e / max(np.linalg.norm(e), 1e-12)
    return e


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    cache = os.environ.get("SYNAPTIX_MODELS") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "synaptix", "models"
    )
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    model_dir = args[0] if args else os.path.join(cache, "all-minilm-l6-v2")
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    pooling = json.load(open(os.path.join(model_dir, "1_Pooling", "config.json")))
    modules = json.load(open(os.path.join(model_dir, "modules.json")))
    normalize = any(m["type"].endswith("Normalize") for m in modules)
    max_len = json.load(open(os.path.join(model_dir, "sentence_bert_config.json")))["max_seq_length"]

    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(max_len)
    tensors = load_file(os.path.join(model_dir, "model.safetensors"))

    cases = []
    for text in SENTENCES:
        ids = tok.encode(text).ids
        e = embed(model_dir, ids, cfg, tensors, pooling, normalize)
        cases.append({"text": text, "ids": ids, "embedding": e})
        print(f"{len(ids):4d} tokens  {text[:50]!r}")

    reference = "numpy BertModel + pooling + normalize (float64)"
    if "--numpy-only" not in sys.argv:
        import sentence_transformers
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(1)
        model = SentenceTransformer(model_dir, device="cpu")
        assert model.max_seq_length == max_len, model.max_seq_length
        st = model.encode(SENTENCES, batch_size=len(SENTENCES), convert_to_numpy=True)
        features = model.tokenize(SENTENCES)
        for i, c in enumerate(cases):
            n = int(features["attention_mask"][i].sum())
            assert features["input_ids"][i][:n].tolist() == c["ids"], c["text"]
            diff = float(np.abs(st[i].astype(np.float64) - c["embedding"]).max())
            print(f"sentence-transformers vs numpy: max abs diff {diff:.2e}")
            assert diff < 2e-6, (c["text"], diff)
            c["embedding"] = st[i].astype(np.float64)
        reference = (
            f"sentence-transformers {sentence_transformers.__version__} (torch {torch.__version__}, "
            f"CPU, float32, one padded batch); checked against numpy BertModel (float64)"
        )
    for c in cases:
        c["embedding"] = [round(float(v), 6) for v in c["embedding"]]

    out_dir = os.path.join(root, "tests", "fixtures", "embed")
    os.makedirs(out_dir, exist_ok=True)
    out = {
        "model": "all-MiniLM-L6-v2",
        "reference": reference + ", token ids from tokenizers " + __import__("tokenizers").__version__,
        "max_seq_length": max_len,
        "dim": cfg["hidden_size"],
        "cases": cases,
    }
    # One case per line.
    head = json.dumps({k: v for k, v in out.items() if k != "cases"}, ensure_ascii=False)
    body = ",\n".join("  " + json.dumps(c, ensure_ascii=False) for c in cases)
    with open(os.path.join(out_dir, "goldens.json"), "w") as f:
        f.write(head[:-1] + ', "cases": [\n' + body + "\n]}\n")
    embs = np.array([c["embedding"] for c in cases])
    print("cosine similarities:\n", np.round(embs @ embs.T, 3))


if __name__ == "__main__":
    main()
