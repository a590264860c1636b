#!/usr/bin/env python3
"""Regenerates the test fixtures from seeds (see README.md).

  make_fixtures.py [--only NAME ...] [--root REPO_ROOT] [--threads N]

For every config in configs.FIXTURES:
  tests/fixtures/models/<name>/            checkpoint (make_checkpoint.py)
  tests/fixtures/logits/<name>/tokens.json random token ids in [0, vocab) from the token seed
  tests/fixtures/logits/<name>/plain.f32   transformers float32 logits [n_tokens, vocab] (reference.py)
  tests/fixtures/logits/<name>/deepseek.f32 port.py logits with the official numerics
  tests/fixtures/logits/<name>/summary.json sizes, near-tie fractions, port-vs-transformers max|d|
  tests/fixtures/logits/<name>/mtp_{deepseek,plain}.f32  port.py's MTP logits over the first
                                           MTP_TOKENS tokens ([MTP_TOKENS - 1, vocab]; transformers
                                           has no MTP block), for the configs in MTP_FIXTURES
  --mtp-only writes just those (the checkpoints and other references stay as they are).
  tests/fixtures/logits/tiny-flash/dump/   deepseek-mode intermediates of the first 16 tokens
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_checkpoint  # noqa: E402
import port as P  # noqa: E402
import reference  # noqa: E402
from configs import CONFIGS, FIXTURES  # noqa: E402

DUMP_TOKENS = {}  # committed fixtures carry no dumps: port.py --dump makes them on demand
MTP_FIXTURES = ("tiny-flash",)
MTP_TOKENS = 300  # past two turns of the MTP block's 128-row window


def tie_fractions(logits: np.ndarray) -> dict:
    t = np.sort(logits, axis=1)
    gap = t[:, -1] - t[:, -2]
    return {"lt_0.05": float((gap < 0.05).mean()), "lt_0.01": float((gap < 0.01).mean()),
            "min_gap": float(gap.min())}


def write_f32(path, t: torch.Tensor):
    t.detach().to(torch.float32).contiguous().numpy().astype("<f4").tofile(path)


def make_mtp(name: str, root: str, tokens):
    mdir = os.path.join(root, "tests", "fixtures", "models", name)
    ldir = os.path.join(root, "tests", "fixtures", "logits", name)
    for mode in ("deepseek", "plain"):
        print(f"[{name}] port MTP {mode} ({MTP_TOKENS} tokens)", flush=True)
        _, mtp = P.Port(mdir, mode).forward(tokens[:MTP_TOKENS], mtp=True)
        write_f32(os.path.join(ldir, f"mtp_{mode}.f32"), mtp)


def make(name: str, root: str):
    spec = FIXTURES[name]
    cfg = CONFIGS[name]
    mdir = os.path.join(root, "tests", "fixtures", "models", name)
    ldir = os.path.join(root, "tests", "fixtures", "logits", name)
    os.makedirs(ldir, exist_ok=True)
    print(f"[{name}] checkpoint -> {mdir}", flush=True)
    tensors = make_checkpoint.build_tensors(cfg, spec["seed"])
    make_checkpoint.calibrate(cfg, tensors, spec["seed"])
    make_checkpoint.write_checkpoint(cfg, tensors, mdir, spec["shards"])
    ck_stats = make_checkpoint.verify_checkpoint(mdir)

    g = torch.Generator().manual_seed(spec["token_seed"])
    tokens = torch.randint(0, cfg["vocab_size"], (spec["n_tokens"],), generator=g).tolist()
    with open(os.path.join(ldir, "tokens.json"), "w") as f:
        json.dump({"tokens": tokens}, f)
        f.write("\n")

    print(f"[{name}] transformers float32 ({len(tokens)} tokens)", flush=True)
    hf = reference.run(mdir, tokens)
    write_f32(os.path.join(ldir, "plain.f32"), hf)

    print(f"[{name}] port plain", flush=True)
    pp = P.Port(mdir, "plain")
    plain = pp.forward(tokens)
    print(f"[{name}] port deepseek", flush=True)
    ndump = DUMP_TOKENS.get(name)
    dump = P.Dump(ndump) if ndump else None
    pd = P.Port(mdir, "deepseek")
    ds = pd.forward(tokens, dump)
    write_f32(os.path.join(ldir, "deepseek.f32"), ds)
    if dump is not None:
        ddir = os.path.join(ldir, "dump")
        if os.path.isdir(ddir):
            for fn in os.listdir(ddir):
                os.remove(os.path.join(ddir, fn))
        dump.write(ddir)

    d = (plain.double() - hf.double()).abs()
    dd = (ds.double() - hf.double()).abs()
    summary = {
        "config": name,
        "n_tokens": len(tokens),
        "vocab": cfg["vocab_size"],
        "checkpoint_seed": spec["seed"],
        "token_seed": spec["token_seed"],
        "shards": spec["shards"],
        "checkpoint": ck_stats,
        "port_plain_vs_transformers": {
            "max_abs_diff": float(d.max()),
            "mean_abs_diff": float(d.mean()),
            "argmax_agreement": float((plain.argmax(-1) == hf.argmax(-1)).double().mean()),
        },
        "deepseek_vs_plain": {
            "max_abs_diff": float(dd.max()),
            "mean_abs_diff": float(dd.mean()),
            "argmax_agreement": float((ds.argmax(-1) == hf.argmax(-1)).double().mean()),
        },
        "logit_std_across_vocab": {"plain": float(hf.std(-1).mean()), "deepseek": float(ds.std(-1).mean())},
        "top2_gap_fraction": {"plain": tie_fractions(hf.numpy()), "deepseek": tie_fractions(ds.numpy())},
        "dump_tokens": ndump or 0,
    }
    with open(os.path.join(ldir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")
    print(json.dumps(summary, indent=2), flush=True)
    if name in MTP_FIXTURES:
        make_mtp(name, root, tokens)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", default=None, choices=sorted(FIXTURES))
    ap.add_argument("--root", default=os.path.abspath(os.path.join(HERE, "..", "..")))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mtp-only", action="store_true", help="write only the MTP references")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    for name in args.only or list(FIXTURES):
        if not args.mtp_only:
            make(name, args.root)
        elif name in MTP_FIXTURES:
            with open(os.path.join(args.root, "tests", "fixtures", "logits", name, "tokens.json")) as f:
                make_mtp(name, args.root, json.load(f)["tokens"])


if __name__ == "__main__":
    main()
