#!/usr/bin/env bash
# One device command for a CUDA change (run in the repository root on the GPU machine, with the
# carried packages; see tests/backend/cuda/device_run.sh):
#
#   DSV4_COMMIT=<commit> bench/h200_session.sh DEBS_DIR [28] [ncu]
#
# 1. device_run.sh: the CUDA twins and engine tests, then, only if every output came back
#    bit-exact, dsv4 bench with 4 V4-Flash layers (4K prefill, decode at 4K and 1M with
#    --fill-state) and with "28" also 28 layers at 4K and 1M (about 100 s more, most of it making
#    the weights); if the twins did not all pass, stop;
# 2. with "ncu": the last decoded token's per-kernel GPU time at 4K and at 1M (bench/ncu.sh times;
#    NCU_CONTEXTS="4096" for 4K alone);
# 3. everything in $OUT packed into $OUT/run.tgz (the device tool returns only a few files).
set -uo pipefail
cd "$(dirname "$0")/.."
debs=${1:?the directory of the carried .debs}
shift
out=${OUT:?the folder the device tool returns}
: "${DSV4_COMMIT:?the commit being run: the git metadata of the device copy may be stale}"
pack() { (cd "$out" && tar czf /tmp/run.tgz . && find . -type f -delete && mv /tmp/run.tgz "$out/"); }
trap pack EXIT

B="--synthetic v4-flash --device cuda --contexts 4096,1048544 --fill-state --decode-tokens 32"
BENCH="$B --layers 4 --prompt-lens 4096 --json $out/bench.jsonl"
[[ " $* " == *" 28 "* ]] && BENCH+=";$B --layers 28 --prompt-lens none --json $out/bench.jsonl"
BENCH="$BENCH" TEST_TIMEOUT=${TEST_TIMEOUT:-420} bash tests/backend/cuda/device_run.sh "$debs" >"$out/device_run.log" 2>&1
status=$?
grep -E "twin outputs|PASSED|FAILED|bench skipped|decode at|^ +[0-9]" "$out/device_run.log"
[ "$status" = 0 ] || { echo "stopped: device_run.sh exited $status"; exit 1; }
if [[ " $* " == *" ncu "* ]]; then
  for ctx in ${NCU_CONTEXTS:-4096 1048544}; do
    LAST=0 OUT="$out" bash bench/ncu.sh times '.' --synthetic v4-flash --layers 4 --device cuda --prompt-lens none \
      --contexts "$ctx" --fill-state --decode-tokens 2 >"$out/ncu_$ctx.txt" 2>&1
    mv "$out/ncu_times.csv" "$out/ncu_$ctx.csv"
    sed -n '/the last forward pass/,$p' "$out/ncu_$ctx.txt" | head -25
  done
fi
