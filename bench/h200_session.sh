#!/usr/bin/env bash
# One device command for a CUDA change (run in the repository root on the GPU machine, with the
# carried packages; see tests/backend/cuda/device_run.sh):
#
#   DSV4_COMMIT=<commit> bench/h200_session.sh DEBS_DIR [28] [ncu]
#
# 1. the CUDA twins and engine tests (device_run.sh); if any output differs or a test fails, stop;
# 2. dsv4 bench, 4 V4-Flash layers: 4K prefill, decode at 4K and 1M (--fill-state), and with "28"
#    also 28 layers at 4K and 1M (about 100 s more, most of it making the weights);
# 3. with "ncu": the last decoded token's per-kernel GPU time at 4K and at 1M (bench/ncu.sh times);
# 4. everything in $OUT packed into $OUT/run.tgz (the device tool returns only a few files).
set -uo pipefail
cd "$(dirname "$0")/.."
debs=${1:?the directory of the carried .debs}
shift
out=${OUT:?the folder the device tool returns}
: "${DSV4_COMMIT:?the commit being run: the git metadata of the device copy may be stale}"
pack() { (cd "$out" && tar czf /tmp/run.tgz . && find . -type f -delete && mv /tmp/run.tgz "$out/"); }
trap pack EXIT

TEST_TIMEOUT=${TEST_TIMEOUT:-420} bash tests/backend/cuda/device_run.sh "$debs" >"$out/device_run.log" 2>&1
status=$?
grep -E "twin outputs|PASSED|FAILED" "$out/device_run.log"
if [ "$status" != 0 ] || grep -E '^\[ twin ' "$out/test.log" | grep -qv 'bit-exact\|identical$'; then
  grep -E '^\[ twin ' "$out/test.log" | grep -v 'bit-exact\|identical$' | head -20
  echo "stopped: the twins did not all pass"
  exit 1
fi
export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cmake --build build --target dsv4 >>"$out/build.log" 2>&1 || { echo "building dsv4 failed"; exit 1; }
bench() { echo "dsv4 bench $*"; timeout 300 build/dsv4 bench "$@" 2>&1 | grep -E "decode at|^ +[0-9]"; }
B=(--synthetic v4-flash --device cuda --contexts 4096,1048544 --fill-state --decode-tokens 32)
{
  bench "${B[@]}" --layers 4 --prompt-lens 4096 --json "$out/bench.jsonl"
  [[ " $* " == *" 28 "* ]] && bench "${B[@]}" --layers 28 --prompt-lens none --json "$out/bench.jsonl"
} | tee "$out/bench.txt"
if [[ " $* " == *" ncu "* ]]; then
  for ctx in 4096 1048544; do
    LAST=0 OUT="$out" bash bench/ncu.sh times '.' --synthetic v4-flash --layers 4 --device cuda --prompt-lens none \
      --contexts "$ctx" --fill-state --decode-tokens 2 >"$out/ncu_$ctx.txt" 2>&1
    mv "$out/ncu_times.csv" "$out/ncu_$ctx.csv"
    sed -n '/the last forward pass/,$p' "$out/ncu_$ctx.txt" | head -25
  done
fi
