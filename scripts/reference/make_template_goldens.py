#!/usr/bin/env python3
"""Renders the chat templates in tests/fixtures/chat_templates/ with the `jinja2` package the way
Hugging Face's apply_chat_template does (sandboxed, trim_blocks, lstrip_blocks, loop controls;
`raise_exception`, `strftime_now` answering for a fixed instant) over a set of conversations,
and writes the references to tests/fixtures/chat_templates/goldens.json.

usage: python3 scripts/reference/make_template_goldens.py   (needs: pip install jinja2)
"""
import datetime
import json
import pathlib

import jinja2
import jinja2.sandbox

ROOT = pathlib.Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "chat_templates"
NOW = 1_721_997_296  # 2024-07-26 12:34:56 UTC
TOKENS = {
    "qwen2.5": ("", "<|im_end|>"),
    "gemma3": ("<bos>", "<eos>"),
    "llama3": ("<|begin_of_text|>", "<|eot_id|>"),
}
CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi  "}],
    [
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "What is the capital of Italy?"},
        {"role": "assistant", "content": "Rome."},
        {"role": "user", "content": "And of Spain?\nThanks."},
    ],
    [
        {"role": "user", "content": "Écris « bonjour » 🎉"},
        {"role": "assistant", "content": "bonjour"},
        {"role": "user", "content": "  again  "},
        {"role": "assistant", "content": "bonjour\n"},
        {"role": "user", "content": "last"},
    ],
]


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def strftime_now(fmt):
    return datetime.datetime.fromtimestamp(NOW, datetime.timezone.utc).strftime(fmt)


def main():
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.filters["tojson"] = lambda x: json.dumps(x, ensure_ascii=False)
    cases = []
    for name, (bos, eos) in TOKENS.items():
        template = env.from_string((ROOT / f"{name}.jinja").read_text())
        for i, messages in enumerate(CONVERSATIONS):
            for agp in (True, False):
                text = template.render(
                    messages=messages, add_generation_prompt=agp, bos_token=bos, eos_token=eos
                )
                cases.append(
                    {
                        "template": name,
                        "conversation": i,
                        "messages": messages,
                        "add_generation_prompt": agp,
                        "bos_token": bos,
                        "eos_token": eos,
                        "now": NOW,
                        "expected": text,
                    }
                )
    out = ROOT / "goldens.json"
    out.write_text(json.dumps({"jinja2": jinja2.__version__, "cases": cases}, ensure_ascii=False, indent=1) + "\n")
    print(f"wrote {len(cases)} renderings to {out}")


if __name__ == "__main__":
    main()
