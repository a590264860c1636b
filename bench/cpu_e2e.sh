#!/usr/bin/env bash
# CPU end-to-end benchmark: prefill and decode tokens/s of `dsv4 generate` (deepseek numerics)
# for the largest fixture (tiny-flash) and a ≈1B-parameter synthetic config (bench/configs/
# synthetic-1b.json: random weights in the official format, written by `dsv4 synth`).
# Appends one JSON line per case to bench/results/cpu_e2e.jsonl with command, commit and hardware.
#   bench/cpu_e2e.sh [prompt_tokens=4096] [decode_tokens=64]
set -euo pipefail
cd "$(dirname "$0")/.."
prompt=${1:-4096}
decode=${2:-64}
out=bench/results/cpu_e2e.jsonl
synthetic=${DSV4_BENCH_DIR:-/tmp/dsv4-bench}/synthetic-1b
mkdir -p bench/results
[ -f "$synthetic/config.json" ] || build/dsv4 synth --config bench/configs/synthetic-1b.json --seed 1 --shards 4 --out "$synthetic"
ids=$(python3 -c "import random; r=random.Random(0); print(','.join(str(r.randrange(256)) for _ in range($prompt)))")
commit=$(git rev-parse --short HEAD)
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)
for model in tests/fixtures/models/tiny-flash "$synthetic"; do
  cmd="build/dsv4 generate --model $model --prompt-ids <$prompt ids> --max-tokens $decode --quiet"
  log=$(build/dsv4 generate --model "$model" --prompt-ids "$ids" --max-tokens "$decode" --quiet 2>&1)
  prefill=$(echo "$log" | sed -n 's/^prefill: .*(\(.*\) tok\/s)/\1/p')
  dec=$(echo "$log" | sed -n 's/^decode: .*(\(.*\) tok\/s)/\1/p')
  echo "{\"model\": \"$(basename "$model")\", \"prompt_tokens\": $prompt, \"decode_tokens\": $decode, \"numerics\": \"deepseek\", \"prefill_tok_s\": $prefill, \"decode_tok_s\": $dec, \"threads\": $(nproc), \"cpu\": \"$cpu\", \"commit\": \"$commit\", \"date\": \"$(date -u +%F)\", \"command\": \"$cmd\"}" | tee -a "$out"
done
