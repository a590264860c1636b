// deepseek-tc's routed FP4 experts on the FP8 tensor cores (gemm_experts_tc.h), Hopper's wgmma.
//
// The rows are grouped by expert (row_grouping.cuh, tiles of 128) and each block takes 128 rows of
// one expert against 128 of its output rows, so an expert's weights are read once per 128 tokens,
// as stored (FP4 nibbles and their E8M0 1×32 scales). The activations are act_quant's e4m3 codes
// (QuantizedForm::codes) with their 1×128 scales. The weights become e5m2 in shared memory, exact:
// an e2m1 value times 2^t is an e5m2 value for every t in [−13, 13] (e5m2 spans 2^-14 … 57 344 with
// normals, and e2m1 has one mantissa bit to e5m2's two). So each weight row takes one common
// exponent R (its largest 1×32 scale over K, less 13) and each of its 32-blocks becomes e2m1 · 2^t
// with t = its scale − R; a block more than 2^26 below the row's largest is dropped (its products
// are below 2^-26 of the row's others: the approximation this numerics allows). The tensor cores
// then multiply e4m3 by e5m2 exactly and accumulate over one 128-block of K (four wgmma k32 steps,
// in their own reduced-precision fp32), and the partial is scaled by the row's activation scale
// and added to an fp32 accumulator on the CUDA cores, one 128-block at a time (the official
// kernels' promotion, architecture.md §5); the result times 2^R is rounded to bf16.
//
// The work is split by warpgroup, and the warpgroups meet only at barriers in shared memory (one
// per stage that fills, one that empties), so each runs at its own pace. The producers (warpgroups
// 0 and 1: two threads per weight row, a half of each K block each) copy each K block's
// activations (16 KB, 128-byte rows swizzled as wgmma reads them), raw weight bytes (8 KB) and
// activation scales to shared memory kStages − 1 blocks ahead (cp.async), then turn the weights
// into e5m2 in the stage's B (byte permutes from a table per 32-block, 11 instructions per 8
// weights). The two consumers (warpgroups 2 and 3, 64 token rows each) multiply on the tensor
// cores and promote; while one promotes, the other's products run. A consumer whose rows are all
// empty (a short tile) does nothing. The producers' latency bounds the kernel, so they are two
// warpgroups, and the registers are moved to the consumers, which hold two accumulators.
#include <cuda_runtime.h>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/gemm_experts_tc.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/row_grouping.cuh"
#include "backend/cuda/weight_access.cuh"

// wgmma exists on sm_90a alone; elsewhere (the sm_80 PTX) the kernel is empty and never chosen.
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DSV4_WGMMA 1
#endif

