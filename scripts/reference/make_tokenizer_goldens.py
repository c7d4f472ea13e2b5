#!/usr/bin/env python3
"""Records llama.cpp's tokenization of the tokenizer corpus, as goldens for synaptix's tests.

    scripts/reference/make_tokenizer_goldens.py [--llama-tokenize PATH] [--models DIR]

For every entry of tests/fixtures/tokenizer/corpus.json and every model below (and the
vocabulary variants in VARIANTS), runs llama.cpp's
`llama-tokenize` twice with special-token parsing (`--ids`, then the per-token pieces) and twice
without (`--no-parse-special`), and writes tests/fixtures/tokenizer/goldens_<model>.json.

`llama-tokenize` adds BOS exactly when the model asks for it (add_special = add_bos_token); the
goldens record that as `add_special`. The text goes through a file (`-f`, read verbatim) with
`--no-escape`, so the bytes tokenized are exactly the corpus entry's.

`pieces` are llama.cpp's `common_token_to_piece(special = true)` of each id: a UTF-8 string, or
`{"bytes": [...]}` when the piece is not valid UTF-8 on its own (part of a character).
`detokenized` is the pieces joined, without the leading BOS the model adds: what
`llama_detokenize(remove_special = true, unparse_special = true)` gives for these two models
(neither adds a space prefix nor cleans up spaces). `llama-tokenize` prints pieces with
`printf("%s")`, so a piece containing a NUL byte would be cut: the corpus has no NUL.

It also writes tests/fixtures/tokenizer/pretok_regex.json: the corpus split by the original
pre-tokenizer regular expressions of Llama 3 (`llama-bpe`), Qwen2 and GPT-2, run by the PyPI
`regex` module (`pip install regex`), which supports \\p{L} and look-ahead. No Llama 3 model
file is at hand, so this is how the Llama 3 splitting is checked.

The binary is taken from --llama-tokenize, else $LLAMA_TOKENIZE, else
../peer/llama.cpp/build/bin/llama-tokenize beside the repository (where
../shared/peer/llamacpp.sh builds it); its shared libraries are expected beside it.
Models come from --models, else $SYNAPTIX_MODELS, else ${XDG_CACHE_HOME:-~/.cache}/synaptix/models
(scripts/fetch-models.sh downloads them).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "tokenizer"

# golden name -> GGUF file name (as scripts/fetch-models.sh stores them)
MODELS = {
    "gemma3-270m": "gemma-3-270m-q4_k_m.gguf",
    "qwen2.5-coder-0.5b": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
}


# Real vocabularies relabelled with another pre-tokenizer (golden name -> (model, pre)): the only
# way to compare those pre-tokenizers with llama.cpp end to end without more model files. The
# test builds the same relabelled file from the model (crates/tokenizer/tests/goldens.rs).
VARIANTS = {
    "qwen-vocab-llama-bpe": ("qwen2.5-coder-0.5b", "llama-bpe"),
    "qwen-vocab-default": ("qwen2.5-coder-0.5b", "default"),
    "qwen-vocab-gpt-2": ("qwen2.5-coder-0.5b", "gpt-2"),
    "qwen-vocab-starcoder": ("qwen2.5-coder-0.5b", "starcoder"),
}


def default_models_dir() -> Path:
    if os.environ.get("SYNAPTIX_MODELS"):
        return Path(os.environ["SYNAPTIX_MODELS"])
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "synaptix" / "models"


class LlamaTokenize:
    def __init__(self, binary: Path):
        self.binary = binary
        env = dict(os.environ)
        libdir = str(binary.parent)
        env["LD_LIBRARY_PATH"] = libdir + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
        self.env = env

    def run(self, args: list[str]) -> bytes:
        proc = subprocess.run(
            [str(self.binary), *args], env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        if proc.returncode != 0:
            sys.exit(f"llama-tokenize {' '.join(args)} failed ({proc.returncode}):\n"
                     + proc.stderr.decode(errors="replace")[-3000:])
        return proc.stdout

    def version(self) -> str:
        proc = subprocess.run([str(self.binary), "--version"], env=self.env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        lines = [l for l in proc.stdout.decode(errors="replace").splitlines() if l.startswith("version")]
        return lines[0] if lines else "unknown"

    def tokenize(self, model: Path, text_file: Path, parse_special: bool) -> tuple[list[int], list[bytes]]:
        base = ["-m", str(model), "-f", str(text_file), "--no-escape", "--log-disable"]
        if not parse_special:
            base.append("--no-parse-special")
        out = self.run(base + ["--ids"]).decode().strip()
        ids = json.loads(out)
        pieces = parse_pieces(self.run(base), ids)
        return ids, pieces


def parse_pieces(out: bytes, ids: list[int]) -> list[bytes]:
    """Splits `%6d -> '%s'\\n` lines, one per id. A piece may itself contain a newline or a
    quote, so each piece ends where the next expected id's prefix begins."""
    pieces = []
    pos = 0
    for i, tid in enumerate(ids):
        head = b"%6d -> '" % tid
        if not out.startswith(head, pos):
            raise ValueError(f"unexpected output at token {i}: {out[pos:pos + 40]!r}")
        start = pos + len(head)
        if i + 1 < len(ids):
            end = out.index(b"'\n" + b"%6d -> '" % ids[i + 1], start)
        else:
            end = out.rindex(b"'\n")
        pieces.append(out[start:end])
        pos = end + 2
    if pos != len(out):
        raise ValueError(f"trailing output: {out[pos:pos + 80]!r}")
    return pieces


