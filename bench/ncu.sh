#!/usr/bin/env bash
# Nsight Compute over `dsv4 bench`, for finding where a step's GPU time goes. Run on the GPU machine
# after tests/backend/cuda/device_run.sh has built build/dsv4 (and unpacked its packages).
#
#   bench/ncu.sh times REGEX [BENCH ARGS...]       the duration of every launch of a kernel whose
#                                                  name matches REGEX: the last LAST (24) launches,
#                                                  the total per kernel, and when REGEX matches
#                                                  embed_kernel (e.g. '.'), the total per kernel of
#                                                  the last forward pass (a decoded token: the
#                                                  launches from the last embed on)
#   bench/ncu.sh sass REGEX SKIP [BENCH ARGS...]   the same launch's warp stall samples per SASS
#                                                  instruction: the TOP (40) most sampled, with
#                                                  their reasons
#   bench/ncu.sh full REGEX SKIP [BENCH ARGS...]   ncu's full sections for one launch: the one after
#                                                  the first SKIP matching REGEX (matched against
#                                                  the demangled name, template arguments included,
#                                                  e.g. 'decode_logits_kernel<.*Kind.1>'); the
#                                                  headline lines are printed, the whole report kept;
#                                                  SECTIONS="SpeedOfLight MemoryWorkloadAnalysis …"
#                                                  profiles those sections only (fewer replays: the
#                                                  whole set outran a 60 s limit on a prefill
#                                                  attention launch)
#
# BENCH ARGS default to a decode at CTX tokens (1048544) of 4 synthetic V4-Flash layers after
# --fill-state. Reports go to $OUT (default /tmp).
set -uo pipefail
cd "$(dirname "$0")/.."
[ -d /tmp/deps/usr/lib/x86_64-linux-gnu ] && export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
ncu=${NCU:-/usr/local/cuda/bin/ncu}
out=${OUT:-/tmp}
mode=${1:?times or full}
regex=${2:?a kernel name regex}
shift 2
if [ "$mode" = full ] || [ "$mode" = sass ]; then
  skip=${1:?how many matching launches to skip}
  shift
fi
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(--synthetic v4-flash --layers 4 --device cuda --prompt-lens 64
  --contexts "${CTX:-1048544}" --fill-state --decode-tokens 4)

case "$mode" in
  times)
    timeout "${TIMEOUT:-300}" "$ncu" --metrics gpu__time_duration.sum --csv --cache-control none \
      --clock-control none --kernel-name "regex:$regex" build/dsv4 bench "${args[@]}" >"$out/ncu_times.csv" \
      2>"$out/ncu_times.err" || { tail -5 "$out/ncu_times.err"; exit 1; }
    LAST=${LAST:-24} python3 - "$out/ncu_times.csv" <<'PY'
import collections, csv, io, os, sys
text = open(sys.argv[1]).read()
rows = list(csv.DictReader(io.StringIO(text[text.find('"ID"'):])))
last = int(os.environ["LAST"])
print(f"{len(rows)} launches profiled; the last {min(last, len(rows))}:")
us = lambda r: float(r["Metric Value"].replace(",", "")) / (1000 if r["Metric Unit"] == "ns" else 1)
for r in rows[-last:]:
    print(f'  {r["Kernel Name"][:64]:64s} {r["Grid Size"]:>14s} {r["Block Size"]:>12s} {us(r):10.1f} us')
def per_kernel(title, launches):
    total, count = collections.defaultdict(float), collections.Counter()
    for r in launches:
        name = r["Kernel Name"].split("(")[0][-64:]
        total[name] += us(r)
        count[name] += 1
    print(f"per kernel, {title}: {len(launches)} launches, {sum(total.values()):.1f} us")
    for name, t in sorted(total.items(), key=lambda x: -x[1]):
        print(f"  {name:64s} {count[name]:6d} launches {t:12.1f} us")
per_kernel("all launches", rows)
starts = [i for i, r in enumerate(rows) if "embed_kernel" in r["Kernel Name"]]
if starts:
    per_kernel("the last forward pass", rows[starts[-1]:])
PY
    ;;
  full)
    report="$out/ncu_full_$(echo "$regex" | tr -c 'A-Za-z0-9_' '_' | cut -c1-40).txt"
    sections=(--set full)
    if [ -n "${SECTIONS:-}" ]; then sections=(); for name in $SECTIONS; do sections+=(--section "$name"); done; fi
    timeout "${TIMEOUT:-300}" "$ncu" "${sections[@]}" --import-source no --cache-control none --clock-control none \
      --kernel-name-base demangled --kernel-name "regex:$regex" --launch-skip "$skip" --launch-count 1 \
      build/dsv4 bench "${args[@]}" >"$report" 2>&1
    grep -q "No kernels were profiled" "$report" && { echo "no launch matched $regex (see $report)"; exit 1; }
    grep -E "^  [a-z].*Context|Grid Size|Block Size|Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Issued Ipc|highest-utilized|Registers Per|Dynamic Shared Memory Per|Block Limit (Registers|Shared)|Theoretical Occ|Achieved Occ|No Eligible|Eligible Warps|Warp Cycles Per Issued|Executed Instructions  |L2 Hit|L2 Cache Throughput|L1/TEX Cache Throughput|Mem Busy|Max Bandwidth|Local Memory Spilling Requests  " "$report"
    echo "report: $report"
    ;;
  sass)
    report="$out/ncu_sass_$(echo "$regex" | tr -c 'A-Za-z0-9_' '_' | cut -c1-40)"
    timeout "${TIMEOUT:-300}" "$ncu" --section WarpStateStats --section SourceCounters --import-source no \
      --cache-control none --clock-control none --kernel-name-base demangled --kernel-name "regex:$regex" \
      --launch-skip "$skip" --launch-count 1 -f -o "$report" build/dsv4 bench "${args[@]}" >"$report.log" 2>&1 ||
      { tail -5 "$report.log"; exit 1; }
    "$ncu" -i "$report.ncu-rep" --page source --csv --print-source sass >"$report.csv" 2>&1
    TOP=${TOP:-40} python3 - "$report.csv" <<'PY'
import csv, os, sys
rows = list(csv.reader(open(sys.argv[1])))
head = next(i for i, r in enumerate(rows) if "Source" in r)
names, body = rows[head], rows[head + 1:]
def col(name):
    return next(i for i, n in enumerate(names) if n.startswith(name))
total, src = col("Warp Stall Sampling (All"), col("Source")
reasons = [i for i, n in enumerate(names) if n.startswith("stall_") and "(Not Issued)" not in n]
num = lambda v: float(v.replace(",", "") or 0)
body = [r for r in body if len(r) == len(names)]
all_samples = sum(num(r[total]) for r in body)
print(f"{len(body)} SASS instructions, {all_samples:.0f} stall samples; the most sampled:")
for r in sorted(body, key=lambda r: -num(r[total]))[: int(os.environ["TOP"])]:
    why = sorted(((num(r[i]), names[i]) for i in reasons if num(r[i]) > 0), reverse=True)[:3]
    print(f"  {100 * num(r[total]) / all_samples:5.1f}%  {r[src][:60]:60s} " + ", ".join(f"{n} {v:.0f}" for v, n in why))
PY
    ;;
  *) echo "bench/ncu.sh: mode '$mode' is not times, sass or full" >&2; exit 2 ;;
esac
