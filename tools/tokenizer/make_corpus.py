#!/usr/bin/env python3
"""Builds the tokenizer agreement corpus and its expected ids from HF `tokenizers`.

Writes, under tests/tokenizer/data/ (committed; the C++ tests compare against them):
  encode_corpus.jsonl   one [text, ids] per line, plus a third element with the ids for
                        parse_special=false when they differ (text holding control-token strings)
  invalid_utf8.jsonl    [hex bytes, ids of bytes.decode("utf-8", "replace")]
  decode_cases.jsonl    [ids, decode(ids), decode(ids, skip_special_tokens=True)]

The corpus is deterministic (seeded) and covers every script block, code, emoji sequences, digit
runs, all whitespace kinds, control characters, literal special-token strings, class-boundary
code points of the Unicode table, and random mixtures. Usage:
  python3 tools/tokenizer/make_corpus.py [--out tests/tokenizer/data] [--count 21000]
"""
import argparse
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(__file__))
from hf_reference import load_hf  # noqa: E402

import unicodedata2 as ud  # noqa: E402  (Unicode 16, same as the engine's table)

SEED = 20260501

PHRASES = [
    "Hello, world!", "The quick brown fox jumps over the lazy dog.", "Bonjour, ça va ? Très bien.",
    "Grüße aus München — Straße, Äpfel, Öl.", "¿Dónde está la biblioteca? ¡Aquí!", "Olá, coração! Ação.",
    "Привет, как дела? Всё хорошо.", "Γειά σου Κόσμε· τι κάνεις;", "Բարեւ աշխարհ", "שלום עולם! מה שלומך?",
    "مرحبا بالعالم، كيف حالك؟", "سلام دنیا", "ہیلو دنیا", "ܫܠܡܐ ܥܠܡܐ", "ހެލޯ", "नमस्ते दुनिया। आप कैसे हैं?",
    "নমস্কার বিশ্ব", "ਸਤ ਸ੍ਰੀ ਅਕਾਲ", "નમસ્તે", "ନମସ୍କାର", "வணக்கம் உலகம்", "నమస్కారం", "ನಮಸ್ಕಾರ",
    "നമസ്കാരം ലോകം", "ආයුබෝවන්", "สวัสดีชาวโลก ครับ", "ສະບາຍດີ", "བཀྲ་ཤིས་བདེ་ལེགས།", "မင်္ဂလာပါ",
    "გამარჯობა მსოფლიო", "ሰላም ዓለም።", "ᏣᎳᎩ ᎦᏬᏂᎯᏍᏗ", "ᐊᐃᓐᖓᐃ", "ᠰᠠᠢᠨ ᠪᠠᠶᠢᠨ᠎ᠠ ᠤᠤ", "សួស្តី​ពិភពលោក",
    "你好，世界！今天天气很好。", "我们在2024年10月17日见面。", "こんにちは、世界！カタカナとひらがな。",
    "東京スカイツリー・ラーメン", "안녕하세요, 세계! 반갑습니다.", "ꆏꀨꉬꂿ", "Xin chào thế giới! Tiếng Việt có dấu.",
    "Merhaba dünya, nasılsın?", "Witaj świecie! Zażółć gęślą jaźń.", "Ahoj světe! Příliš žluťoučký kůň.",
    "Helló világ! Árvíztűrő tükörfúrógép.", "Hei maailma! Hyvää päivää.", "Sveika pasaule! Ąčęėįšųūž.",
    "Përshëndetje botë", "Salamu, dunia!", "Sawubona mhlaba", "Habari dunia", "Kamusta mundo",
    "Tere maailm! Õun, äär, öö, üks.", "Здраво свете", "Прывітанне свет", "Сәлем әлем", "Салом ҷаҳон",
    "𐌷𐌰𐌹𐌻𐍃", "ᚠᚢᚦᚨᚱᚲ", "𓀀𓀁𓀂 hieroglyphs", "𒀀𒀁 cuneiform", "ꦲꦤꦕꦫꦏ", "ᬳᬦᬘᬭᬓ", "ⴰⵣⵓⵍ ⴼⵍⵍⴰⵡⵏ",
    "ߊ߲ ߓߊ߯ ߟߊ߫", "ࠀࠁࠂ", "ꕉꕜꕮ ꔔꘋ", "𞤀𞤣𞤤𞤢𞤥", "ᜋᜄᜈ᜔ᜇ", "ᨅᨔ ᨕᨘᨁᨗ",
]