def piece_json(p: bytes):
    try:
        return p.decode("utf-8")
    except UnicodeDecodeError:
        return {"bytes": list(p)}


def model_adds_bos(tok: LlamaTokenize, model: Path, tmp: Path) -> bool:
    """Whether llama-tokenize adds a BOS: compare with --no-bos on a one-letter text."""
    f = tmp / "probe.txt"
    f.write_bytes(b"a")
    with_bos = json.loads(tok.run(["-m", str(model), "-f", str(f), "--ids", "--log-disable"]))
    without = json.loads(tok.run(["-m", str(model), "-f", str(f), "--ids", "--log-disable", "--no-bos"]))
    return len(with_bos) == len(without) + 1


# The pre-tokenizer expressions as the models' tokenizer.json files define them.
PRETOK_REGEXES = {
    "llama3": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "gpt2": r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
}


def regex_split(pattern, text: str) -> list[str]:
    """Matches in order, with any unmatched gap kept as a word of its own."""
    words, at = [], 0
    for m in pattern.finditer(text):
        if m.start() > at:
            words.append(text[at:m.start()])
        words.append(m.group())
        at = m.end()
    if at < len(text):
        words.append(text[at:])
    return words


def write_pretok_goldens(corpus: list[dict], out: Path) -> None:
    import regex  # PyPI `regex`: \p{..} classes and look-ahead

    compiled = {k: regex.compile(v) for k, v in PRETOK_REGEXES.items()}
    golden = {
        "about": "corpus.json split by the pre-tokenizer regexes, run by the Python `regex` module "
                 f"{regex.__version__}; regenerate with scripts/reference/make_tokenizer_goldens.py",
        "regexes": PRETOK_REGEXES,
        "entries": [
            {"name": e["name"], "text": e["text"],
             **{k: regex_split(p, e["text"]) for k, p in compiled.items()}}
            for e in corpus
        ],
    }
    path = out / "pretok_regex.json"
    path.write_text(json.dumps(golden, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path}", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-tokenize", type=Path,
                    default=Path(os.environ.get(
                        "LLAMA_TOKENIZE",
                        Path(__file__).resolve().parents[3] / "peer/llama.cpp/build/bin/llama-tokenize")))
    ap.add_argument("--models", type=Path, default=default_models_dir())
    ap.add_argument("--corpus", type=Path, default=FIXTURES / "corpus.json")
    ap.add_argument("--out", type=Path, default=FIXTURES)
    ap.add_argument("--only", choices=sorted([*MODELS, *VARIANTS]), help="one golden file only")
    ap.add_argument("--pretok-only", action="store_true", help="only write pretok_regex.json")
    args = ap.parse_args()

    corpus = json.loads(args.corpus.read_text(encoding="utf-8"))["entries"]
    write_pretok_goldens(corpus, args.out)
    if args.pretok_only:
        return

    if not args.llama_tokenize.exists():
        sys.exit(f"llama-tokenize not found at {args.llama_tokenize} (use --llama-tokenize or $LLAMA_TOKENIZE)")
    tok = LlamaTokenize(args.llama_tokenize)
    version = tok.version()

    jobs = [(name, args.models / file_name, file_name, None) for name, file_name in MODELS.items()]
    jobs += [(name, args.models / MODELS[base], MODELS[base], pre) for name, (base, pre) in VARIANTS.items()]
    for name, model, file_name, pre in jobs:
        if args.only and name != args.only:
            continue
        if not model.exists():
            sys.exit(f"{model} not found: run scripts/fetch-models.sh")
        with tempfile.TemporaryDirectory() as tmp_s:
            tmp = Path(tmp_s)
            if pre is not None:
                model = relabel_pre_tokenizer(model, pre, tmp / "variant.gguf", args.llama_tokenize)
            write_goldens(tok, version, name, model, file_name, pre, corpus, tmp, args.out)