namespace dsv4::cuda {

namespace {

constexpr int kBM = 128, kBN = 128, kBK = 128, kStages = 4;
constexpr int kProducers = 256, kConsumers = 256, kThreads = kProducers + kConsumers;
// Registers per thread of each role once the roles split (setmaxnreg): together the register file.
constexpr int kProducerRegisters = 64, kConsumerRegisters = 192;
static_assert(kProducers * kProducerRegisters + kConsumers * kConsumerRegisters == 65536, "the register file");
constexpr int kSubBlocks = kBK / 32;  // FP4 scale blocks per K block
constexpr int kTopShift = 13;         // 6 · 2^13 is below e5m2's largest, 57 344; 0.5 · 2^-13 its smallest normal
constexpr int kABytes = kBM * kBK, kBBytes = kBN * kBK, kRawBytes = kBN * kBK / 2;
// Shared memory from a 1024-byte boundary (the swizzle's period): the stages' activations, e5m2
// weights, raw weights and activation scales, then per output row its scales (by block,
// [K/32][kBN]) and its 2^R.
constexpr size_t kAOff = 0, kBOff = kAOff + size_t(kStages) * kABytes, kRawOff = kBOff + size_t(kStages) * kBBytes,
                 kSxOff = kRawOff + size_t(kStages) * kRawBytes, kRowScaleOff = kSxOff + size_t(kStages) * kBM * 4,
                 kScalesOff = kRowScaleOff + kBN * 4;
size_t smem_bytes(int64_t K) { return 1024 + kScalesOff + size_t((K + 31) / 32) * kBN; }

// Byte offset of 16-byte chunk c of row r in a tile of 128-byte rows, as wgmma's 128-byte swizzle
// reads it: the chunks of each row permuted by the row's index mod 8.
__device__ __forceinline__ int swizzled(int r, int c) { return r * 128 + 16 * (c ^ (r & 7)); }
// Where chunk c of raw weight row r sits in its 64 bytes: the 8 rows a quarter-warp reads at once
// land on distinct banks.
__device__ __forceinline__ int raw_chunk(int r, int c) { return r * 64 + 16 * (c ^ ((r >> 1) & 3)); }

__device__ __forceinline__ uint32_t permute(uint32_t a, uint32_t b, uint32_t selector) {
  uint32_t d;  // prmt's own semantics: a selector nibble's top bit replicates the picked byte's sign
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(selector));
  return d;
}

// The e5m2 codes of the e2m1 magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 times 2^t, by byte (codes 0–3,
// 4–7): exponents shifted by t, zero stays zero; all zeros for t below −kTopShift (dropped).
__device__ __forceinline__ uint2 e5m2_table(int t) {
  if (t < -kTopShift) return make_uint2(0, 0);
  return make_uint2(0x3E3C3800u + uint32_t(t) * 0x04040400u, 0x46444240u + uint32_t(t) * 0x04040404u);
}

// Eight e2m1 codes (the first in the low nibble) as eight e5m2 bytes by `table`.
__device__ __forceinline__ uint2 e2m1x8_e5m2(uint32_t w, uint2 table) {
  const uint32_t magnitude = w & 0x77777777u;
  const uint32_t lo = permute(table.x, table.y, magnitude), hi = permute(table.x, table.y, magnitude >> 16);
  // 0x01 per positive code, 0x00 per negative one (its selector's top bit replicates 0x01's sign)
  const uint32_t lo_pos = permute(0x01010101u, 0x01010101u, w), hi_pos = permute(0x01010101u, 0x01010101u, w >> 16);
  return make_uint2(lo | (~(lo_pos << 7) & 0x80808080u), hi | (~(hi_pos << 7) & 0x80808080u));
}

#ifdef DSV4_WGMMA
// A K-major operand tile of 128-byte rows under the 128-byte swizzle: 8-row groups 1024 bytes apart.
__device__ __forceinline__ uint64_t tile_descriptor(const void* tile) {
  const uint32_t at = shared_address(tile);
  return uint64_t((at & 0x3FFFF) >> 4) | uint64_t(1) << 16 | uint64_t(1024 >> 4) << 32 | uint64_t(1) << 62;
}

// d (+)= A · Bᵀ over 32 of K: A 64 rows of e4m3, B 128 rows of e5m2; d = A · Bᵀ when !accumulate.
template <bool kAccumulate>
__device__ __forceinline__ void wgmma_k32(float (&d)[64], uint64_t a, uint64_t b) {
#define DSV4_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e5m2 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
      "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, "
      "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1;\n}\n"
      : DSV4_D8(0), DSV4_D8(8), DSV4_D8(16), DSV4_D8(24), DSV4_D8(32), DSV4_D8(40), DSV4_D8(48), DSV4_D8(56)
      : "l"(a), "l"(b), "n"(kAccumulate ? 1 : 0));
#undef DSV4_D8
}

