#!/usr/bin/env bash
# A/B on the GPU machine: the same commands on a base build and on this tree's build, alternated on
# one machine in one device call (timings of different machines do not compare; METHOD.md).
#
#   bench/ab.sh build DEBS_DIR PATCH       builds the base: this tree with PATCH reversed, in /tmp/ab-base
#   bench/ab.sh run ROUNDS "CMD;CMD;…"     runs each CMD on the base, then on this tree, ROUNDS times over
#
# PATCH is `git diff BASE HEAD` of the change under test, carried in an ignored folder. Each CMD is a
# command line whose word `dsv4` names the binary (e.g. `DSV4_CUDA_PROFILE=1 dsv4 bench …`); this
# tree's is build/dsv4, built by tests/backend/cuda/device_run.sh with BENCH set (its tests must
# pass first). Output: "== base|new (round R): CMD", then the command's own.
set -uo pipefail
cd "$(dirname "$0")/.."
base=/tmp/ab-base
case "${1:?build or run}" in
  build)
    source tests/backend/cuda/device_env.sh "${2:?the carried .debs}"
    patch=$(realpath "${3:?the change as a patch}")
    rm -rf "$base" && mkdir -p "$base"
    tar --exclude=./build --exclude=./build-debs --exclude=./.git -cf - . | tar -xf - -C "$base"
    (cd "$base" && git apply -R "$patch") || { echo "ab: $patch does not reverse onto this tree"; exit 1; }
    cmake -S "$base" -B "$base/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDSV4_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90a -DDSV4_BENCH=OFF >/dev/null && cmake --build "$base/build" --target dsv4
    ;;
  run)
    rounds=${2:?rounds}
    IFS=';' read -ra cmds <<<"${3:?the commands}"
    [ -x "$base/build/dsv4" ] && [ -x build/dsv4 ] || { echo "ab: build the base and build/dsv4 first"; exit 1; }
    for ((round = 1; round <= rounds; ++round)); do
      for cmd in "${cmds[@]}"; do
        for side in base new; do
          bin=$([ "$side" = base ] && echo "$base/build/dsv4" || echo build/dsv4)
          echo "== $side (round $round): $cmd"
          eval "${cmd//dsv4 /$bin }" 2>&1
        done
      done
    done
    ;;
  *) echo "ab: build or run"; exit 2 ;;
esac
