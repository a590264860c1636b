// Hopper's asynchronous tensor-core products (wgmma) and the shared-memory barriers (mbarrier),
// bulk copies and tensor-map copies that feed them: what deepseek-tc's experts
// (gemm_experts_tc.cu), dense FP8 products (gemm_fp8_tc.cu), indexer (indexer_fp4.cu) and attention
// (attention_tc.cu) kernels share. wgmma exists on sm_90a alone: DSV4_WGMMA is defined where it
// does, and elsewhere (the sm_80 PTX) those kernels are empty and never chosen (device_has_wgmma).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/device_math.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DSV4_WGMMA 1
#endif

namespace dsv4::cuda {

// Whether the current device runs sm_90a code (wgmma).
inline bool device_has_wgmma() {
  static const bool has = [] {
    int device = 0, major = 0, minor = 0;
    return cudaGetDevice(&device) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
           cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess && major == 9 &&
           minor == 0;
  }();
  return has;
}

// The 128-byte swizzle's period: its operands start at multiples of 1024 bytes of shared memory,
// so a kernel asks for kSwizzlePeriod bytes more dynamic shared memory than it lays out and starts
// its layout at at_swizzle_period(the dynamic base).
constexpr int kSwizzlePeriod = 1024;
__device__ __forceinline__ unsigned char* at_swizzle_period(unsigned char* smem) {
  return smem + (kSwizzlePeriod - shared_address(smem) % kSwizzlePeriod) % kSwizzlePeriod;
}

// Byte offset of 16-byte chunk c of row r in a tile of 128-byte rows, as wgmma's 128-byte swizzle
// reads it: the chunks of each row permuted by the row's index mod 8.
__device__ __forceinline__ int swizzled(int r, int c) { return r * 128 + 16 * (c ^ (r & 7)); }

// The promotion of an m64nN product whose N are token rows (the FP8 products of gemm_experts_tc.cu,
// N = 64): a thread's part[4j + e] is its weight row lr (+ 8 for e ≥ 2) against token
// 8j + 2 lc + e % 2 (lr = lane / 4, lc = lane % 4), and one 128-block of K's partial is added to
// acc times its token's scale. A K block's N token scales sit in shared memory
// at scale_place<N>(token) of block_scales<N> floats, so lane lc reads its N / 4 as float4 loads:
// tokens 8j + 2c + e at c · scale_group<N> + 2j + e (the groups padded so the four c lie on
// different banks).
template <int kN>
constexpr int scale_group = kN / 4 + 4;
template <int kN>
constexpr int block_scales = 4 * scale_group<kN>;
template <int kN>
__host__ __device__ constexpr int scale_place(int token) {
  return token % 8 / 2 * scale_group<kN> + 2 * (token / 8) + token % 2;
}

// acc += scale(s(token)) · part, element by element, s from a K block's scales as laid out above
// (read four at a time, so few registers hold them). scale(s) multiplies in any factor common to
// the block (a power of two: the order of the products does not matter).
template <int kP, class Scale>
__device__ __forceinline__ void promote(float (&acc)[kP], const float (&part)[kP], const float* scales, int lc,
                                        Scale scale) {
  const float4* from = reinterpret_cast<const float4*>(scales + lc * scale_group<2 * kP>);
#pragma unroll
  for (int i = 0; i < kP / 8; ++i) {  // float4 i: tokens of j = 2i and 2i + 1, e % 2 = 0 and 1
    const float4 v = from[i];
    const float s[4] = {scale(v.x), scale(v.y), scale(v.z), scale(v.w)};
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[8 * i + e] = fmaf(s[2 * (e / 4) + e % 2], part[8 * i + e], acc[8 * i + e]);
  }
}

#ifdef DSV4_WGMMA
// A shared-memory operand under the 128-byte swizzle (from a 1024-byte boundary), its 8-row groups
// 1024 bytes apart; lbo is the leading byte offset (unused by K-major operands: 16).
__device__ __forceinline__ uint64_t swizzled_descriptor(const void* tile, uint32_t lbo) {
  const uint32_t at = shared_address(tile);
  return uint64_t((at & 0x3FFFF) >> 4) | uint64_t(lbo >> 4) << 16 | uint64_t(1024 >> 4) << 32 | uint64_t(1) << 62;
}

// A K-major operand tile of 128-byte rows. Adding 2 moves it 32 bytes on along K.
__device__ __forceinline__ uint64_t tile_descriptor(const void* tile) { return swizzled_descriptor(tile, 16); }

// An N-major B operand (wgmma's transposed B, 16-bit values): a K row's first 64 values of N in
// one 128-byte row, K rows 128 bytes apart, and the next 64 values of N `n_block_bytes` on. The
// same bytes as a K-major tile of 128-byte rows, read the other way (attention_tc.cu: a row's dims
// are K of the logits, N of the values). Adding 128 moves it 16 K rows (one k16 step) on.
__device__ __forceinline__ uint64_t n_major_descriptor(const void* tile, uint32_t n_block_bytes) {
  return swizzled_descriptor(tile, n_block_bytes);
}

// The products' register hand-over: before a wgmma, every earlier access of its accumulators is
// done; the issued products are committed as one group; after waiting until at most kPending later
// groups are in flight, reads of an earlier group's accumulators come after the wait (the empty asm
// ties each register to it). wgmma_finish waits for every group.
__device__ __forceinline__ void wgmma_begin() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int kPending, int N>
__device__ __forceinline__ void wgmma_wait(float (&d)[N]) {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int kPending, int N>
__device__ __forceinline__ void wgmma_wait(int (&d)[N]) {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(d[i])::"memory");
}
template <class D>
__device__ __forceinline__ void wgmma_finish(D& d) {
  wgmma_wait<0>(d);
}
// Shared memory written by this thread (stores, or cp.async copies it has awaited) is ordered before
// the tensor cores' reads of it that a following barrier lets start.
__device__ __forceinline__ void fence_for_tensor_cores() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// A barrier in shared memory (mbarrier) that completes a phase once `count` arrivals have come (and,
// with expect_bytes, those bytes of bulk copies); arriving releases this thread's earlier accesses
// of shared memory, and a wait for a phase acquires those of every arrival in it. Phases alternate
// in parity, from 0.
__device__ __forceinline__ void barrier_init(uint64_t* b, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void barrier_arrive(uint64_t* b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(shared_address(b)) : "memory");
}
// An arrival that also makes the phase wait for `bytes` more of bulk copies (copy_bulk).
__device__ __forceinline__ void barrier_expect_bytes(uint64_t* b, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(b)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void barrier_wait(uint64_t* b, int parity) {
  uint32_t done = 0;
  while (!done)
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(shared_address(b)), "r"(parity)
        : "memory");
}

// The producer's side of a ring of kStages shared-memory stages fed by cp.async (the experts' FP8
// kernel, gemm_experts_tc.cu): issue(step) copies step's operands into stage
// step % kStages, kStages − 1 steps ahead; fill(n) copies those of the first n steps (n < kStages, in
// any order: they land as one group). This thread arrives at a stage's `filled` barrier once its
// copies of the step have landed, and refills a stage once its `emptied` barrier says the consumers
// are done with it.
template <int kStages, class Fill, class Issue>
__device__ __forceinline__ void produce_ring(int64_t steps, uint64_t* filled, uint64_t* emptied, Fill fill, Issue issue) {
  constexpr int kAhead = kStages - 1;
  fill(int(steps < kAhead ? steps : kAhead));
  for (int step = 0; step < kAhead; ++step) commit_async_copies();  // (empty groups keep the count per step uniform)
  for (int64_t step = 0; step < steps; ++step) {
    await_async_copies<kAhead - 1>();  // this step's copies, this thread's
    fence_for_tensor_cores();
    barrier_arrive(&filled[step % kStages]);
    const int64_t next = step + kAhead;  // into the stage step next − kStages used, once it is emptied
    if (next < steps) {
      if (next >= kStages) barrier_wait(&emptied[next % kStages], int((next / kStages - 1) & 1));
      issue(next);
    }
    commit_async_copies();
  }
}

// `bytes` (a multiple of 16, both addresses 16-byte aligned) from global to shared memory by the
// copy engine (one thread issues it), counted on barrier b's current phase.
__device__ __forceinline__ void copy_bulk(void* dst, const void* src, uint32_t bytes, uint64_t* b) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   shared_address(dst)),
               "l"(src), "r"(bytes), "r"(shared_address(b))
               : "memory");
}

// The box of a tensor map (tensor_map.h) at element coordinates (inner, outer) from global to
// shared memory by the tensor memory accelerator (one thread issues it), counted on barrier b's
// current phase: all of the box's bytes, its rows past the array being zeros. The map is a kernel
// parameter (__grid_constant__), addressed generically.
__device__ __forceinline__ void copy_tile(void* dst, const void* map, int inner, int outer, uint64_t* b) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%2, %3}], [%4];" ::"r"(shared_address(dst)),
      "l"(map), "r"(inner), "r"(outer), "r"(shared_address(b))
      : "memory");
}

// An arrival on barrier b once this thread's cp.async copies issued so far have landed, without
// raising the phase's count: b's count must include one for each thread that does this.
__device__ __forceinline__ void barrier_arrive_on_copies(uint64_t* b) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(shared_address(b)) : "memory");
}
#endif

}  // namespace dsv4::cuda
