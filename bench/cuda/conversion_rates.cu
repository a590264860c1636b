// Issue rates of the conversions and packed ops that the indexer's tensor-core terms spend their
// instructions on (indexer_fp4.cu): one block of 1 024 threads per SM runs 8 independent chains of
// one instruction, and the rate is thread-operations per clock per SM (clock64 around the loop).
// On an H200 (2026-12-04, bench/cuda_decode.md, twenty-sixth session): cvt.rn.f32.s32 (SASS
// I2FP.F32.S32) 63.5, cvt.rn.bf16x2.f32 (F2FP.BF16.F32.PACK_AB) 63.5, cvt.rn.f16x2.f32 63.6,
// prmt.b32 63.5, add.f32 125.2, fma.rn.relu.bf16x2 126.9 (two results each): the int-to-float
// conversion runs at half the FP32 rate, so replacing it by an integer add of 1.5 · 2^23's bits and
// a float subtraction (the exact path's trick) adds an instruction and gains nothing; measured
// so, indexer_select at 1M went from 4 324 to 4 523 ms.
//
//   cmake --build build --target conversion_rates && build/bench/cuda/conversion_rates
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "check.cuh"

namespace {

constexpr int kIterations = 4096, kChains = 8, kThreads = 1024;
enum Op { i2f, bf16x2_pack, f16x2_pack, byte_permute, float_add, bf16x2_fma_relu };

template <Op kOp>
__global__ void __launch_bounds__(kThreads) chains(uint32_t seed, uint32_t* out, long long* cycles) {
  uint32_t r[kChains];
  for (int c = 0; c < kChains; ++c) r[c] = seed + threadIdx.x * 7 + c;
  __syncthreads();
  const long long t0 = clock64();
  for (int it = 0; it < kIterations; ++it) {
#pragma unroll
    for (int c = 0; c < kChains; ++c) {
      if constexpr (kOp == i2f) asm volatile("cvt.rn.f32.s32 %0, %0;" : "+r"(r[c]));
      if constexpr (kOp == bf16x2_pack) asm volatile("cvt.rn.bf16x2.f32 %0, %0, %0;" : "+r"(r[c]));
      if constexpr (kOp == f16x2_pack) asm volatile("cvt.rn.f16x2.f32 %0, %0, %0;" : "+r"(r[c]));
      if constexpr (kOp == byte_permute) asm volatile("prmt.b32 %0, %0, %0, 0x7632;" : "+r"(r[c]));
      if constexpr (kOp == float_add) asm volatile("add.f32 %0, %0, 0f4B400000;" : "+r"(r[c]));
      if constexpr (kOp == bf16x2_fma_relu)
        asm volatile("{.reg .b32 z; mov.b32 z, 0; fma.rn.relu.bf16x2 %0, %0, %0, z;}" : "+r"(r[c]));
    }
  }
  __syncthreads();
  const long long t1 = clock64();
  uint32_t x = 0;  // stored when it matches, so the chains are not optimised away
  for (int c = 0; c < kChains; ++c) x ^= r[c];
  if (x == 0x12345678u) out[threadIdx.x] = x;
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}

template <Op kOp>
bool measure(const char* name, int sms, uint32_t* out, long long* cycles) {
  chains<kOp><<<sms, kThreads>>>(1, out, cycles);
  if (!check(cudaDeviceSynchronize(), name)) return false;
  long long host[1024];
  if (!check(cudaMemcpy(host, cycles, sizeof(long long) * sms, cudaMemcpyDeviceToHost), "cudaMemcpy")) return false;
  double mean = 0;
  for (int i = 0; i < sms; ++i) mean += double(host[i]) / sms;
  std::printf("%-22s %7.1f thread-operations per clock per SM\n", name, double(kThreads) * kIterations * kChains / mean);
  return true;
}

}  // namespace

int main() {
  int sms = 0;
  uint32_t* out = nullptr;
  long long* cycles = nullptr;
  if (!check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "cudaDeviceGetAttribute") ||
      sms > 1024 || !check(cudaMalloc(&out, sizeof(uint32_t) * kThreads), "cudaMalloc") ||
      !check(cudaMalloc(&cycles, sizeof(long long) * sms), "cudaMalloc"))
    return 1;
  const bool ok = measure<i2f>("cvt.rn.f32.s32", sms, out, cycles) &&
                  measure<bf16x2_pack>("cvt.rn.bf16x2.f32", sms, out, cycles) &&
                  measure<f16x2_pack>("cvt.rn.f16x2.f32", sms, out, cycles) &&
                  measure<byte_permute>("prmt.b32", sms, out, cycles) && measure<float_add>("add.f32", sms, out, cycles) &&
                  measure<bf16x2_fma_relu>("fma.rn.relu.bf16x2", sms, out, cycles);
  cudaFree(out);
  cudaFree(cycles);
  return ok ? 0 : 1;
}
