// The FP64 tensor cores' throughput per mma shape: every warp of a full GPU runs 8 independent
// chains of one shape back to back, and the rate is FP64 multiply-adds per second ×2.
// On an H200 (2026-12-01, bench/results/cuda_decode_kernels_h200.log): m8n8k4 33.3 TFLOP/s,
// m16n8k4 and m16n8k8 66.7, whatever the blocks per SM: m8n8k4 reaches half the peak, which is why
// device_math.cuh's dmma issues m16n8k4.
//
//   cmake --build build --target dmma_rate && build/bench/cuda/dmma_rate
#include <cuda_runtime.h>

#include <cstdio>

#include "check.cuh"

namespace {

constexpr int kIterations = 4096, kChains = 8, kThreads = 256;
enum Shape { m8n8k4, m16n8k4, m16n8k8 };

template <Shape kShape>
__global__ void __launch_bounds__(kThreads) chains(double* out, double seed) {
  double acc[kChains][4] = {};
  const double a0 = seed + threadIdx.x, a1 = a0 * 0.5, a2 = a0 * 0.25, a3 = a0 * 0.125, b0 = seed - threadIdx.x,
               b1 = b0 * 0.5;
  for (int it = 0; it < kIterations; ++it) {
#pragma unroll
    for (int c = 0; c < kChains; ++c) {
      double(&d)[4] = acc[c];
      if constexpr (kShape == m8n8k4)
        asm volatile("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0,%1}, {%2}, {%3}, {%0,%1};"
                     : "+d"(d[0]), "+d"(d[1])
                     : "d"(a0), "d"(b0));
      else if constexpr (kShape == m16n8k4)
        asm volatile("mma.sync.aligned.m16n8k4.row.col.f64.f64.f64.f64 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
                     : "+d"(d[0]), "+d"(d[1]), "+d"(d[2]), "+d"(d[3])
                     : "d"(a0), "d"(a1), "d"(b0));
      else
        asm volatile(
            "mma.sync.aligned.m16n8k8.row.col.f64.f64.f64.f64 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+d"(d[0]), "+d"(d[1]), "+d"(d[2]), "+d"(d[3])
            : "d"(a0), "d"(a1), "d"(a2), "d"(a3), "d"(b0), "d"(b1));
    }
  }
  double sum = 0.0;  // stored, so the chains are not optimised away
  for (auto& d : acc)
    for (double v : d) sum += v;
  out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}

template <Shape kShape>
bool measure(const char* name, double multiply_adds, int sms, int blocks_per_sm) {
  const int blocks = sms * blocks_per_sm;
  double* out = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  if (!check(cudaMalloc(&out, sizeof(double) * blocks * kThreads), "cudaMalloc") ||
      !check(cudaEventCreate(&start), "cudaEventCreate") || !check(cudaEventCreate(&stop), "cudaEventCreate"))
    return false;
  chains<kShape><<<blocks, kThreads>>>(out, 1.0);  // warm-up
  cudaEventRecord(start);
  chains<kShape><<<blocks, kThreads>>>(out, 1.0);
  cudaEventRecord(stop);
  if (!check(cudaEventSynchronize(stop), name)) return false;
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  const double mmas = double(blocks) * (kThreads / 32) * kIterations * kChains;
  std::printf("%-8s %d blocks of %d per SM: %7.3f ms, %5.1f TFLOP/s\n", name, blocks_per_sm, kThreads, ms,
              2 * mmas * multiply_adds / (ms * 1e-3) / 1e12);
  cudaFree(out);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return true;
}

}  // namespace

int main() {
  int sms = 0;
  if (!check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "no CUDA device")) return 1;
  for (int blocks_per_sm : {1, 2, 4})
    if (!measure<m8n8k4>("m8n8k4", 8 * 8 * 4, sms, blocks_per_sm) ||
        !measure<m16n8k4>("m16n8k4", 16 * 8 * 4, sms, blocks_per_sm) ||
        !measure<m16n8k8>("m16n8k8", 16 * 8 * 8, sms, blocks_per_sm))
      return 1;
  return 0;
}