// The products' register hand-over: before a wgmma, every earlier access of its accumulators is
// done; the issued products are committed as one group; after waiting for it, reads of the
// accumulators come after the wait (the empty asm ties each register to it).
__device__ __forceinline__ void wgmma_begin() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_finish(float (&d)[64]) {
  asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#pragma unroll
  for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// Shared memory written by this thread (stores, or cp.async copies it has awaited) is ordered before
// the tensor cores' reads of it that a following barrier lets start.
__device__ __forceinline__ void fence_for_tensor_cores() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// A barrier in shared memory (mbarrier) that completes a phase once `count` arrivals have come;
// arriving releases this thread's earlier accesses of shared memory, and a wait for a phase
// acquires those of every arrival in it. Phases alternate in parity, from 0.
__device__ __forceinline__ void barrier_init(uint64_t* b, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(shared_address(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void barrier_arrive(uint64_t* b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(shared_address(b)) : "memory");
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
#endif

// x: the activations' e4m3 codes, rows of K; sx: their scales [K/128][source rows].
__global__ void __launch_bounds__(kThreads, 1)
    experts_fp8_kernel(GemmRequest p, const uint8_t* x, const float* sx, Grouping g) {
#ifdef DSV4_WGMMA
  await_previous_kernel();
  extern __shared__ unsigned char smem_base[];
  const uint32_t base = shared_address(smem_base);
  unsigned char* smem = smem_base + (1024 - base % 1024) % 1024;
  float* sx_s = reinterpret_cast<float*>(smem + kSxOff);        // [kStages][kBM]
  float* row_scale = reinterpret_cast<float*>(smem + kRowScaleOff);  // [kBN]: 2^R of each output row
  uint8_t* scales = smem + kScalesOff;                           // [K/32][kBN]: E8M0 bytes
  __shared__ int64_t src_of[kBM], out_of[kBM];
  __shared__ int row_shift[2][kBN];  // each half's largest scale byte, then R's byte
  __shared__ uint64_t filled[kStages], emptied[kStages];
  LinearView W;
  if (!tile_rows<kBM>(p, g, kBN, src_of, out_of, W)) return;
  const int64_t n0 = int64_t(blockIdx.x) * kBN, K = p.W.in, n_src = (p.T + p.x_div - 1) / p.x_div;
  const int n_kb = int((K + kBK - 1) / kBK), n_sub = int(K / 32);
  const int tid = threadIdx.x, lane = tid % 32;
  const int consumers = src_of[64] >= 0 ? 2 : 1;  // rows fill a tile from its start

  // Thread (row tid % kBN, half tid / kBN), below 2 kBN, reads that half of the row's scale bytes
  // (by words when the rows allow) and keeps their largest; R is the larger half's, less kTopShift.
  if (tid < 2 * kBN) {
    const int r = tid % kBN, half = tid / kBN;
    const int64_t n = n0 + r;
    const uint8_t* row = scale_row<kFp4>(W, n < p.rows ? p.row0 + n : 0);
    int top = 0;
    if (W.scale_cols % 4 == 0 && n_sub % 8 == 0) {  // whole words (device scales start 256-byte aligned)
      const uint32_t* words = reinterpret_cast<const uint32_t*>(row) + half * (n_sub / 8);
      constexpr int kBatch = 8;  // loads in flight at once
      for (int w0 = 0; w0 < n_sub / 8; w0 += kBatch) {
        uint32_t v[kBatch];
#pragma unroll
        for (int i = 0; i < kBatch; ++i) v[i] = n < p.rows && w0 + i < n_sub / 8 ? words[w0 + i] : 0u;
#pragma unroll
        for (int i = 0; i < kBatch; ++i)
#pragma unroll
          for (int b = 0; b < 4; ++b) {
            const int j = 4 * (half * (n_sub / 8) + w0 + i) + b, s = int(v[i] >> (8 * b) & 0xFF);
            if (w0 + i < n_sub / 8) scales[j * kBN + r] = uint8_t(s), top = max(top, s);
          }
      }
    } else {
      for (int j = half; j < n_sub; j += 2) {
        const int s = n < p.rows && j < W.scale_cols ? row[j] : 0;
        scales[j * kBN + r] = uint8_t(s);
        top = max(top, s);
      }
    }
    row_shift[half][r] = top;
  }
  if (tid == 0)
    for (int s = 0; s < kStages; ++s) barrier_init(&filled[s], kProducers), barrier_init(&emptied[s], 4 * consumers);
  __syncthreads();
  if (tid < kBN) {
    const int R = max(row_shift[0][tid], row_shift[1][tid]) - kTopShift;
    row_shift[0][tid] = R;
    row_scale[tid] = ldexpf(1.0f, R - 127);
  }
  __syncthreads();

  if (tid < kProducers) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kProducerRegisters));
    // Producer thread tid: half h = tid / kBN of weight row r = tid % kBN (its raw bytes and their
    // e5m2: 32-blocks 2h, 2h + 1 of each K block), chunk tid % 8 of activation rows tid / 8 + 32i,
    // and in the first half activation row r's scale.
    const int r = tid % kBN, h = tid / kBN, R = row_shift[0][r];
    const bool row_ok = n0 + r < p.rows;
    const uint8_t* weights = W.data + (row_ok ? (p.row0 + n0 + r) * (K / 2) : 0);
    // Where in x the activation rows it copies start (their chunk tid % 8), −1 for none: read
    // from shared memory once, not per block.
    constexpr int kCopies = kBM * 8 / kProducers;  // 16-byte activation chunks per thread and block
    const int chunk = tid % 8;
    int64_t a_at[kCopies];
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      const int64_t src = src_of[tid / 8 + (kProducers / 8) * i];
      a_at[i] = src >= 0 ? src * K + 16 * chunk : -1;
    }
    const int64_t sx_src = src_of[r];
    auto issue = [&](int kb) {
      const int slot = kb % kStages;
      const int64_t k0 = int64_t(kb) * kBK;
      unsigned char* A = smem + kAOff + slot * kABytes;
      const bool chunk_in = k0 + 16 * chunk < K;
#pragma unroll
      for (int i = 0; i < kCopies; ++i) {
        const bool ok = a_at[i] >= 0 && chunk_in;
        copy_async_16(A + swizzled(tid / 8 + (kProducers / 8) * i, chunk), x + (ok ? a_at[i] + k0 : 0), ok);
      }
      unsigned char* raw = smem + kRawOff + slot * kRawBytes;
#pragma unroll
      for (int c = 2 * h; c < 2 * h + 2; ++c) {
        const int64_t k = k0 + 32 * c;
        const bool ok = row_ok && k < K;
        copy_async_16(raw + raw_chunk(r, c), weights + (ok ? k / 2 : 0), ok);
      }
      if (h == 1) return;  // the first half copies the activation scales
      float* to = sx_s + slot * kBM + r;
      if (sx_src >= 0) copy_async_small<4>(to, sx + int64_t(kb) * n_src + sx_src);
      else *to = 0.0f;
    };
    // All of the block's raw words and scales first: the loads need not wait for the stores.
    auto convert = [&](int kb) {
      const int slot = kb % kStages;
      const unsigned char* raw = smem + kRawOff + slot * kRawBytes;
      unsigned char* B = smem + kBOff + slot * kBBytes;
      uint4 w[2];
      int t[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int c = 2 * h + i, j = kb * kSubBlocks + c;
        w[i] = *reinterpret_cast<const uint4*>(raw + raw_chunk(r, c));
        t[i] = j < n_sub ? int(scales[j * kBN + r]) - R : -kTopShift - 1;
      }
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int c = 2 * h + i;
        const uint2 table = e5m2_table(t[i]);
        const uint2 a = e2m1x8_e5m2(w[i].x, table), b = e2m1x8_e5m2(w[i].y, table),
                    e = e2m1x8_e5m2(w[i].z, table), f = e2m1x8_e5m2(w[i].w, table);
        *reinterpret_cast<uint4*>(B + swizzled(r, 2 * c)) = make_uint4(a.x, a.y, b.x, b.y);
        *reinterpret_cast<uint4*>(B + swizzled(r, 2 * c + 1)) = make_uint4(e.x, e.y, f.x, f.y);
      }
    };
    constexpr int kAhead = kStages - 1;
    for (int kb = 0; kb < kAhead; ++kb) {
      if (kb < n_kb) issue(kb);
      commit_async_copies();  // (empty groups keep the count per block uniform)
    }
    for (int kb = 0; kb < n_kb; ++kb) {
      await_async_copies<kAhead - 1>();  // block kb's copies, this thread's
      convert(kb);
      fence_for_tensor_cores();
      barrier_arrive(&filled[kb % kStages]);
      const int next = kb + kAhead;  // into the stage block next − kStages used, once it is emptied
      if (next < n_kb) {
        if (next >= kStages) barrier_wait(&emptied[next % kStages], (next / kStages - 1) & 1);
        issue(next);
      }
      commit_async_copies();
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kConsumerRegisters));
  const int wg = (tid - kProducers) / 128;
  if (wg >= consumers) return;
  const int row0 = 64 * wg + 16 * ((tid % 128) / 32) + lane / 4;  // this thread's rows: row0, row0 + 8
  float acc[64] = {}, part[64];
  for (int kb = 0; kb < n_kb; ++kb) {
    const int slot = kb % kStages;
    barrier_wait(&filled[slot], (kb / kStages) & 1);
    const uint64_t a = tile_descriptor(smem + kAOff + slot * kABytes + 64 * wg * 128),
                   b = tile_descriptor(smem + kBOff + slot * kBBytes);
    wgmma_begin();
    wgmma_k32<false>(part, a, b);
#pragma unroll
    for (int q = 1; q < kBK / 32; ++q) wgmma_k32<true>(part, a + 2 * q, b + 2 * q);  // 32 bytes on, in 16s
    wgmma_commit();
    wgmma_finish(part);
    const float s0 = sx_s[slot * kBM + row0], s1 = sx_s[slot * kBM + row0 + 8];
    __syncwarp();
    if (lane == 0) barrier_arrive(&emptied[slot]);  // the warp is done with the stage
#pragma unroll
    for (int i = 0; i < 64; i += 4) {
      acc[i] = fmaf(s0, part[i], acc[i]), acc[i + 1] = fmaf(s0, part[i + 1], acc[i + 1]);
      acc[i + 2] = fmaf(s1, part[i + 2], acc[i + 2]), acc[i + 3] = fmaf(s1, part[i + 3], acc[i + 3]);
    }
  }
  // acc[4j + e]: row row0 (+8 for e ≥ 2), column 8j + 2·(lane % 4) (+1 for odd e).
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    const int64_t m = out_of[row0 + (i % 4 >= 2 ? 8 : 0)];
    const int col = 8 * (i / 4) + 2 * (lane % 4) + (i % 2);
    if (m >= 0 && n0 + col < p.rows) p.y[m * p.y_stride + n0 + col] = round_bf16(acc[i] * row_scale[col]);
  }