CODE = [
    "def f(x):\n    return x * 2  # double\n", "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}\n",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); }\n",
    "const add = (a, b) => a + b;\nconsole.log(`sum: ${add(1, 2)}`);\n",
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}\n",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;", "<div class=\"x\"><p>Hi &amp; bye</p></div>",
    "if [ -f ~/.bashrc ]; then source ~/.bashrc; fi\r\n", "{\"key\": [1, 2.5, -3e10, true, null], \"s\": \"\\u00e9\"}",
    "x+=1;y-=2;z*=3;w/=4;a%=5;b**=2;c//=3;d<<=1;e>>=1;f&=g|h^~i", "    if err != nil {\n        return err\n    }\n",
    "import numpy as np\narr = np.zeros((3, 4), dtype=np.float32)\n", "@decorator\nclass Foo(Bar):\n    pass\n",
    "// comment\n/* block\n * comment */\n", "a = b if c else d  # ternary\nlambda x: x ** 2\n",
    "https://example.com/path/to/file.html?query=1&x=y#frag", "user.name+tag@example.co.uk", "C:\\Users\\me\\file.txt",
    "/usr/local/bin/python3.11", "git commit -m 'fix: handle \\r\\n'", "```python\nprint('hi')\n```\n", "- [ ] todo\n- [x] done\n",
    "| a | b |\n|---|---|\n| 1 | 2 |\n", "$$\\int_0^1 x^2 \\, dx = \\frac{1}{3}$$", "<?xml version=\"1.0\"?>\n<root/>",
]

WHITESPACE = ["\t", "\n", "\x0b", "\x0c", "\r", " ", "\x85", "\xa0", "\u1680", "\u2000", "\u2001", "\u2002",
              "\u2003", "\u2004", "\u2005", "\u2006", "\u2007", "\u2008", "\u2009", "\u200a", "\u2028",
              "\u2029", "\u202f", "\u205f", "\u3000", "\r\n", "\u200b", "\ufeff", "\u180e", "\u2060"]

EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🇯🇵", "🇺🇸🇫🇷", "🏳️‍🌈", "❤️", "1️⃣", "#️⃣", "🏴󠁧󠁢󠁥󠁮󠁧󠁿", "👩🏻‍💻", "🧑‍🤝‍🧑",
         "✌🏿", "🫠", "🪿", "🩷", "☺︎", "👁‍🗨", "🐕‍🦺", "😶‍🌫️", "🤌", "🥲", "💯", "🔥🔥🔥", "©️", "®", "™"]

DIGITS = ["0123456789", "٠١٢٣٤٥٦٧٨٩", "۰۱۲۳۴۵۶۷۸۹", "०१२३४५६७८९", "০১২৩৪৫৬৭৮৯", "０１２３４５６７８９",
          "¹²³⁴⁵", "₀₁₂₃", "½⅓¼⅔¾⅞", "ⅠⅡⅢⅣⅤⅫⅯ", "𝟎𝟏𝟐𝟑𝟒𝟓", "①②③⑳", "〇", "๐๑๒๓", "༠༡༢", "𐄇𐄈"]

CONTROL = [chr(c) for c in list(range(0, 32)) + [0x7F] + list(range(0x80, 0xA0))] + \
    ["\u200c", "\u200d", "\u200e", "\u200f", "\u202a", "\u202e", "\u2066", "\u2069", "\u00ad", "\ue000",
     "\U000f0000", "\ufffe", "\uffff", "\U0010ffff", "\U000e0001", "\ufff9", "\U0001d173"]

ASCII_PUNCT = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"


def script_blocks():
    """(first, last) code point of each assigned stretch, for sampling every script."""
    blocks, start, prev = [], None, None
    for cp in range(0x20, 0x32400):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        assigned = ud.category(chr(cp)) not in ("Cn", "Cs", "Co")
        if assigned and start is None:
            start = cp
        if not assigned and start is not None:
            blocks.append((start, prev))
            start = None
        prev = cp
    if start is not None:
        blocks.append((start, prev))
    return blocks


