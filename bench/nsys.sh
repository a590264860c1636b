#!/usr/bin/env bash
# Nsight Systems over `dsv4 bench`: where a decoded token's time goes in the real run. ncu runs the
# kernels one at a time, so its durations add up the fixed cost of every launch; in the run they
# are programmatic dependent launches (launch.cuh), and a kernel's blocks start while the one before
# finishes. The kernel trace gives both: each kernel's duration, and the time from its start to the
# next kernel's start (its share of the token's critical path). Run on the GPU machine after
# tests/backend/cuda/device_run.sh has built build/dsv4 (and unpacked its packages).
#
#   bench/nsys.sh [BENCH ARGS...]      for the last forward pass (from the last embed_kernel): its span
#                                      and summed durations, per kernel both sums, and the first FIRST
#                                      (45) launches in order
#
# BENCH ARGS default to a decode of 4 tokens at 4K of 4 synthetic V4-Flash layers, deepseek-tc, after
# --fill-state. DSV4 names another binary; the report goes to $OUT (default /tmp).
set -uo pipefail
cd "$(dirname "$0")/.."
[ -d /tmp/deps/usr/lib/x86_64-linux-gnu ] && export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nsys=${NSYS:-$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)}
[ -x "$nsys" ] || { echo "bench/nsys.sh: no nsys on this machine" >&2; exit 1; }
out=${OUT:-/tmp}
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(--synthetic v4-flash --layers 4 --device cuda --numerics deepseek-tc --prompt-lens none
  --contexts 4096 --fill-state --decode-tokens 4)
timeout "${TIMEOUT:-200}" "$nsys" profile -o "$out/nsys_trace" --force-overwrite true --trace=cuda \
  "${DSV4:-build/dsv4}" bench "${args[@]}" >"$out/nsys.log" 2>&1 || { tail -5 "$out/nsys.log"; exit 1; }
rm -f "$out/nsys_trace.sqlite"
"$nsys" export --type sqlite -o "$out/nsys_trace.sqlite" "$out/nsys_trace.nsys-rep" \
  >>"$out/nsys.log" 2>&1 || { tail -5 "$out/nsys.log"; exit 1; }
FIRST=${FIRST:-45} python3 - "$out/nsys_trace.sqlite" <<'PY'
import collections, os, sqlite3, sys
db = sqlite3.connect(sys.argv[1])
names = dict(db.execute("select id, value from StringIds"))
rows = db.execute("select start, end, demangledName, gridX, gridY, gridZ, streamId "
                  "from CUPTI_ACTIVITY_KIND_KERNEL order by start").fetchall()
def short(r):  # the kernel's name and template arguments, without namespaces and parameters
    n = names[r[2]]
    for prefix in ("dsv4::cuda::(anonymous namespace)::", "dsv4::cuda::<unnamed>::", "void "):
        n = n.replace(prefix, "")
    return n.split("(")[0][-48:]
starts = [i for i, r in enumerate(rows) if "embed_kernel" in names[r[2]]]
if not starts:
    sys.exit("no embed_kernel in the trace: no forward pass to show")
last = rows[starts[-1]:]
to_next = [((last[j + 1][0] if j + 1 < len(last) else r[1]) - r[0]) / 1e3 for j, r in enumerate(last)]
span, busy = (last[-1][1] - last[0][0]) / 1e3, sum(r[1] - r[0] for r in last) / 1e3
print(f"the last forward pass: {len(last)} kernels on {len(set(r[6] for r in last))} stream(s), "
      f"{span:.1f} us from the first start to the last end, durations summing {busy:.1f} us")
dur, nxt, cnt = collections.defaultdict(float), collections.defaultdict(float), collections.Counter()
for r, t in zip(last, to_next):
    n = short(r)
    dur[n] += (r[1] - r[0]) / 1e3
    nxt[n] += t
    cnt[n] += 1
print(f"  {'kernel':48s} {'launches':>8s} {'duration us':>12s} {'start to next us':>17s}")
for n in sorted(nxt, key=lambda n: -nxt[n]):
    print(f"  {n:48s} {cnt[n]:8d} {dur[n]:12.1f} {nxt[n]:17.1f}")
print(f"the first {os.environ['FIRST']} launches: duration, start to next (us), grid")
for r, t in list(zip(last, to_next))[: int(os.environ["FIRST"])]:
    print(f"  {short(r):48s} {(r[1] - r[0]) / 1e3:8.1f} {t:8.1f}  ({r[3]}, {r[4]}, {r[5]})")
PY