#endif
}

bool device_has_wgmma() {
  static const bool has = [] {
    int device = 0, major = 0, minor = 0;
    return cudaGetDevice(&device) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
           cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess && major == 9 &&
           minor == 0;
  }();
  return has;
}

}  // namespace

bool fits_tensor_core_experts(const GemmRequest& r) {
  return r.table && r.W.format == kFp4 && !r.W.scale_is_f32 && r.W.in % 32 == 0 &&
         smem_bytes(r.W.in) <= 227 * 1024 && device_has_wgmma();
}

void CudaBackend::tensor_core_experts(const GemmRequest& r, const uint8_t* x, const float* sx, int32_t* scratch) {
  DSV4_CUDA_REQUIRE(fits_tensor_core_experts(r), "tensor-core experts: K ", r.W.in,
                    " must be a multiple of 32, the scales E8M0 and the device a Hopper (sm_90a)");
  if (r.T == 0 || r.rows == 0) return;
  Grouping g{};
  group_rows(r, scratch, g, stream_, kBM);
  const dim3 grid{unsigned((r.rows + kBN - 1) / kBN), unsigned(row_tile_count(r, kBM))};
  const size_t smem = smem_bytes(r.W.in);
  allow_shared_memory(reinterpret_cast<const void*>(experts_fp8_kernel), smem, "tensor-core experts");
  launch(experts_fp8_kernel, grid, kThreads, smem, stream_, r, x, sx, g);
  DSV4_CUDA_LAUNCHED("linear (experts on the FP8 tensor cores)");
}

}  // namespace dsv4::cuda
