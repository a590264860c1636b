#!/usr/bin/env python3
"""How far do the fixtures' deepseek logits move when a GEMM is not exact? (NOTES.md §5)

  perturb_tiles.py MODE FIXTURE N

Runs the torch port (tools/oracle/port.py) on the first N tokens of tests/fixtures/logits/FIXTURE
with one change to its canonical arithmetic and compares with the committed deepseek.f32:
  tc14   the K-tile partials of the FP8/FP4 linears keep 14 significant bits (truncated), as an
         FP8 tensor core's limited accumulator does;
  tile32 those partials are float32 matmuls instead of exact float64 sums;
  all32  every matrix product is a float32 matmul (torch's order).
Prints max|Δlogit|, mean|Δlogit| and the argmax agreement.
"""
import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import port  # noqa: E402


def truncated(t: torch.Tensor, bits: int) -> torch.Tensor:
    m, e = torch.frexp(t)
    return torch.ldexp(torch.trunc(m * 2.0**bits) / 2.0**bits, e)


def install(mode: str):
    canonical = port.mm
    variants = {
        "tc14": lambda a, b: truncated(a.double() @ b.double(), 14).float(),
        "tile32": lambda a, b: a.float() @ b.float(),
        "all32": lambda a, b: a.float() @ b.float(),
    }
    if mode == "all32":
        port.mm = variants[mode]
        return

    def tiles_only(linear):
        def run(self, x, name):
            port.mm = variants[mode]
            try:
                return linear(self, x, name)
            finally:
                port.mm = canonical
        return run

    port.Port.lin_fp8 = tiles_only(port.Port.lin_fp8)
    port.Port.lin_fp4 = tiles_only(port.Port.lin_fp4)


def main():
    mode, fixture, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    torch.set_num_threads(os.cpu_count() or 1)
    install(mode)
    logits_dir = os.path.join(ROOT, "tests", "fixtures", "logits", fixture)
    with open(os.path.join(logits_dir, "tokens.json")) as f:
        tokens = json.load(f)["tokens"][:n]
    out = port.Port(os.path.join(ROOT, "tests", "fixtures", "models", fixture), "deepseek").forward(tokens).numpy()
    ref = np.fromfile(os.path.join(logits_dir, "deepseek.f32"), dtype="<f4").reshape(-1, out.shape[1])[:n]
    diff = np.abs(out - ref)
    print(f"{mode} {fixture} {n} tokens: max|d| {diff.max():.4g}, mean|d| {diff.mean():.4g}, "
          f"argmax agreement {(out.argmax(1) == ref.argmax(1)).mean() * 100:.2f} %")


if __name__ == "__main__":
    main()
