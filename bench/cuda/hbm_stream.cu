// How fast one pass over a large matrix can stream from HBM, read the ways a decode product could
// read its weights: the question is whether deepseek-tc's decode GEMVs (gemv_tc.cu, 1.5–1.9 TB/s on
// their large matrices on an H100, 3.35 TB/s the datasheet's) are bound by how many bytes their
// register rings keep in flight, and what the copy engine's bulk copies into shared memory reach
// (bench/cuda_decode.md, thirty-ninth session). Its first run (fortieth session) answered no: the
// register ring streams 3.1 TB/s over 1 GiB. So the last part asks what a decoded token's products
// lose by being many short launches: the same bytes read as a chain of dependent launches of a few
// MiB each, as the engine launches them (each kernel's first units in flight before it waits for
// the one before, launch.cuh), against one long pass.
//
//   registers, depth D: the GEMV's pattern. A row-major matrix of K-byte rows; a warp takes a tile of
//     16 rows, lane (g, i) reads 16 bytes at 16·i and 64 + 16·i of each 128-byte unit of rows g and
//     g + 8, and keeps D units ahead in registers (tc_gemv's ring: D = 2). 256 threads a block, S
//     warps per tile splitting its units (wq_b's 33.5 MB of K = 1 024: S = 2, 4 tiles a block).
//   cp.async, depth D: the same reads as 16-byte cp.async copies into the lane's own slots of a ring
//     of D units in shared memory (no registers held by bytes in flight; the exact decode kernel's
//     way), each lane reading back what it copied.
//   bulk, S stages of B bytes: one block per SM streams its contiguous share through S stages of
//     shared memory, each filled by one cp.async.bulk and awaited on an mbarrier; the block's warps
//     read every stage from shared memory before it is refilled.
//   chain of N of W MiB: the register ring of depth 2 over consecutive windows of the matrix, a
//     launch each, as programmatic dependent launches (a kernel's blocks may start while the one
//     before runs, and wait for it once their first units are in flight) or as plain ones; the time
//     a launch adds over its bytes at the long pass's rate is its fixed cost.
// Bytes over the time between two events; every byte is folded into a checksum so nothing is
// optimised away.
//
//   cmake --build build --target hbm_stream && build/bench/cuda/hbm_stream [MiB, 1024] [K bytes, 1024] [S, 2]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/wgmma.cuh"
#include "check.cuh"

namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;

// Lane (g, i)'s reads in the GEMV's pattern: 8 / S tiles of 16 rows a block, S warps a tile (warp
// s of a tile takes units s, s + S, …); word j < 4 of unit u is row g (j < 2) or g + 8 at
// 16·i + 64·(j % 2).
struct LaneReads {
  const uint8_t* lo;
  const uint8_t* hi;
  int s, S;
  int64_t units;
  __device__ LaneReads(const uint8_t* m, int64_t K, int S_) : S(S_), units(K / 128) {
    const int lane = threadIdx.x % 32;
    const int64_t tile = int64_t(blockIdx.x) * (kWarps / S) + threadIdx.x / 32 / S;
    s = threadIdx.x / 32 % S;
    lo = m + (tile * 16 + lane / 4) * K + 16 * (lane % 4);
    hi = lo + 8 * K;
  }
  __device__ const uint8_t* word(int j, int64_t u) const { return (j < 2 ? lo : hi) + 128 * u + 64 * (j % 2); }
  // The lane's units in order, unit u through ring slot d (its index mod kDepth): fill(d, u) for the
  // first kDepth, then step(d, u, refill) with refill the unit that slot takes next (none past the end).
  template <int kDepth, class Fill, class Step>
  __device__ void each_unit(Fill fill, Step step) const {
#pragma unroll
    for (int d = 0; d < kDepth; ++d) fill(d, s + d * S);
    for (int64_t u0 = s; u0 < units; u0 += kDepth * S)
#pragma unroll
      for (int d = 0; d < kDepth; ++d) {
        const int64_t u = u0 + d * S;
        if (u >= units) break;
        step(d, u, u + kDepth * S);
      }
  }
};

