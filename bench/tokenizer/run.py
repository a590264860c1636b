#!/usr/bin/env python3
"""Tokenizer encode throughput, dsv4 vs HF `tokenizers`, single thread, same corpus, same run.

  python3 bench/tokenizer/run.py [--corpus tests/tokenizer/data/encode_corpus.jsonl] [--out bench/results/...]

Builds bench_tokenizer on its own (build-bench-tokenizer/, Release) unless --binary is given,
times HF with encode_batch under TOKENIZERS_PARALLELISM=false / RAYON_NUM_THREADS=1 (its fastest
single-thread path: no per-call Python overhead) and with a Python loop of encode(), and prints
and records the ratio dsv4 / HF (MB/s over MB/s; > 1 means dsv4 is faster).
"""
import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time

os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["RAYON_NUM_THREADS"] = "1"
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
sys.path.insert(0, os.path.join(ROOT, "tools/tokenizer"))
from hf_reference import load_hf, tokenizer_json_path  # noqa: E402


def median(xs):
    return sorted(xs)[len(xs) // 2]


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", default=os.path.join(ROOT, "tests/tokenizer/data/encode_corpus.jsonl"))
    ap.add_argument("--binary")
    ap.add_argument("--repetitions", type=int, default=7)
    ap.add_argument("--out")
    args = ap.parse_args()

    binary = args.binary
    if not binary:
        build = os.path.join(ROOT, "build-bench-tokenizer")
        subprocess.run(["cmake", "-S", os.path.join(ROOT, "bench/tokenizer"), "-B", build, "-DCMAKE_BUILD_TYPE=Release"],
                       check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["cmake", "--build", build, "-j2"], check=True, stdout=subprocess.DEVNULL)
        binary = os.path.join(build, "bench_tokenizer")

    texts = []
    for line in open(args.corpus, encoding="utf-8"):
        if line.strip():
            row = json.loads(line)
            texts.append(row[0] if isinstance(row, list) else row)
    nbytes = sum(len(t.encode()) for t in texts)

    hf, _, _ = load_hf()
    hf.encode_batch(texts, add_special_tokens=False)  # warm-up
    batch, loop = [], []
    for _ in range(args.repetitions):
        t0 = time.perf_counter()
        hf.encode_batch(texts, add_special_tokens=False)
        batch.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for t in texts:
            hf.encode(t, add_special_tokens=False)
        loop.append(time.perf_counter() - t0)

    out = subprocess.run([binary, tokenizer_json_path(), args.corpus, str(args.repetitions)], check=True,
                         capture_output=True, text=True).stdout
    ours = json.loads(out)
    hf_batch_mbs = nbytes / median(batch) / 1e6
    hf_loop_mbs = nbytes / median(loop) / 1e6
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    import tokenizers  # noqa: PLC0415

    result = {
        "date": datetime.date.today().isoformat(),
        "command": "python3 bench/tokenizer/run.py " + " ".join(sys.argv[1:]),
        "commit": commit,
        "hardware": f"{cpu_name()}, {os.cpu_count()} cores; single thread for both",
        "corpus": os.path.relpath(args.corpus, ROOT), "strings": len(texts), "bytes": nbytes, "tokens": ours["tokens"],
        "dsv4_mb_per_s": ours["mb_per_s"], "dsv4_median_s": ours["median_s"],
        "hf_tokenizers_version": tokenizers.__version__,
        "hf_encode_batch_mb_per_s": round(hf_batch_mbs, 2), "hf_encode_batch_median_s": round(median(batch), 4),
        "hf_encode_loop_mb_per_s": round(hf_loop_mbs, 2),
        "ratio_vs_hf_encode_batch": round(ours["mb_per_s"] / hf_batch_mbs, 2),
        "ratio_vs_hf_encode_loop": round(ours["mb_per_s"] / hf_loop_mbs, 2),
    }
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
