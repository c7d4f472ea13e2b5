#!/usr/bin/env python3
"""Golden outputs of llama.cpp for synaptix's model tests.

For each real model and prompt: the prompt's token ids (llama.cpp's tokenizer, BOS as the
vocabulary says, special tokens parsed), 32 greedy tokens, and a subsample of the first-step
logits (every 16th vocabulary entry plus the reference's top 64, so the normalised MSE over the
subsample estimates the full one without committing megabytes).

    scripts/reference/make_model_goldens.py LLAMA_CPP_DIR [MODELS_DIR]

LLAMA_CPP_DIR is a llama.cpp tree built PORTABLE, every SIMD path off, so that its arithmetic is
plain C that synaptix reproduces bit for bit (llama.cpp's own AVX-512 and portable builds differ by
a logits NMSE of ~1e-3 on Gemma 3 and diverge in greedy tokens; a reference must be exact):

    tar xJf llama.cpp.tar.xz && cd llama.cpp   # from ../shared/peer/llamacpp.sh src
    cmake -B build -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=OFF -DGGML_AVX=OFF \
      -DGGML_AVX2=OFF -DGGML_FMA=OFF -DGGML_F16C=OFF -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF \
      -DGGML_SSE42=OFF -DGGML_BMI2=OFF -DGGML_LLAMAFILE=OFF
    cmake --build build -j --target llama-completion The helper llama_reference.c beside this script is compiled
against it with gcc. Writes tests/fixtures/goldens/<model>.json and <model>.logits.bin
(per prompt: u32 count, count u32 indices, count f32 values; little-endian).
"""
import hashlib
import json
import os
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
OUT = os.path.join(REPO, "tests", "fixtures", "goldens")
N_GEN = 32
STRIDE = 16
TOP = 64

COMMON_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a small village by the sea,",
    "Translate to French: The weather is nice today.\nFrench:",
    "1, 1, 2, 3, 5, 8, 13,",
    "Question: What is the boiling point of water in Celsius?\nAnswer:",
    "東京は日本の首都です。大阪は",
    "Emoji and accents 🎉🚀 café, naïve, résumé. In short,",
    "The three primary colors are",
]

MODELS = {
    "gemma3-270m": {
        "file": "gemma-3-270m-q4_k_m.gguf",
        "chat": "<start_of_turn>user\nWrite a haiku about autumn.<end_of_turn>\n<start_of_turn>model\n",
    },
    "qwen2.5-coder-0.5b": {
        "file": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "chat": "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
        "Write a haiku about autumn.<|im_end|>\n<|im_start|>assistant\n",
    },
}


def build_reference(llama_dir, workdir):
    exe = os.path.join(workdir, "llama_reference")
    lib = os.path.join(llama_dir, "build", "bin")
    subprocess.run(
        ["gcc", "-O2", "-o", exe, os.path.join(HERE, "llama_reference.c"),
         "-I" + os.path.join(llama_dir, "include"), "-I" + os.path.join(llama_dir, "ggml", "include"),
         "-L" + lib, "-lllama", "-lggml", "-lggml-base", "-Wl,-rpath," + lib],
        check=True)
    return exe


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    llama_dir = sys.argv[1]
    models_dir = sys.argv[2] if len(sys.argv) > 2 else os.environ.get(
        "SYNAPTIX_MODELS", os.path.join(os.path.expanduser("~"), ".cache", "synaptix", "models"))
    os.makedirs(OUT, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        exe = build_reference(llama_dir, tmp)
        for name, spec in MODELS.items():
            path = os.path.join(models_dir, spec["file"])
            entries, blob = [], bytearray()
            for text in COMMON_PROMPTS + [spec["chat"]]:
                prompt_file = os.path.join(tmp, "prompt.txt")
                logits_file = os.path.join(tmp, "logits.f32")
                with open(prompt_file, "wb") as f:
                    f.write(text.encode("utf-8"))
                out = subprocess.run([exe, path, prompt_file, str(N_GEN), logits_file],
                                     check=True, capture_output=True, text=True).stdout
                result = json.loads(out)
                with open(logits_file, "rb") as f:
                    raw = f.read()
                logits = struct.unpack("<%df" % (len(raw) // 4), raw)
                top = sorted(range(len(logits)), key=lambda i: -logits[i])[:TOP]
                idx = sorted(set(range(0, len(logits), STRIDE)) | set(top))
                blob += struct.pack("<I", len(idx))
                blob += struct.pack("<%dI" % len(idx), *idx)
                blob += struct.pack("<%df" % len(idx), *(logits[i] for i in idx))
                entries.append({"prompt": text, "prompt_ids": result["prompt_ids"],
                                "generated": result["generated"], "n_vocab": len(logits)})
                print(name, repr(text[:40]), len(result["generated"]), "tokens", file=sys.stderr)
            golden = {
                "model": name,
                "file": spec["file"],
                "sha256": sha256(path),
                "reference": "llama.cpp 0c1e570 (llama-cpp-python 0.3.36 sdist), portable CPU build (SIMD off), flash attention off, greedy",
                "n_gen": N_GEN,
                "logits": name + ".logits.bin",
                "prompts": entries,
            }
            with open(os.path.join(OUT, name + ".json"), "w", encoding="utf-8") as f:
                json.dump(golden, f, ensure_ascii=False, indent=1)
            with open(os.path.join(OUT, name + ".logits.bin"), "wb") as f:
                f.write(blob)


if __name__ == "__main__":
    main()
