#!/usr/bin/env python3
"""Compares `dsv4 tokenize` with HF `tokenizers` on many strings, without committing expected ids.

  python3 tools/tokenizer/compare_with_hf.py --dsv4 build/dsv4 --sweep
      every code point U+0000..U+10FFFF (no surrogates) in several contexts: proves the engine's
      Unicode class table equals what HF's Oniguruma does, for all of Unicode
  python3 tools/tokenizer/compare_with_hf.py --dsv4 build/dsv4 --corpus strings.jsonl
      one JSON string per line (or [text, ...] rows such as encode_corpus.jsonl)
Exit status 1 on any difference; the first differences are printed.
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from hf_reference import load_hf, tokenizer_json_path  # noqa: E402

CONTEXTS = ["a{c}b", " {c}.", "{c}{c} x", "1{c}2", "{c} a", "\n{c}\n", "'{c}s", "。{c}", "  {c}", "{c}\u0301"]


def sweep_strings():
    chunk = 64
    for start in range(0, 0x110000, chunk):
        cps = [c for c in range(start, start + chunk) if not 0xD800 <= c <= 0xDFFF]
        for k, ctx in enumerate(CONTEXTS):
            if not cps:
                continue
            # Rotate contexts so each code point meets each neighbour kind somewhere.
            yield "".join(CONTEXTS[(k + i) % len(CONTEXTS)].format(c=chr(c)) for i, c in enumerate(cps))


def corpus_strings(path):
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                yield row[0] if isinstance(row, list) else row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsv4", default="build/dsv4")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--corpus")
    ap.add_argument("--plain", action="store_true", help="compare parse_special=false")
    args = ap.parse_args()
    strings = list(sweep_strings() if args.sweep else corpus_strings(args.corpus))
    hf, hf_plain, _ = load_hf()
    ref = hf_plain if args.plain else hf
    expected = [e.ids for e in ref.encode_batch(strings, add_special_tokens=False)]
    cmd = [args.dsv4, "tokenize", "--tokenizer", tokenizer_json_path(), "--jsonl"] + (["--plain"] if args.plain else [])
    stdin = "".join(json.dumps(s) + "\n" for s in strings)
    out = subprocess.run(cmd, input=stdin.encode(), capture_output=True, check=True).stdout.decode().splitlines()
    got = [json.loads(line) for line in out]
    assert len(got) == len(strings), (len(got), len(strings))
    bad = [i for i in range(len(strings)) if got[i] != expected[i]]
    for i in bad[:10]:
        print(f"DIFF {json.dumps(strings[i])}\n  dsv4 {got[i]}\n  hf   {expected[i]}")
    chars = sum(len(s) for s in strings)
    print(f"{len(strings)} strings ({chars} characters): {len(strings) - len(bad)} identical, {len(bad)} different")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
