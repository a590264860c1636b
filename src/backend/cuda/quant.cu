// The quantization simulations of the reference numerics (twin of the kv_fp8_sim and
// indexer_fp4_sim ops of cpu/norm.cpp, with the block steps of cpu/quant.h; architecture.md
// §3.0, §3.3, §3.5). Both are no-ops in plain numerics.
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/quant.cuh"

namespace dsv4::cuda {

namespace {

constexpr int kSimWarps = 8;

// KV FP8 simulation of dims [0, n_dims) of each row in 64-blocks (rope dims untouched).
// Grid (rows, 64-blocks / 8), one warp per 64-block, two elements a lane; amax by warp fmax.
__global__ void kv_fp8_sim_kernel(float* x, int64_t row_stride, int64_t n_dims) {
  await_previous_kernel();
  const int64_t b = int64_t(blockIdx.y) * kSimWarps + threadIdx.x / 32;
  const int64_t k0 = b * 64;
  if (k0 >= n_dims) return;
  const int lane = threadIdx.x % 32;
  const int64_t n = n_dims - k0 < 64 ? n_dims - k0 : 64;
  float* xb = x + blockIdx.x * row_stride + k0;
  const float v0 = lane < n ? xb[lane] : 0.0f, v1 = lane + 32 < n ? xb[lane + 32] : 0.0f;
  const int e = fp8_scale_exp(warp_max(fmaxf(fabsf(v0), fabsf(v1))));
  if (lane < n) xb[lane] = fp8_sim(v0, e);
  if (lane + 32 < n) xb[lane + 32] = fp8_sim(v1, e);
}

// Hadamard (unnormalised butterfly in double, exact for bf16 inputs) × n^-½, rounded to fp32 then
// bf16; then FP4 simulation per 32-block. One block per row, one thread per element (n ≤ 1024,
// so each 32-block is one warp and its amax a warp fmax).
__global__ void indexer_fp4_sim_kernel(float* x, int64_t n) {
  await_previous_kernel();
  extern __shared__ double v[];
  float* xr = x + blockIdx.x * n;
  const int i = threadIdx.x;
  v[i] = xr[i];
  __syncthreads();
  for (int h = 1; h < n; h *= 2) {
    if (i < n / 2) {
      const int j = (i / h) * 2 * h + i % h;  // pair (j, j + h) of this stage
      const double a = v[j], b = v[j + h];
      v[j] = a + b;
      v[j + h] = a - b;
    }
    __syncthreads();
  }
  const double s = 1.0 / sqrt(double(n));
  const float hv = round_bf16(float(v[i] * s));
  const int e = fp4_scale_exp(warp_max(fabsf(hv)));
  xr[i] = fp4_sim(hv, e);
}

}  // namespace

void CudaBackend::kv_fp8_sim(float* x, int64_t rows, int64_t row_stride, int64_t n_dims) {
  Timed timed(*this, "kv_fp8_sim");
  if (!deepseek() || rows == 0 || n_dims == 0) return;
  const int64_t n_blocks = (n_dims + 63) / 64;
  launch(kv_fp8_sim_kernel, dim3(unsigned(rows), unsigned((n_blocks + kSimWarps - 1) / kSimWarps)), kSimWarps * 32,
         0, stream_, x, row_stride, n_dims);
  DSV4_CUDA_LAUNCHED("kv_fp8_sim");
}

void CudaBackend::indexer_fp4_sim(float* x, int64_t rows, int64_t n) {
  Timed timed(*this, "indexer_fp4_sim");
  if (!deepseek() || rows == 0) return;
  DSV4_CUDA_REQUIRE(n >= 32 && n <= 1024 && (n & (n - 1)) == 0, "indexer_fp4_sim: row of ", n,
                    ", expected a power of two in [32, 1024]");
  launch(indexer_fp4_sim_kernel, unsigned(rows), unsigned(n), size_t(n) * sizeof(double), stream_, x, n);
  DSV4_CUDA_LAUNCHED("indexer_fp4_sim");
}

}  // namespace dsv4::cuda