def write_goldens(tok, version, name, model, file_name, pre, corpus, tmp, out_dir) -> None:
    add_bos = model_adds_bos(tok, model, tmp)
    entries = []
    for e in corpus:
        text_file = tmp / "text.txt"
        text_file.write_bytes(e["text"].encode("utf-8"))
        rec = {"name": e["name"], "text": e["text"]}
        for parse_special, suffix in ((True, ""), (False, "_no_parse_special")):
            ids, pieces = tok.tokenize(model, text_file, parse_special)
            rec["ids" + suffix] = ids
            rec["pieces" + suffix] = [piece_json(p) for p in pieces]
            if pre is None:
                joined = b"".join(pieces[1:] if add_bos and ids else pieces)
                rec["detokenized" + suffix] = piece_json(joined)
        entries.append(rec)
        print(f"{name}: {e['name']}: {len(rec['ids'])} / {len(rec['ids_no_parse_special'])} tokens",
              file=sys.stderr)
    golden = {
        "about": "llama.cpp's tokenization of corpus.json; regenerate with "
                 "scripts/reference/make_tokenizer_goldens.py",
        "llama_cpp": version,
        "model": file_name,
    }
    if pre is not None:
        golden["pre_tokenizer"] = pre
        golden["note"] = (f"the vocabulary of {file_name} with tokenizer.ggml.pre set to '{pre}': checks that "
                          "pre-tokenizer against llama.cpp with a real vocabulary. No detokenized text: "
                          "llama.cpp's detokenizer cleans up spaces for this pre-tokenizer, so it is not the "
                          "pieces joined.")
    golden["add_special"] = add_bos
    out = out_dir / f"goldens_{name}.json"
    # One entry per line: compact, and a regeneration diffs entry by entry.
    head = json.dumps(golden, ensure_ascii=False)
    lines = [json.dumps(e, ensure_ascii=False, separators=(",", ":")) for e in entries]
    out.write_text(head[:-1] + ', "entries": [\n' + ",\n".join(lines) + "\n]}\n", encoding="utf-8")
    print(f"wrote {out} ({out.stat().st_size} bytes, {len(entries)} entries)", file=sys.stderr)


def relabel_pre_tokenizer(model: Path, pre: str, dest: Path, llama_tokenize: Path) -> Path:
    """A metadata-only copy of `model` whose tokenizer.ggml.pre is `pre`. Uses the `gguf` package
    (pip install gguf), or the gguf-py directory of the llama.cpp tree the binary was built in."""
    try:
        import gguf
    except ImportError:
        for parent in llama_tokenize.resolve().parents:
            if (parent / "gguf-py" / "gguf").is_dir():
                sys.path.insert(0, str(parent / "gguf-py"))
                break
        import gguf
    reader = gguf.GGUFReader(str(model))
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    writer = gguf.GGUFWriter(str(dest), arch)
    T = gguf.GGUFValueType
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        kind = field.types[0]
        if kind == T.ARRAY:
            sub = field.types[1]
            if sub == T.STRING:
                value = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
            else:
                value = [field.parts[i][0].item() for i in field.data]
            writer.add_key_value(key, value, kind, sub_type=sub)
        elif kind == T.STRING:
            value = bytes(field.parts[-1]).decode("utf-8")
            writer.add_key_value(key, pre if key == "tokenizer.ggml.pre" else value, kind)
        else:
            writer.add_key_value(key, field.parts[-1][0].item(), kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dest

if __name__ == "__main__":
    main()
