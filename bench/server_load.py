#!/usr/bin/env python3
"""Load test of `dsv4 serve` (a benchmark, not a test): N concurrent streaming clients, then a
disconnect storm.

  phase 1  N clients, each sending R streaming chat requests back to back (the openai package,
           asyncio): throughput (generated tokens / wall time), TTFT and TPOT p50/p99, errors.
  phase 2  64 clients start long streams and hang up after a few chunks, twice; then /metrics
           must show no running or queued sequence and no sequence state, and the resident memory
           (less the prefix cache's snapshots, kept by design) must not have grown from the first
           storm to the second (the first is when that many HTTP threads first ran at once; their
           stacks stay resident). The baseline before phase 1 is reported too.

Either point it at a running server (--base-url, --model) or let it start one (--dsv4 PATH
--serve-args "..."). Appends one JSON line (command, commit, hardware, results) to --out.

  bench/server_load.py --dsv4 build/dsv4 --serve-args "--model build/models/tiny-chat --max-seqs 8" \
      --clients 8 --requests 4 --max-tokens 32 --out bench/results/server_load_cpu.jsonl
"""
import argparse
import asyncio
import datetime
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
import urllib.request

import openai


def percentile(values, p):
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def metrics(base):
    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
        text = r.read().decode()
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(dsv4_[a-z_]+) (\S+)$", text, re.M)}


def hardware():
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gpu = ""
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10).stdout.strip().replace("\n", ", ")
    except (OSError, subprocess.SubprocessError):
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "gpu": gpu}


def commit():
    # DSV4_COMMIT first: a copy of the tree on another machine may carry stale git metadata.
    if os.environ.get("DSV4_COMMIT"):
        return os.environ["DSV4_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


async def one_request(client, model, prompt, max_tokens, stats):
    start = time.perf_counter()
    first = last = None
    n_chunks_with_text = 0
    usage = None
    try:
        stream = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens, stream=True,
            temperature=1.0, stream_options={"include_usage": True})
        async for chunk in stream:
            if chunk.usage:
                usage = chunk.usage
            for c in chunk.choices:
                if c.delta.content or getattr(c.delta, "reasoning_content", None):
                    now = time.perf_counter()
                    first = first or now
                    last = now
                    n_chunks_with_text += 1
    except Exception as e:  # counted, reported, never fatal to the run
        stats["errors"].append(repr(e)[:200])
        return
    if first is None or usage is None:
        stats["errors"].append("no tokens or no usage")
        return
    stats["ttft"].append(first - start)
    n = usage.completion_tokens
    stats["tokens"] += n
    if n > 1:
        stats["tpot"].append((last - first) / (n - 1))


async def load(base, model, key, clients, requests, max_tokens, prompt_words):
    client = openai.AsyncOpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=600)
    stats = {"ttft": [], "tpot": [], "tokens": 0, "errors": []}

    async def worker(i):
        for r in range(requests):
            prompt = f"Client {i} request {r}: " + " ".join(f"word{(i * 31 + r * 7 + k) % 997}" for k in range(prompt_words))
            await one_request(client, model, prompt, max_tokens, stats)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(clients)))
    wall = time.perf_counter() - t0
    await client.close()
    return stats, wall


async def disconnect_storm(base, model, key, n_clients):
    client = openai.AsyncOpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=600)

    async def hang_up(i):
        stream = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": f"Tell me a long story, {i}."}], max_tokens=4000,
            stream=True)
        n = 0
        async for _ in stream:
            n += 1
            if n >= 1 + i % 3:
                break
        await stream.close()

    results = await asyncio.gather(*(hang_up(i) for i in range(n_clients)), return_exceptions=True)
    await client.close()
    return [repr(r)[:200] for r in results if isinstance(r, BaseException)]