// The GEMV's read pattern with a ring of kDepth units in registers. chained: a link of a launch chain,
// which waits for the kernel before it once its first units are in flight (as tc_gemv does).
template <int kDepth>
__global__ void __launch_bounds__(kThreads) registers(const uint8_t* m, int64_t K, int S, uint32_t* out,
                                                      bool chained) {
  const LaneReads r(m, K, S);
  bool waited = !chained;
  uint4 ring[kDepth][4];
  auto load = [&](int d, int64_t u) {
    if (u >= r.units) return;
#pragma unroll
    for (int j = 0; j < 4; ++j) ring[d][j] = __ldg(reinterpret_cast<const uint4*>(r.word(j, u)));
  };
  uint32_t x = 0;
  r.each_unit<kDepth>(load, [&](int d, int64_t, int64_t refill) {
    if (!waited) dsv4::cuda::await_previous_kernel(), waited = true;  // (the first step: after the fills)
    uint4 now[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) now[j] = ring[d][j];
    load(d, refill);
#pragma unroll
    for (int j = 0; j < 4; ++j) x ^= now[j].x ^ now[j].y ^ now[j].z ^ now[j].w;
  });
  if (x == 0x9e3779b9u) out[0] = x;
}

// The same reads through a ring of kDepth units in shared memory, filled by cp.async (16 KB a unit
// for the block's 256 lanes).
template <int kDepth>
__global__ void __launch_bounds__(kThreads) async_ring(const uint8_t* m, int64_t K, int S, uint32_t* out) {
  extern __shared__ __align__(16) uint4 slots[];  // [kDepth][4][kThreads]
  const LaneReads r(m, K, S);
  auto issue = [&](int d, int64_t u) {
    if (u < r.units)
#pragma unroll
      for (int j = 0; j < 4; ++j) dsv4::cuda::copy_async_16(&slots[(d * 4 + j) * kThreads + threadIdx.x], r.word(j, u), true);
    dsv4::cuda::commit_async_copies();  // (empty groups keep the count per unit uniform)
  };
  uint32_t x = 0;
  r.each_unit<kDepth>(issue, [&](int d, int64_t, int64_t refill) {
    dsv4::cuda::await_async_copies<kDepth - 1>();
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint4 v = slots[(d * 4 + j) * kThreads + threadIdx.x];
      x ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    issue(d, refill);
  });
  if (x == 0x9e3779b9u) out[0] = x;
}

// Contiguous shares through kStages stages of `stage` bytes of shared memory, one bulk copy each.
template <int kStages>
__global__ void __launch_bounds__(kThreads) bulk(const uint8_t* m, int64_t bytes, int stage, uint32_t* out) {
#if defined(DSV4_WGMMA)  // (the helpers exist in sm_90a device code)
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ uint64_t filled[kStages], emptied[kStages];
  const int64_t steps = bytes / gridDim.x / stage, share = steps * stage;  // (16-byte aligned shares)
  const uint8_t* src = m + int64_t(blockIdx.x) * share;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) dsv4::cuda::barrier_init(&filled[s], 1), dsv4::cuda::barrier_init(&emptied[s], kWarps);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  auto issue = [&](int64_t step) {
    uint64_t* b = &filled[step % kStages];
    dsv4::cuda::barrier_expect_bytes(b, uint32_t(stage));
    dsv4::cuda::copy_bulk(smem + (step % kStages) * stage, src + step * stage, uint32_t(stage), b);
  };
  if (threadIdx.x == 0)
    for (int64_t s = 0; s < kStages && s < steps; ++s) issue(s);
  uint32_t x = 0;
  for (int64_t step = 0; step < steps; ++step) {
    const int s = int(step % kStages);
    dsv4::cuda::barrier_wait(&filled[s], int((step / kStages) & 1));
    const uint4* v = reinterpret_cast<const uint4*>(smem + s * stage);
    for (int j = threadIdx.x; j < stage / 16; j += kThreads) x ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
    __syncwarp();
    if (threadIdx.x % 32 == 0) dsv4::cuda::barrier_arrive(&emptied[s]);
    if (threadIdx.x == 0 && step + kStages < steps) {
      dsv4::cuda::barrier_wait(&emptied[s], int((step / kStages) & 1));
      issue(step + kStages);
    }
  }
  if (x == 0x9e3779b9u) out[0] = x;
#endif
}

