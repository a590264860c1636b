#!/usr/bin/env python3
"""dsv4 against transformers eager on the same GPU and model: prefill and decode tokens/s.

  bench/side_by_side.py --model DIR [--prompt 512] [--decode 64] [--dtype bfloat16] [--device cuda]

transformers' DeepseekV4ForCausalLM is built from the checkpoint exactly as the oracle builds it
(tools/oracle/reference.py: eager attention and experts, the dequantized weights), then cast to
--dtype (bfloat16: its fast setting; float32: the setting our `plain` numerics match) and run with
its own cache: one prefill call over the prompt, then greedy decode steps. dsv4 runs
`dsv4 generate` with the same prompt ids on the same device (deepseek numerics, the default).
Both are timed after a warm-up; the GPU is synchronised around every timed region.
Appends one JSON line (command, commit, GPU) to bench/results/side_by_side.jsonl and prints the
ratios dsv4 / transformers.
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools", "oracle"))
import reference  # noqa: E402

torch.set_grad_enabled(False)


def transformers_speed(ckpt, ids, n_decode, dtype, device):
    _, model = reference.build_model(ckpt)
    model = model.to(device=device, dtype=getattr(torch, dtype))

    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    def run(prompt, steps):
        sync()
        t0 = time.perf_counter()
        out = model(input_ids=torch.tensor([prompt], device=device), use_cache=True)
        sync()
        t1 = time.perf_counter()
        cache, token = out.past_key_values, int(out.logits[0, -1].argmax())
        for _ in range(steps):
            out = model(input_ids=torch.tensor([[token]], device=device), past_key_values=cache, use_cache=True)
            cache, token = out.past_key_values, int(out.logits[0, -1].argmax())
        sync()
        t2 = time.perf_counter()
        return t1 - t0, t2 - t1

    run(ids[:16], 2)  # warm-up: kernels, allocator
    prefill_s, decode_s = run(ids, n_decode)
    return len(ids) / prefill_s, n_decode / decode_s


def dsv4_speed(dsv4, ckpt, ids, n_decode, device):
    cmd = [dsv4, "generate", "--model", ckpt, "--prompt-ids", ",".join(map(str, ids)), "--max-tokens",
           str(n_decode), "--device", device.split(":")[0], "--quiet"]
    log = subprocess.run(cmd, check=True, capture_output=True, text=True)
    text = log.stdout + log.stderr
    prefill = float(re.search(r"^prefill: .*\((.*) tok/s\)", text, re.M).group(1))
    decode = float(re.search(r"^decode: .*\((.*) tok/s\)", text, re.M).group(1))
    return prefill, decode


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="checkpoint folder (official format)")
    ap.add_argument("--prompt", type=int, default=512, help="prompt tokens")
    ap.add_argument("--decode", type=int, default=64, help="decoded tokens")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dsv4", default=os.path.join(ROOT, "build", "dsv4"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "side_by_side.jsonl"))
    args = ap.parse_args()

    with open(os.path.join(args.model, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    rng = random.Random(0)
    ids = [rng.randrange(vocab) for _ in range(args.prompt)]

    hf_prefill, hf_decode = transformers_speed(args.model, ids, args.decode, args.dtype, args.device)
    ds_prefill, ds_decode = dsv4_speed(args.dsv4, args.model, ids, args.decode, args.device)
    gpu = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    # DSV4_COMMIT first: a copy of the tree on another machine may carry stale git metadata.
    commit = os.environ.get("DSV4_COMMIT") or subprocess.run(
        ["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    row = {
        "model": os.path.basename(os.path.normpath(args.model)), "prompt_tokens": args.prompt,
        "decode_tokens": args.decode, "transformers_dtype": args.dtype, "dsv4_numerics": "deepseek",
        "transformers_prefill_tok_s": round(hf_prefill, 1), "transformers_decode_tok_s": round(hf_decode, 2),
        "dsv4_prefill_tok_s": ds_prefill, "dsv4_decode_tok_s": ds_decode,
        "prefill_ratio": round(ds_prefill / hf_prefill, 2), "decode_ratio": round(ds_decode / hf_decode, 2),
        "device": gpu, "commit": commit, "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "command": " ".join(sys.argv),
    }
    print(json.dumps(row))
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "a") as f:
        f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
