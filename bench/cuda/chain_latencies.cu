// Latencies of the dependent steps that the decode's small kernels are made of: how long one warp
// waits on each step of a chain where every result feeds the next (the mHC Sinkhorn's 40
// normalisations, each a few shuffles, a double sum and a division), and what one grid barrier
// (grid_barrier.cuh) costs a kernel of one block per SM. The figures decide what a joined kernel's
// serial tail may hold (bench/cuda_decode.md, thirty-ninth session).
//
// Chains: one warp runs kSteps dependent steps between two clock64 reads; cycles per step. A
// barrier: G blocks of 256 threads (G = 33, a decoded V4-Flash token's mHC kernel; and one per SM)
// pass kBarriers grid barriers in a row; cycles per barrier in block 0.
//
// On an H100 SXM (2026-12-07, SM clock up to 1 980 MHz): add.f32 4.0 cycles, add.f64 10.4, f32 → f64,
// mul.f64, → f32 45.9, shfl.sync.idx + add.f32 32.1, div.rn.f32 + add.f32 61.8; a Sinkhorn row step
// 168.4 (its double sum in order) and 176.3 (as a tree: no gain); a grid barrier 1 773 cycles for 33
// blocks, 2 028 for 132 (2 447 and 2 702 while grid_arrive also ran a __threadfence). So the
// Sinkhorn's 40 steps take ≈ 6 700 cycles (3.4 µs), of which the division and the conversions are
// most, and a barrier ≈ 0.9 µs.
//
//   cmake --build build --target chain_latencies && build/bench/cuda/chain_latencies
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "backend/cuda/grid_barrier.cuh"
#include "check.cuh"

namespace {

constexpr int kSteps = 1024, kBarriers = 256, kHc = 4;
enum Op { add_f32, add_f64, f32_f64_f32, shuffle, div_f32, sinkhorn_step, sinkhorn_step_tree };

// One step of the chain on x (every lane of the warp runs it).
template <Op kOp>
__device__ __forceinline__ float step(float x, float eps) {
  const int lane = threadIdx.x % 32;
  if constexpr (kOp == add_f32) {
    return x + eps;
  } else if constexpr (kOp == f32_f64_f32) {
    return float(double(x) * 1.0000001);
  } else if constexpr (kOp == shuffle) {
    return __shfl_sync(0xffffffffu, x, (lane + 1) % 32) + eps;
  } else if constexpr (kOp == div_f32) {
    return 1.5f / x + eps;
  } else {  // a row normalisation as the Sinkhorn's: four shuffles, their sum in double (in order,
            // or as a tree), rounded, plus eps, and one IEEE division
    float e[kHc];
#pragma unroll
    for (int i = 0; i < kHc; ++i) e[i] = __shfl_sync(0xffffffffu, x, (lane / kHc) * kHc + i);
    double sum = 0.0;
    if constexpr (kOp == sinkhorn_step) {
#pragma unroll
      for (int i = 0; i < kHc; ++i) sum += e[i];
    } else {
      sum = (double(e[0]) + double(e[1])) + (double(e[2]) + double(e[3]));
    }
    return x / (float(sum) + eps);
  }
}

template <Op kOp>
__global__ void chain(float seed, float eps, float* out, long long* cycles) {
  float x = seed + threadIdx.x * 1e-3f;
  __syncwarp();
  const long long t0 = clock64();
  for (int s = 0; s < kSteps; ++s) {
    if constexpr (kOp == add_f64) {  // a chain of double adds alone
      double d = x;
#pragma unroll 16
      for (int j = 0; j < 16; ++j) d += double(eps);
      x = float(d);
      s += 15;
    } else {
      x = step<kOp>(x, eps);
    }
  }
  const long long t1 = clock64();
  out[threadIdx.x] = x;
  if (threadIdx.x == 0) cycles[0] = t1 - t0;
}

__global__ void barriers(unsigned* word, long long* cycles) {
  const unsigned block = blockIdx.x, blocks = gridDim.x;
  dsv4::cuda::grid_sync(word, block, blocks);  // every block started
  const long long t0 = clock64();
  for (int b = 0; b < kBarriers; ++b) dsv4::cuda::grid_sync(word, block, blocks);
  const long long t1 = clock64();
  if (block == 0 && threadIdx.x == 0) cycles[0] = t1 - t0;
}

bool read_cycles(const long long* cycles, long long& host) {
  return check(cudaDeviceSynchronize(), "kernel") &&
         check(cudaMemcpy(&host, cycles, sizeof(long long), cudaMemcpyDeviceToHost), "cudaMemcpy");
}

template <Op kOp>
bool measure(const char* name, float* out, long long* cycles) {
  chain<kOp><<<1, 32>>>(1.25f, 1e-6f, out, cycles);
  long long host = 0;
  if (!read_cycles(cycles, host)) return false;
  std::printf("%-34s %7.1f cycles a step\n", name, double(host) / kSteps);
  return true;
}

}  // namespace

int main() {
  int sms = 0;
  float* out = nullptr;
  long long* cycles = nullptr;
  unsigned* word = nullptr;
  if (!check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "cudaDeviceGetAttribute") ||
      !check(cudaMalloc(&out, sizeof(float) * 32), "cudaMalloc") ||
      !check(cudaMalloc(&cycles, sizeof(long long)), "cudaMalloc") || !check(cudaMalloc(&word, sizeof(unsigned)), "cudaMalloc") ||
      !check(cudaMemset(word, 0, sizeof(unsigned)), "cudaMemset"))
    return 1;
  bool ok = measure<add_f32>("add.f32", out, cycles) && measure<add_f64>("add.f64", out, cycles) &&
            measure<f32_f64_f32>("f32 -> f64, mul.f64, -> f32", out, cycles) &&
            measure<shuffle>("shfl.sync.idx + add.f32", out, cycles) && measure<div_f32>("div.rn.f32 + add.f32", out, cycles) &&
            measure<sinkhorn_step>("Sinkhorn row step (sum in order)", out, cycles) &&
            measure<sinkhorn_step_tree>("Sinkhorn row step (sum as a tree)", out, cycles);
  for (int blocks : {33, sms}) {
    if (!ok) break;
    barriers<<<blocks, 256>>>(word, cycles);
    long long host = 0;
    ok = read_cycles(cycles, host);
    if (ok) std::printf("grid barrier, %3d blocks of 256         %7.1f cycles a barrier\n", blocks, double(host) / kBarriers);
  }
  return ok ? 0 : 1;
}