// Runs launch() three times after a warm-up and prints the best rate; returns the best time in µs
// (0 after an error).
template <class Launch>
double rate(const char* name, int64_t bytes, Launch launch) {
  cudaEvent_t a = nullptr, b = nullptr;
  bool ok = check(cudaEventCreate(&a), "event") && check(cudaEventCreate(&b), "event");
  if (ok) launch();
  float best = 1e30f;
  for (int r = 0; r < 3 && ok; ++r) {
    cudaEventRecord(a);
    launch();
    cudaEventRecord(b);
    ok = check(cudaEventSynchronize(b), name);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    best = ms < best ? ms : best;
  }
  for (cudaEvent_t e : {a, b})
    if (e) cudaEventDestroy(e);
  if (!ok) return 0;
  std::printf("%-36s %8.1f GB/s (%.1f us)\n", name, double(bytes) / (best * 1e-3) / 1e9, best * 1e3);
  return best * 1e3;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t mib = argc > 1 ? std::atoll(argv[1]) : 1024, K = argc > 2 ? std::atoll(argv[2]) : 1024;
  const int S = argc > 3 ? std::atoi(argv[3]) : 2;
  const int64_t bytes = mib << 20, rows = bytes / K / 16 * 16;
  int sms = 0;
  uint8_t* m = nullptr;
  uint32_t* out = nullptr;
  if (K % 1024 != 0 || (S != 1 && S != 2 && S != 4 && S != 8) || !check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "attribute") ||
      !check(cudaMalloc(&m, size_t(bytes)), "cudaMalloc") || !check(cudaMalloc(&out, 4), "cudaMalloc") ||
      !check(cudaMemset(m, 1, size_t(bytes)), "cudaMemset")) {
    std::fprintf(stderr, "usage: hbm_stream [MiB] [K bytes, a multiple of 1 024] [S: 1, 2, 4 or 8]\n");
    return 1;
  }
  std::printf("%lld MiB, rows of %lld bytes, %d warps a tile, %d SMs\n", (long long)mib, (long long)K, S, sms);
  const unsigned blocks = unsigned(rows / 16 / (kWarps / S));
  const int64_t matrix = int64_t(blocks) * (kWarps / S) * 16 * K;
  const double long_pass =
      rate("registers, depth 2 (tc_gemv)", matrix, [&] { registers<2><<<blocks, kThreads>>>(m, K, S, out, false); });
  bool ok = long_pass > 0 &&
            rate("registers, depth 1", matrix, [&] { registers<1><<<blocks, kThreads>>>(m, K, S, out, false); }) &&
            rate("registers, depth 4", matrix, [&] { registers<4><<<blocks, kThreads>>>(m, K, S, out, false); });
  auto async_depth = [&](auto kernel, int depth, const char* name) {
    const int smem = depth * 4 * 16 * kThreads;
    return check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "smem") &&
           rate(name, matrix, [&] { kernel<<<blocks, kThreads, smem>>>(m, K, S, out); });
  };
  ok = ok && async_depth(async_ring<2>, 2, "cp.async, depth 2") && async_depth(async_ring<4>, 4, "cp.async, depth 4") &&
       async_depth(async_ring<8>, 8, "cp.async, depth 8");
  for (int stage : {8192, 16384, 32768}) {
    if (!ok) break;
    char name[64];
    std::snprintf(name, sizeof name, "bulk, 4 stages of %d B", stage);
    const int smem = 4 * stage;
    ok = check(cudaFuncSetAttribute(bulk<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "smem") &&
         rate(name, bytes / sms / stage * stage * sms, [&] { bulk<4><<<sms, kThreads, smem>>>(m, bytes, stage, out); });
  }
  if (ok) {
    const int stage = 16384, smem = 8 * stage;
    ok = check(cudaFuncSetAttribute(bulk<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "smem") &&
         rate("bulk, 8 stages of 16384 B", bytes / sms / stage * stage * sms,
              [&] { bulk<8><<<sms, kThreads, smem>>>(m, bytes, stage, out); });
  }
  // The chains: windows of whole blocks' shares, read in order by consecutive launches.
  const int64_t block_bytes = int64_t(kWarps / S) * 16 * K;
  for (int64_t window_mib : {4, 32}) {
    const int64_t per_launch = std::max<int64_t>(1, (window_mib << 20) / block_bytes), n = blocks / per_launch;
    const int64_t window = per_launch * block_bytes;
    for (bool dependent : {true, false}) {
      if (!ok || n < 2) break;
      char name[64];
      std::snprintf(name, sizeof name, "chain of %lld of %.1f MiB, %s", (long long)n, double(window) / (1 << 20),
                    dependent ? "PDL" : "plain");
      bool launched = true;  // a failed launch leaves the events' time meaningless
      const double us = rate(name, n * window, [&] {
        using dsv4::cuda::Launch;
        for (int64_t i = 0; i < n; ++i) {
          const uint8_t* w = m + i * window;
          if (dependent) dsv4::cuda::launch(registers<2>, unsigned(per_launch), kThreads, 0, 0, w, K, S, out, true);
          else dsv4::cuda::launch<Launch::plain>(registers<2>, unsigned(per_launch), kThreads, 0, 0, w, K, S, out, true);
        }
        launched = check(cudaGetLastError(), "a chain's launches") && launched;
      });
      ok = us > 0 && launched;
      if (ok)
        std::printf("  %.2f us a launch, %.2f us of it more than its bytes at the long pass's rate\n", us / double(n),
                    (us - long_pass * double(n * window) / double(matrix)) / double(n));
    }
  }
  return ok ? 0 : 1;
}
