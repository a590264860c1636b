#!/usr/bin/env bash
# The SASS of one CUDA source file of the backend, compiled as the build compiles it for sm_90a, on a
# machine without a GPU: ptxas's register and spill counts per kernel, then the instructions of the
# kernels whose mangled name matches PATTERN. How the thirty-ninth session found that ptxas issued
# the mHC kernel's loads one after another (bench/cuda_decode.md). The CUDA toolkit here has no
# cuobjdump or nvdisasm; they come from NVIDIA's PyPI wheels, fetched once into the cache.
#
#   tools/sass.sh src/backend/cuda/hc.cu [PATTERN] > hc.sass
set -euo pipefail
cd "$(dirname "$0")/.."
src=${1:?a .cu file}
pattern=${2:-.}
cache=${XDG_CACHE_HOME:-$HOME/.cache}/dsv4-sass
bin=$cache/nvidia/cu13/bin
if [ ! -x "$bin/cuobjdump" ] || [ ! -x "$bin/nvdisasm" ]; then
  mkdir -p "$cache"
  python3 -m pip download --quiet --no-deps --dest "$cache" nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm >&2
  for wheel in "$cache"/nvidia_cuda_cuobjdump-*.whl "$cache"/nvidia_cuda_nvdisasm-*.whl; do
    python3 -m zipfile -e "$wheel" "$cache"
  done
  chmod +x "$bin/cuobjdump" "$bin/nvdisasm"
fi
object=$(mktemp --suffix=.o)
trap 'rm -f "$object"' EXIT
# The build's flags for the backend's sources (CMakeLists.txt: sm_90a, no contraction, IEEE
# division and square root, denormals kept, C++20).
nvcc -O3 -DNDEBUG --generate-code=arch=compute_90a,code=[sm_90a] --fmad=false --prec-div=true --prec-sqrt=true \
  --ftz=false -std=c++20 -I src -c "$src" \
  -o "$object" -Xptxas -v 2>&1 | grep -E "Compiling entry|registers|spill" >&2
PATH=$bin:$PATH cuobjdump -sass "$object" | awk -v pattern="$pattern" '
  /Function :/ { show = ($0 ~ pattern) }
  show'