def class_of(cp):
    if 0x09 <= cp <= 0x0D or cp == 0x85:
        return "Z"
    return ud.category(chr(cp))[0]


def class_boundary_code_points():
    """First and last code point of every run of equal class: where a table error would show."""
    out, prev_cls, prev_cp = [], None, None
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        c = class_of(cp)
        if c != prev_cls:
            if prev_cp is not None:
                out.append(prev_cp)
            out.append(cp)
            prev_cls = c
        prev_cp = cp
    return sorted(set(out))


class Corpus:
    def __init__(self, rng, added_tokens):
        self.rng = rng
        self.added = added_tokens
        self.blocks = script_blocks()
        self.items = []

    def add(self, s):
        if s:
            self.items.append(s)

    def rand_char_from_blocks(self):
        a, b = self.rng.choice(self.blocks)
        return chr(self.rng.randint(a, b))

    def random_word(self):
        a, b = self.rng.choice(self.blocks)
        return "".join(chr(self.rng.randint(a, b)) for _ in range(self.rng.randint(1, 8)))

    def mixture(self, n):
        """Random concatenation of small items from every category: class transitions galore."""
        r = self.rng
        parts = []
        for _ in range(n):
            k = r.randrange(12)
            if k == 0:
                parts.append(r.choice(WHITESPACE) * r.randint(1, 4))
            elif k == 1:
                parts.append("".join(r.choice("0123456789") for _ in range(r.randint(1, 12))))
            elif k == 2:
                parts.append(r.choice(ASCII_PUNCT) * r.randint(1, 3))
            elif k == 3:
                parts.append(r.choice(EMOJI))
            elif k == 4:
                parts.append(r.choice(CONTROL))
            elif k == 5:
                parts.append(r.choice(DIGITS)[: r.randint(1, 6)])
            elif k == 6:
                parts.append(r.choice(self.added))
            elif k == 7:
                parts.append(self.random_word())
            elif k == 8:
                parts.append(r.choice(PHRASES).split(" ")[0])
            elif k == 9:
                parts.append("".join(r.choice("abcXYZ'_") for _ in range(r.randint(1, 6))))
            elif k == 10:
                parts.append(chr(r.randint(0x20, 0x2FFFF)) if r.random() < 0.5 else self.rand_char_from_blocks())
            else:
                parts.append(r.choice(["\n", "\n\n", "\r\n", " \n", ".\n\n", "):\n", "  ", "\t\t"]))
        return "".join(p for p in parts if not (0xD800 <= ord(p[0]) <= 0xDFFF))

    def build(self, count):
        r = self.rng
        for s in PHRASES + CODE + EMOJI + DIGITS + WHITESPACE + CONTROL:
            self.add(s)
        for t in self.added:  # every control token alone, in context, and cut short
            self.add(t)
            self.add(f"a{t}b")
            self.add(t[:-1])
        for s in [" ", "  ", "   leading and trailing   ", "a\u0301", "e\u0301\u0302x", "x \x85\x85 y", "1 + 1 = 2",
                  "1234567890", "12345678901234567890", "<think>", "</think>", "<｜DSML｜tool_calls>",
                  "<|EOT|>", "<｜User｜" "｜>", "<<think>>", "<think></think>", "<dsml:x></dsml:x>",
                  "｜DSML｜｜DSML｜", "<｜end▁of▁sentence｜><｜end▁of▁sentence｜>", "\n\n\n", " \n \n ", "\r\r\n\n"]:
            self.add(s)
        boundaries = class_boundary_code_points()
        contexts = ["a{}b", " {}.", "{}{}", "1{}", "{} a", "\n{}", "{}\n", "'{}s", "。{}"]
        for i in range(0, len(boundaries), 6):
            chunk = [chr(c) for c in boundaries[i:i + 6] if not (0xD800 <= c <= 0xDFFF)]
            self.add("".join(r.choice(contexts).format(c, c) for c in chunk))
        for a, b in self.blocks:  # a few characters of every assigned stretch, as words
            cps = [chr(r.randint(a, b)) for _ in range(r.randint(2, 10))]
            self.add(" ".join("".join(cps[i:i + 3]) for i in range(0, len(cps), 3)))
        while len(self.items) < count:
            k = r.randrange(10)
            if k < 4:
                self.add(self.mixture(r.randint(1, 14)))
            elif k == 4:
                self.add(" ".join(r.sample(PHRASES, r.randint(1, 3))))
            elif k == 5:
                code = r.choice(CODE)
                if r.random() < 0.3:
                    code = code.replace("\n", "\r\n")
                if r.random() < 0.3:
                    code = code.replace("    ", "\t")
                self.add(code)
            elif k == 6:
                self.add(" ".join(r.choice(EMOJI) for _ in range(r.randint(1, 5))))
            elif k == 7:
                sep = r.choice(["", " ", ",", ".", "\n", "\u00a0", "'"])
                self.add(sep.join(r.choice(DIGITS)[: r.randint(1, 10)] for _ in range(r.randint(1, 5))))
            elif k == 8:
                self.add("".join(r.choice(WHITESPACE) for _ in range(r.randint(1, 8))) + r.choice(["", "x", ".", "1"]))
            else:
                self.add(r.choice(PHRASES) + r.choice(self.added) + r.choice(PHRASES))
        # A few long strings exercise the heap path of BPE and long pieces.
        self.add("a" * 3000)
        self.add(" " * 2000 + "x")
        self.add("\n" * 500 + "y")
        self.add("9" * 1000)
        self.add("".join(r.choice(PHRASES) + "\n" for _ in range(60)))
        return self.items


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "../../tests/tokenizer/data"))
    ap.add_argument("--count", type=int, default=21000)
    args = ap.parse_args()
    hf, hf_plain, spec = load_hf()
    added = [t["content"] for t in spec["added_tokens"]]
    rng = random.Random(SEED)
    items = Corpus(rng, added).build(args.count)

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "encode_corpus.jsonl"), "w", encoding="utf-8") as f:
        for text in items:
            ids = hf.encode(text, add_special_tokens=False).ids
            plain = hf_plain.encode(text, add_special_tokens=False).ids
            row = [text, ids] + ([plain] if plain != ids else [])
            f.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n")

    with open(os.path.join(args.out, "invalid_utf8.jsonl"), "w", encoding="utf-8") as f:
        pieces = [b"\x80", b"\xbf", b"\xc0\x80", b"\xc1\xbf", b"\xc2", b"\xe0\x80\x80", b"\xe0\xa0", b"\xed\xa0\x80",
                  b"\xed\xbf\xbf", b"\xf0\x80\x80\x80", b"\xf0\x90\x80", b"\xf4\x90\x80\x80", b"\xf5\x80", b"\xff",
                  b"\xfe\xff", b"\xe2\x82", b"\xf0\x9f\x98", b"\xc3\x28", b"\xe2\x28\xa1", b"\xf8\x88\x80\x80\x80"]
        valid = [b"a", b" ", b"\n", "é".encode(), "中".encode(), "😀".encode(), b"1", b"<think>", b".", b"  "]
        for i in range(400):
            parts = [rng.choice(pieces) if rng.random() < 0.4 else rng.choice(valid) for _ in range(rng.randint(1, 8))]
            if i < len(pieces):
                parts = [pieces[i]]
            raw = b"".join(parts)
            text = raw.decode("utf-8", "replace")
            f.write(json.dumps([raw.hex(), hf.encode(text, add_special_tokens=False).ids]) + "\n")

    with open(os.path.join(args.out, "decode_cases.jsonl"), "w", encoding="utf-8") as f:
        vocab_size = hf.get_vocab_size(with_added_tokens=True)
        byte_ids = list(range(3, 259))
        for i in range(600):
            n = rng.randint(1, 12)
            ids = [rng.choice(byte_ids) if rng.random() < 0.5 else rng.randrange(vocab_size) for _ in range(n)]
            if i % 7 == 0:
                ids.insert(rng.randrange(len(ids) + 1), rng.choice([0, 1, 2, 128821, 128822, 128825, 128803]))
            row = [ids, hf.decode(ids, skip_special_tokens=False), hf.decode(ids, skip_special_tokens=True)]
            f.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n")
    total = sum(len(t) for t in items)
    print(f"{len(items)} strings, {total} characters; fixtures in {args.out}")


if __name__ == "__main__":
    main()
