#!/usr/bin/env python3
"""Writes the committed seed corpora of the fuzz targets under fuzz/corpus/{tokenizer,render,parser}.

Seeds come from the test fixtures, so the fuzzers start from realistic inputs: corpus strings
(with control tokens), chat fixture inputs and generated chat cases, and model outputs rendered
from those cases (well-formed DSML) plus a few malformed ones.
"""
import hashlib
import json
import os
import random

ROOT = os.path.join(os.path.dirname(__file__), "../..")
DATA = os.path.join(ROOT, "tests/tokenizer/data")


def write(folder, blobs):
    path = os.path.join(ROOT, "fuzz/corpus", folder)
    os.makedirs(path, exist_ok=True)
    for b in blobs:
        with open(os.path.join(path, hashlib.sha1(b).hexdigest()[:16]), "wb") as f:
            f.write(b)
    print(folder, len(blobs))


def main():
    rng = random.Random(3)
    rows = [json.loads(line) for line in open(os.path.join(DATA, "encode_corpus.jsonl"), encoding="utf-8")]
    picks = rng.sample(rows, 60) + [r for r in rows if "<｜" in r[0] or "<think>" in r[0]][:20]
    write("tokenizer", [r[0].encode() for r in picks] + [bytes.fromhex("e0a0c2e228a1310ae08080"), b"\xff\xfe<think>\x80"])

    render = []
    fixtures = os.path.join(DATA, "chat_fixtures")
    for i in range(1, 5):
        render.append(bytes([1 if i < 4 else 0]) + open(os.path.join(fixtures, f"test_input_{i}.json"), "rb").read())
    cases = [json.loads(line) for line in open(os.path.join(DATA, "chat_cases.jsonl"), encoding="utf-8")]
    for c in cases:
        flags = (1 if c["options"].get("thinking") else 0) | (4 if c["options"].get("variant") == "0731" else 0)
        body = {"messages": c["messages"], "tools": c["tools"]} if c["tools"] else c["messages"]
        render.append(bytes([flags]) + json.dumps(body, ensure_ascii=False).encode())
    write("render", render)

    parser = []
    for c in cases:  # the assistant part of each rendered prompt, as the model would write it
        text = c["text"]
        start = text.rfind("<｜Assistant｜>")
        if start >= 0:
            completion = text[start + len("<｜Assistant｜>"):]
            thinking = completion.startswith("<think>")
            completion = completion[len("<think>"):] if thinking else completion.removeprefix("</think>")
            parser.append(bytes([1 if thinking else 0, rng.randrange(256)]) + completion.encode())
    bad = ["\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" string=\"false\">{bad",
           "r<｜DSML｜tool_calls><｜DSML｜invoke name=\"x\">{\"a\": 1}</｜DSML｜invoke></｜DSML｜tool_calls>",
           "a</think>b<think>c<|DSML|invoke name=\"y\"><|DSML|parameter name=\"p\">1</|DSML|parameter>",
           "<DSML｜tool_calls>\n<DSML｜invoke name=\"z\">\n</DSML｜invoke>\n</DSML｜tool_calls><｜end▁of▁sentence｜>tail"]
    parser += [bytes([i & 1, 5]) + b.encode() for i, b in enumerate(bad)]
    write("parser", parser)


if __name__ == "__main__":
    main()
