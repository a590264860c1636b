#!/usr/bin/env python3
"""Compares two folders of named intermediates (manifest.json + <name>.f32, as written by
`dsv4 logits --dump` and tools/oracle/port.py --dump) in forward order and reports max|Δ| per
tensor, marking the first one over the threshold: where two implementations start to drift.

  tools/dump_diff.py A B [--threshold 1e-3]
"""
import argparse
import json
import os
import re

import numpy as np


def order_key(name):
    m = re.match(r"l(\d+)\.(.*)", name)
    steps = ["hc_attn.u", "hc_attn.post", "hc_attn.comb", "attn.x", "attn.qr", "attn.q", "attn.kv", "attn.o", "attn.out", "hc_attn.X",
             "ffn.x", "ffn.out", "hc_ffn.X"]
    if m:
        step = m.group(2)
        return (int(m.group(1)), steps.index(step) if step in steps else 99, name)
    return (10**6, 0 if name == "final.y" else 1, name)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--threshold", type=float, default=1e-3)
    args = ap.parse_args()
    ma = json.load(open(os.path.join(args.a, "manifest.json")))
    mb = json.load(open(os.path.join(args.b, "manifest.json")))
    flagged = False
    for name in sorted(set(ma) & set(mb), key=order_key):
        a = np.fromfile(os.path.join(args.a, name + ".f32"), dtype=np.float32)
        b = np.fromfile(os.path.join(args.b, name + ".f32"), dtype=np.float32)
        rows = min(ma[name][0], mb[name][0])
        a = a.reshape(ma[name])[:rows]
        b = b.reshape(mb[name])[:rows]
        d = np.abs(a.astype(np.float64) - b)
        worst = np.unravel_index(np.argmax(d), d.shape)
        mark = ""
        if d.max() > args.threshold and not flagged:
            mark, flagged = "   <-- first over threshold", True
        print(f"{name:<16} max|d| {d.max():.3e} at {tuple(int(i) for i in worst)} "
              f"(a {a[worst]:.6g}, b {b[worst]:.6g}){mark}")
    only = sorted(set(ma) ^ set(mb))
    if only:
        print("only in one folder:", ", ".join(only))


if __name__ == "__main__":
    main()
