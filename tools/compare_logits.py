#!/usr/bin/env python3
"""Compares two raw float32 logits files ([n_tokens, vocab], as `dsv4 logits` writes them and the
fixtures' deepseek.f32 / plain.f32 hold) the way issue 4 judges a GPU against the CPU: max|Δlogit|,
argmax agreement, and the relative error over all logits.

  tools/compare_logits.py REFERENCE CANDIDATE --vocab V [--label TEXT]
"""
import argparse

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("reference")
    ap.add_argument("candidate")
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    ref = np.fromfile(a.reference, dtype="<f4")
    got = np.fromfile(a.candidate, dtype="<f4")
    if ref.size != got.size or ref.size % a.vocab:
        raise SystemExit(f"sizes differ or are not whole rows of {a.vocab}: {ref.size} and {got.size} values")
    ref, got = ref.reshape(-1, a.vocab), got.reshape(-1, a.vocab)
    if not np.isfinite(got).all():
        raise SystemExit(f"{a.candidate}: {np.count_nonzero(~np.isfinite(got))} logits are not finite")
    d = np.abs(got.astype(np.float64) - ref)
    agree = float(np.mean(np.argmax(got, axis=1) == np.argmax(ref, axis=1)))
    rel = float(np.linalg.norm(d) / np.linalg.norm(ref))
    print(f"{a.label or a.candidate}: tokens {ref.shape[0]}, max|d| {d.max():.4g}, mean|d| {d.mean():.4g}, "
          f"rel {rel:.3g}, argmax agreement {100 * agree:.2f}%, bit-identical rows "
          f"{int(np.sum(np.all(got == ref, axis=1)))}")


if __name__ == "__main__":
    main()
