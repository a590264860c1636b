#!/usr/bin/env bash
# Builds the CUDA twin tests and runs them, on a GPU machine reached through the device tool
# (the H200 image has CMake, ninja, nvcc and most of the project's -dev packages, but not all:
# the carried ones below were needed there in 2026-11).
#
#   tests/backend/cuda/device_run.sh [DEBS_DIR] [CTEST_REGEX]
#
# bench/h200_session.sh wraps this with the standard benches and ncu breakdowns, packed in one file.
#
# BENCH="ARGS;ARGS;…": afterwards also build dsv4 and run `dsv4 bench ARGS` for each entry (its
# output in $OUT/bench.log; --json paths are relative to the repository root). Set DSV4_COMMIT to
# the commit being run: the device tool's copy of the tree may carry stale git metadata (seen
# 2026-11: it reported the session's first commit), and the records take it from there.
#
# PREBUILT=1: run the build/tests/test_cuda (and with BENCH, build/dsv4) carried from the machine
# that built them (carry: ["build-debs", "build/tests/test_cuda", "build/dsv4"]; sm_90a, the CUDA 13
# libraries, the fixtures by their compiled-in paths) instead of configuring and building here,
# which took a fresh GPU machine 1.5–2 minutes of the session's device time (2026-12-07, one H100:
# the suite then took 48 s of the call).
#
# DEBS_DIR holds Debian 12 .debs of the build dependencies (apt-get download libfmt-dev libfmt9
# nlohmann-json3-dev libcli11-dev libgtest-dev libpcre2-dev libpcre2-8-0 libpcre2-16-0
# libpcre2-32-0 libpcre2-posix3 pkgconf pkgconf-bin libpkgconf3, and for the server
# libcpp-httplib-dev libcpp-httplib0.11 libbrotli-dev libbrotli1 libssl-dev zlib1g-dev); they are unpacked into
# /tmp/deps and put first on every search path (device_env.sh). Logs go to $OUT when set.
set -uo pipefail
cd "$(dirname "$0")/../../.."
debs=${1:-}
regex=${2:-Cuda|cuda}
out=${OUT:-/tmp}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
echo "nvcc: $(nvcc --version | tail -1); cmake: $(cmake --version | head -1); gcc: $(gcc -dumpfullversion)"
source tests/backend/cuda/device_env.sh "$debs"
prebuilt=${PREBUILT:-0}
if [ "$prebuilt" = 1 ]; then
  [ -x build/tests/test_cuda ] || { echo "PREBUILT=1: build/tests/test_cuda was not carried"; exit 1; }
  echo "prebuilt test_cuda: $(build/tests/test_cuda --gtest_list_tests | grep -c '^  ') cases"
else
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSV4_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DDSV4_BENCH=OFF >"$out/configure.log" 2>&1 || { tail -40 "$out/configure.log"; exit 1; }
  cmake --build build -j"$(nproc)" --target test_cuda >"$out/build.log" 2>&1 || { grep -E "error|Error" "$out/build.log" | head -40; tail -20 "$out/build.log"; exit 1; }
  echo "built test_cuda; $(ctest --test-dir build -N -R "$regex" | tail -1)"
fi
# One process for all cases (ctest would start a CUDA context per test); every twin and e2e
# comparison prints one line, kept in $out/test.log.
timeout "${TEST_TIMEOUT:-400}" build/tests/test_cuda --gtest_filter="${GTEST_FILTER:-*Cuda*}" >"$out/test.log" 2>&1
status=$?
echo "twin outputs bit-exact: $(grep -cE '^\[ twin .*(bit-exact|identical)$' "$out/test.log"), differing: $(grep -E '^\[ twin ' "$out/test.log" | grep -cv 'bit-exact\|identical$')"
grep -E '^\[ twin ' "$out/test.log" | grep -v 'bit-exact\|identical$' | head -30
grep -E '^\[ e2e ' "$out/test.log"
grep -E '^\[  (FAILED|PASSED|SKIPPED) |Failure|error' "$out/test.log" | head -40
tail -3 "$out/test.log"
# SANITIZE=1: compute-sanitizer's memcheck and initcheck over the op twins and one engine case,
# racecheck over the kernels that share memory between threads.
if [ "${SANITIZE:-0}" = 1 ]; then
  san=/usr/local/cuda/bin/compute-sanitizer
  for tool in memcheck initcheck; do
    timeout 150 $san --tool $tool --error-exitcode 9 build/tests/test_cuda \
      --gtest_filter='CudaTwin.*:*tiny_flash_129_deepseek' >"$out/$tool.log" 2>&1
    echo "$tool: exit $? $(grep -E 'ERROR SUMMARY' "$out/$tool.log" | tail -1)"
  done
  timeout 120 $san --tool racecheck --error-exitcode 9 build/tests/test_cuda \
    --gtest_filter='CudaTwin.Attention:CudaTwin.IndexerSelect:CudaTwin.IndexerFp4Simulation:CudaTwin.Hc*:CudaTwin.RmsNorm' \
    >"$out/racecheck.log" 2>&1
  echo "racecheck: exit $? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$out/racecheck.log" | tail -1)"
fi
# Benches are recorded against twins that passed: a differing output or a failed test skips them,
# and the exit status says so (3 when every test passed but an output differed within tolerance).
if [ -n "${BENCH:-}" ] && { [ "$status" != 0 ] || grep -E '^\[ twin ' "$out/test.log" | grep -qv 'bit-exact\|identical$'; }; then
  echo "bench skipped: the twins did not all pass"
  [ "$status" = 0 ] && status=3
elif [ -n "${BENCH:-}" ]; then
  if [ "$prebuilt" = 1 ]; then
    [ -x build/dsv4 ] || { echo "PREBUILT=1: build/dsv4 was not carried"; exit 1; }
  else
    cmake --build build -j"$(nproc)" --target dsv4 >>"$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
  fi
  IFS=';' read -ra runs <<<"$BENCH"
  for args in "${runs[@]}"; do
    echo "dsv4 bench $args"
    eval "build/dsv4 bench $args" 2>&1 | tee -a "$out/bench.log"
  done
fi
exit $status
