// Normalisations and elementwise ops (twin of cpu/norm.cpp; architecture.md §3.0 RMSNorm, §3.3
// per-head q norm).
//
// Parallelisation: one block per row, with a thread per 8 elements of the row (64 to 1024), so
// each thread has its 8 loads in flight together (for_each_element); the sum of squares is a
// block-wide double reduction. (256 threads each waiting on one load at a time took 11 µs for one
// 4 096-wide row on an H200.) The per-head norm's rows are short: a warp each. scale/add: one
// thread per element.
#include <algorithm>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/launch.cuh"

namespace dsv4::cuda {

namespace {

// Threads for one block per row of n: one per 8 elements, a whole number of warps in [64, 1024].
unsigned row_threads(int64_t n) { return unsigned(std::clamp<int64_t>((n / 8 + 31) / 32 * 32, 64, 1024)); }

// Asks for the line holding p in L1 without waiting for it.
__device__ inline void prefetch_l1(const void* p) { asm volatile("prefetch.global.L1 [%0];" ::"l"(p)); }

// RMSNorm: v = mean(x²) in double, inv = rsqrt(fp32(v) + eps); y = w · (x · inv), the weight
// applied before the bf16 rounding (§3.0). The weights are fetched while the sum is formed, so
// the second pass finds them and x in L1 (at decode a row is one block: its time is latency).
__global__ void rms_norm_kernel(const float* x, const float* w, int64_t n, float eps, bool bf16, float* y) {
  await_previous_kernel();
  __shared__ double scratch[32];
  const float* xr = x + blockIdx.x * n;
  float* yr = y + blockIdx.x * n;
  double sum = 0.0;
  for_each_element(xr, n, [&](float v, int64_t i) {
    if (w) prefetch_l1(w + i);
    sum += double(v) * double(v);
  });
  sum = block_sum(sum, scratch);
  const float inv = rms_inverse(sum, n, eps);
  for_each_element(xr, n, [&](float x, int64_t i) {
    const float v = x * inv;
    yr[i] = round_if(bf16, w ? w[i] * v : v);
  });
}

// The weightless per-head norm in bf16 arithmetic (deepseek): q², the mean, mean + eps, the rsqrt
// and the product are each rounded (§5). A warp per row (a head of 512 dims: 16 elements a lane, the
// sum a warp reduction, the second pass from L1). H200, the 524 288 rows of 512 of an 8 192-token
// chunk (2.1 GB read and written): 523 µs, 86% of HBM bandwidth; 791 µs with a block of 64 threads
// per row. (Holding a row in registers, 8 lanes each and 4 rows a warp, measured the same.)
constexpr int kHeadRowsPerBlock = 8;
__global__ void __launch_bounds__(32 * kHeadRowsPerBlock) head_norm_kernel(float* q, int64_t rows, int64_t n, float eps,
                                                                             bool bf16) {
  await_previous_kernel();
  const int64_t row = int64_t(blockIdx.x) * kHeadRowsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;  // (whole warps)
  const int lane = threadIdx.x % 32;
  float* qr = q + row * n;
  double sum = 0.0;
#pragma unroll 8
  for (int64_t i = lane; i < n; i += 32) sum += double(round_if(bf16, qr[i] * qr[i]));
  sum = warp_sum(sum);
  const float mean = round_if(bf16, float(sum / double(n)));
  const float inv = round_if(bf16, rsqrt_f(round_if(bf16, mean + eps)));
#pragma unroll 8
  for (int64_t i = lane; i < n; i += 32) qr[i] = round_if(bf16, qr[i] * inv);
}

__global__ void scale_kernel(float* x, int64_t n, float s, bool bf16) {
  await_previous_kernel();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = round_if(bf16, x[i] * s);
}

__global__ void add_kernel(const float* a, const float* b, int64_t n, bool bf16, float* y) {
  await_previous_kernel();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = round_if(bf16, a[i] + b[i]);
}

}  // namespace

void CudaBackend::rms_norm(const float* x, const float* w, int64_t rows, int64_t n, double eps, float* y) {
  Timed timed(*this, "rms_norm");
  if (rows == 0) return;
  DSV4_CUDA_REQUIRE(rows < (int64_t(1) << 31), "rms_norm: ", rows, " rows");
  // w is a model weight (host memory): its device copy, uploaded once.
  const float* dw = w ? static_cast<const float*>(upload(w, size_t(n) * sizeof(float))) : nullptr;
  launch(rms_norm_kernel, unsigned(rows), row_threads(n), 0, stream_, x, dw, n, float(eps), deepseek(), y);
  DSV4_CUDA_LAUNCHED("rms_norm");
}

void CudaBackend::head_norm(float* q, int64_t rows, int64_t n, double eps) {
  Timed timed(*this, "head_norm");
  if (rows == 0) return;
  DSV4_CUDA_REQUIRE(rows < (int64_t(1) << 31), "head_norm: ", rows, " rows");
  launch(head_norm_kernel, unsigned((rows + kHeadRowsPerBlock - 1) / kHeadRowsPerBlock), 32 * kHeadRowsPerBlock, 0,
         stream_, q, rows, n, float(eps), deepseek());
  DSV4_CUDA_LAUNCHED("head_norm");
}

void CudaBackend::scale(float* x, int64_t n, float s) {
  Timed timed(*this, "scale");
  if (n == 0) return;
  launch(scale_kernel, grid_for(n, 256), 256, 0, stream_, x, n, s, deepseek());
  DSV4_CUDA_LAUNCHED("scale");
}

void CudaBackend::add(const float* a, const float* b, int64_t n, float* y) {
  Timed timed(*this, "add");
  if (n == 0) return;
  launch(add_kernel, grid_for(n, 256), 256, 0, stream_, a, b, n, deepseek(), y);
  DSV4_CUDA_LAUNCHED("add");
}

}  // namespace dsv4::cuda
