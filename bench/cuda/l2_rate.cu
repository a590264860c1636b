// How fast the SMs can read a working set that stays in L2, the way deepseek-tc's prefill attention
// reads its rows (attention_tc.cu: every query's block copies each 64 KB tile of rows into shared
// memory with cp.async, and in an HCA layer all blocks read nearly the same rows). The question it
// answers: is that kernel bound by the L2's bandwidth (≈ 2 TB/s at 27% of the bf16 peak, 7.5 at
// the peak), or by latency it could hide (bench/cuda_decode.md, thirty-seventh session)?
//
// One block of 256 threads per SM streams the working set `passes` times in tiles of 64 KB, two in
// flight (as the attention's two tile slots), by cp.async into shared memory, or by 16-byte loads
// into registers; the blocks start at the same tile (every block reads the same rows at about the
// same time) or spread over the set. Bytes read over the time between two events.
//
//   cmake --build build --target l2_rate && build/bench/cuda/l2_rate [MiB of working set, 8]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "check.cuh"

namespace {

constexpr int kThreads = 256, kTileBytes = 64 * 1024, kChunksPerThread = kTileBytes / 16 / kThreads;

__device__ __forceinline__ void copy_16(uint32_t to, const void* from) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(to), "l"(from) : "memory");
}

// Tile t of the pass for block b: the same for every block (same_start), or spread over the set.
__device__ __forceinline__ int64_t tile_of(int64_t t, int64_t n_tiles, bool same_start) {
  return (t + (same_start ? 0 : int64_t(blockIdx.x) * n_tiles / gridDim.x)) % n_tiles;
}

__global__ void __launch_bounds__(kThreads) by_copies(const uint4* set, int64_t n_tiles, int passes, bool same_start,
                                                     uint32_t* sink) {
  extern __shared__ uint4 tiles[];  // two tiles
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(tiles));
  const int64_t steps = n_tiles * passes;
  auto issue = [&](int64_t step) {
    const uint4* from = set + tile_of(step % n_tiles, n_tiles, same_start) * (kTileBytes / 16);
    const uint32_t to = base + uint32_t(step % 2) * kTileBytes;
    for (int c = 0; c < kChunksPerThread; ++c) {
      const int chunk = threadIdx.x + c * kThreads;
      copy_16(to + 16 * chunk, from + chunk);
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  };
  issue(0);
  uint32_t x = 0;
  for (int64_t step = 0; step < steps; ++step) {
    if (step + 1 < steps) issue(step + 1);
    else asm volatile("cp.async.commit_group;" ::: "memory");
    asm volatile("cp.async.wait_group 1;" ::: "memory");
    __syncthreads();
    x ^= reinterpret_cast<const uint32_t*>(tiles)[(step % 2) * (kTileBytes / 4) + threadIdx.x];  // touch it
    __syncthreads();  // the slot is refilled next step
  }
  if (x == 0x12345678u) sink[threadIdx.x] = x;  // (so nothing is optimised away)
}

__global__ void __launch_bounds__(kThreads) by_loads(const uint4* set, int64_t n_tiles, int passes, bool same_start,
                                                    uint32_t* sink) {
  uint32_t x = 0;
  for (int64_t step = 0; step < n_tiles * passes; ++step) {
    const uint4* from = set + tile_of(step % n_tiles, n_tiles, same_start) * (kTileBytes / 16);
    uint4 v[kChunksPerThread];
#pragma unroll
    for (int c = 0; c < kChunksPerThread; ++c) v[c] = __ldcg(from + threadIdx.x + c * kThreads);
#pragma unroll
    for (int c = 0; c < kChunksPerThread; ++c) x ^= v[c].x ^ v[c].y ^ v[c].z ^ v[c].w;
  }
  if (x == 0x12345678u) sink[threadIdx.x] = x;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t mib = argc > 1 ? std::atoll(argv[1]) : 8;
  const int64_t n_tiles = mib * 1024 * 1024 / kTileBytes;
  int sms = 0, clock_khz = 0;
  uint4* set = nullptr;
  uint32_t* sink = nullptr;
  cudaEvent_t start, stop;
  if (n_tiles < 1 || !check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "attribute") ||
      !check(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0), "attribute") ||
      !check(cudaMalloc(&set, size_t(n_tiles) * kTileBytes), "cudaMalloc") ||
      !check(cudaMemset(set, 1, size_t(n_tiles) * kTileBytes), "cudaMemset") ||
      !check(cudaMalloc(&sink, kThreads * sizeof(uint32_t)), "cudaMalloc") ||
      !check(cudaFuncSetAttribute(by_copies, cudaFuncAttributeMaxDynamicSharedMemorySize, 2 * kTileBytes),
             "shared memory") ||
      !check(cudaEventCreate(&start), "event") || !check(cudaEventCreate(&stop), "event"))
    return 1;
  const int passes = int(std::max<int64_t>(1, 4096 / n_tiles));  // ≈ 256 MiB per block
  std::printf("%d SMs, %lld MiB working set, %d passes a block\n", sms, (long long)mib, passes);
  for (int kind = 0; kind < 2; ++kind)
    for (int same = 1; same >= 0; --same) {
      float ms = 0;
      for (int rep = 0; rep < 2; ++rep) {  // the first one warms the L2
        check(cudaEventRecord(start), "record");
        if (kind == 0) by_copies<<<sms, kThreads, 2 * kTileBytes>>>(set, n_tiles, passes, same, sink);
        else by_loads<<<sms, kThreads>>>(set, n_tiles, passes, same, sink);
        check(cudaEventRecord(stop), "record");
        if (!check(cudaEventSynchronize(stop), "kernel")) return 1;
        check(cudaEventElapsedTime(&ms, start, stop), "elapsed");
      }
      const double bytes = double(sms) * double(n_tiles) * passes * kTileBytes;
      const double tbs = bytes / (ms * 1e-3) / 1e12;
      std::printf("%-10s %-12s %7.2f TB/s, %5.1f bytes per clock per SM (at the %d MHz peak clock)\n",
                  kind == 0 ? "cp.async" : "ld.cg", same ? "same tiles" : "spread", tbs,
                  bytes / (ms * 1e-3) / sms / (double(clock_khz) * 1e3), clock_khz / 1000);
    }
  cudaFree(set);
  cudaFree(sink);
  return 0;
}