def wait_idle(base, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        m = metrics(base)
        if m["dsv4_running_sequences"] == 0 and m["dsv4_queued_requests"] == 0:
            time.sleep(0.5)  # the engine thread returns freed memory to the system as it goes idle
            return metrics(base), True
        time.sleep(0.2)
    return metrics(base), False


def start_server(dsv4, serve_args):
    proc = subprocess.Popen([dsv4, "serve", "--port", "0", *shlex.split(serve_args)], stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        sys.stderr.write(line)
        m = re.search(r"listening on (http://[\d.]+:\d+)", line)
        if m:
            return proc, m.group(1)
    raise RuntimeError("dsv4 serve did not start")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", help="model id (default: the first of /v1/models)")
    ap.add_argument("--api-key", default="none")
    ap.add_argument("--dsv4", help="start this dsv4 binary's server instead of using --base-url")
    ap.add_argument("--serve-args", default="", help="arguments for `dsv4 serve` (with --dsv4)")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=4, help="requests per client, back to back")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--prompt-words", type=int, default=40)
    ap.add_argument("--disconnect-clients", type=int, default=64)
    ap.add_argument("--out", help="append the result as one JSON line")
    a = ap.parse_args()

    proc = None
    base = a.base_url.rstrip("/")
    if a.dsv4:
        proc, base = start_server(a.dsv4, a.serve_args)
    try:
        model = a.model or openai.OpenAI(base_url=base + "/v1", api_key=a.api_key).models.list().data[0].id
        # Warm-up, then the memory baseline.
        asyncio.run(load(base, model, a.api_key, 1, 1, 4, 8))
        baseline = metrics(base)

        stats, wall = asyncio.run(load(base, model, a.api_key, a.clients, a.requests, a.max_tokens, a.prompt_words))
        storm_errors = asyncio.run(disconnect_storm(base, model, a.api_key, a.disconnect_clients))
        after_first, idle_first = wait_idle(base, 120)
        # Again: the first storm is the first time that many HTTP threads ran at once (their stacks
        # stay resident); a leak would show as growth from one storm to the next.
        storm_errors += asyncio.run(disconnect_storm(base, model, a.api_key, a.disconnect_clients))
        after, idle = wait_idle(base, 120)
        idle = idle and idle_first
        ms = lambda v: None if v is None else round(v * 1000, 2)
        result = {
            "bench": "server_load",
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "commit": commit(),
            "hardware": hardware(),
            "command": " ".join(shlex.quote(x) for x in sys.argv),
            "model": model,
            "clients": a.clients, "requests_per_client": a.requests, "max_tokens": a.max_tokens,
            "requests": len(stats["ttft"]) + len(stats["errors"]),
            "errors": len(stats["errors"]), "error_samples": stats["errors"][:3],
            "wall_s": round(wall, 3),
            "generated_tokens": stats["tokens"],
            "throughput_tok_s": round(stats["tokens"] / wall, 2),
            "ttft_ms_p50": ms(percentile(stats["ttft"], 50)), "ttft_ms_p99": ms(percentile(stats["ttft"], 99)),
            "tpot_ms_p50": ms(percentile(stats["tpot"], 50)), "tpot_ms_p99": ms(percentile(stats["tpot"], 99)),
            "disconnect": {
                "clients": a.disconnect_clients,
                "client_errors": len(storm_errors), "client_error_samples": storm_errors[:3],
                "idle_after": idle,
                "running_after": after["dsv4_running_sequences"],
                "queued_after": after["dsv4_queued_requests"],
                "state_bytes_after": after["dsv4_sequence_state_bytes"],
                "prefix_cache_bytes_after": after["dsv4_prefix_cache_bytes"],
                "resident_bytes_baseline": baseline["dsv4_process_resident_bytes"],
                "resident_bytes_after": after["dsv4_process_resident_bytes"],
            },
        }
        d = result["disconnect"]
        # The prefix cache keeps snapshots by design (bounded by --prefix-cache-mb): compare what
        # is resident beyond it. Back to baseline: the second storm left no more than the first.
        without_cache = lambda m: m["dsv4_process_resident_bytes"] - m["dsv4_prefix_cache_bytes"]
        d["resident_minus_prefix_cache"] = {"baseline": without_cache(baseline),
                                            "after_first_storm": without_cache(after_first),
                                            "after_second_storm": without_cache(after)}
        # 10%: the second storm may run on pool threads the first left untouched (new stacks).
        d["memory_back_to_baseline"] = without_cache(after) <= 1.10 * without_cache(after_first)
        result["ok"] = (result["errors"] == 0 and idle and d["state_bytes_after"] == 0 and d["running_after"] == 0
                        and d["memory_back_to_baseline"])
        print(json.dumps(result, indent=2))
        if a.out:
            with open(a.out, "a") as f:
                f.write(json.dumps(result) + "\n")
        return 0 if result["ok"] else 1
    finally:
        if proc:
            proc.terminate()
            proc.wait(timeout=120)


if __name__ == "__main__":
    sys.exit(main())
