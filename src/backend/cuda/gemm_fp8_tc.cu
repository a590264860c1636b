// deepseek-tc's dense FP8 products of many token rows on the FP8 tensor cores (gemm_tc.h), Hopper's
// wgmma: y[t, n] = bf16(Σ_kb sx[kb, t] · sw[n / 128, kb] · Σ_{k in kb} x[t, k] · W[row0 + n, k]).
//
// The operands are the exact path's: the activations' e4m3 codes from act_quant
// (QuantizedForm::codes, scales [K/128][T]) and the checkpoint's FP8 weights with their 128×128
// E8M0 block scales. The tensor cores multiply e4m3 by e4m3 exactly and accumulate one 128-block
// of K (four k32 steps) in their own reduced-precision fp32; the partial is then scaled by the
// token's and the weight block's scales and added to an fp32 accumulator on the CUDA cores (the
// official kernels' promotion, architecture.md §5), and the sum is rounded to bf16. The scales are
// powers of two, so the order of the two multiplications does not matter. cuBLASLt's block-scaled
// kernels compute the same thing; this kernel takes the products where it measured faster and the
// token counts cuBLASLt cannot take (kShortK below), and cuBLASLt the rest and every product on
// devices without wgmma.
//
// A block takes 128 weight rows (one scale block: wgmma's A, from shared memory, 64 rows per
// consumer warpgroup) against 128 token rows (B, from shared memory), the two K-major tiles of
// 128-byte rows in wgmma's 128-byte swizzle. The grid is one block per SM, each taking tile after
// tile. The producer warpgroup copies each K block's two tiles (16 KB each) and its 128 token
// scales kStages − 1 blocks ahead (cp.async), across tiles; the two consumers multiply, then
// promote, and while one promotes the other's products run. (Halves of 64 tokens, one promoted
// while the other's products run, would read the weight tile from shared memory twice: at
// m64n64k32 the two operands take 128 bytes a cycle, all that shared memory gives, beside the
// producer's copies.) The producer's instructions per K block had outnumbered a consumer's (≈ 440
// against 230 in the SASS: each copy's tile, row and bounds found anew), so a tile's rows are now
// found once, at its first block (≈ 140). The stages meet the consumers at barriers in shared
// memory, one that fills and one that empties each stage, as in gemm_experts_tc.cu.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/gemm_tc.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/weight_access.cuh"
#include "backend/cuda/wgmma.cuh"

namespace dsv4::cuda {

namespace {

constexpr int kBM = 128, kBN = 128, kBK = 128, kStages = 6;  // weight rows, token rows, K per block
// Where the kernel runs rather than cuBLASLt (uses_tensor_core_fp8): products of K ≤ kShortK, where
// it measured faster (one H100, 8K prefill, per call: wq_b with K 1 024, 1 259 against 1 538 µs; the
// indexer's wq_b 350 against 413), and token counts cuBLASLt has no algorithm for (not a multiple of
// 4: those ran on the exact FP64 kernels). With longer K cuBLASLt's kernels are faster (wo_b, K 8 192:
// 748 against 1 147 µs; wq_a, K 4 096: 191 against 257): 128 × 128 tiles fed by cp.async move
// twice the L2 bytes per product of theirs, and the kernel then waits on L2 (≈ 3.7 TB/s at wo_b).
constexpr int64_t kShortK = 1024;
constexpr int kBandTiles = 8;  // weight row tiles per band of the tile order (see the kernel)
constexpr int kProducers = 128, kConsumers = 256, kThreads = kProducers + kConsumers;
// Registers per thread of each role once the roles split (setmaxnreg): together what the block is
// given at launch, 168 a thread (__launch_bounds__ with one block per SM).
constexpr int kProducerRegisters = 88, kConsumerRegisters = 208;
static_assert(kProducers * kProducerRegisters + kConsumers * kConsumerRegisters == kThreads * 168, "the block's registers");
static_assert(kProducers == kBN, "a producer thread copies one token's scale");
// A stage: the weight tile, the token tile, the token scales (block_scales<kBN> floats), from a
// swizzle period.
constexpr int kTileBytes = kBM * kBK, kStageBytes = 2 * kTileBytes + block_scales<kBN> * 4;
constexpr int kStageStride = (kStageBytes + kSwizzlePeriod - 1) / kSwizzlePeriod * kSwizzlePeriod;
constexpr size_t kSmemBytes = kSwizzlePeriod + size_t(kStages) * kStageStride;

#ifdef DSV4_WGMMA
// d (+)= A · Bᵀ over 32 of K: A 64 weight rows, B 128 token rows, both e4m3 in shared memory;
// d = A · Bᵀ when !accumulate.
template <bool kAccumulate>
__device__ __forceinline__ void wgmma_k32(float (&d)[64], uint64_t a, uint64_t b) {
#define DSV4_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
      "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, "
      "%44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "%64, %65, p, 1, 1;\n}\n"
      : DSV4_D8(0), DSV4_D8(8), DSV4_D8(16), DSV4_D8(24), DSV4_D8(32), DSV4_D8(40), DSV4_D8(48), DSV4_D8(56)
      : "l"(a), "l"(b), "n"(kAccumulate ? 1 : 0));
#undef DSV4_D8
}
#endif

// x: the token rows' e4m3 codes [T][K]; sx: their scales [K/128][T]. Persistent: block b takes
// tiles b, b + gridDim.x, … (in the band order below), and its K blocks run through the ring as one
// sequence, so the producer fills the next tile's first stages while the consumers finish this one.
__global__ void __launch_bounds__(kThreads, 1) fp8_gemm_kernel(GemmRequest p, const uint8_t* x, const float* sx) {
#ifdef DSV4_WGMMA
  await_previous_kernel();
  extern __shared__ unsigned char smem_base[];
  unsigned char* smem = at_swizzle_period(smem_base);
  __shared__ uint64_t filled[kStages], emptied[kStages];
  const LinearView& W = p.W;
  const int64_t K = W.in, T = p.T, row_tiles = (p.rows + kBM - 1) / kBM, tiles = row_tiles * ((T + kBN - 1) / kBN);
  const int n_kb = int(K / kBK), tid = threadIdx.x, lane = tid % 32;
  const int64_t my_tiles = int64_t(blockIdx.x) < tiles ? (tiles - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
  const int64_t steps = my_tiles * n_kb;  // this block's K blocks, tile after tile
  // The first weight row and token row of this block's i-th tile. The tiles go in bands of
  // kBandTiles weight row tiles, each band over all token tiles (its row tiles fastest): the blocks
  // at work at once share a band's weights and a few token tiles, so each operand comes from L2
  // while the band lasts and from memory about once per band.
  const int64_t token_tiles = tiles / row_tiles;
  auto tile_at = [&](int64_t i, bool row) {
    const int64_t tile = int64_t(blockIdx.x) + i * gridDim.x, band_size = kBandTiles * token_tiles;
    const int64_t band = tile / band_size, in_band = tile % band_size;
    const int64_t band_rows = min(int64_t(kBandTiles), row_tiles - band * kBandTiles);
    return row ? (band * kBandTiles + in_band % band_rows) * kBM : in_band / band_rows * kBN;
  };
  auto row_of = [&](int64_t i) { return tile_at(i, true); };
  auto token_of = [&](int64_t i) { return tile_at(i, false); };
  auto weights_of = [&](int slot) { return smem + slot * kStageStride; };
  auto tokens_of = [&](int slot) { return smem + slot * kStageStride + kTileBytes; };
  auto scales_of = [&](int slot) { return reinterpret_cast<float*>(smem + slot * kStageStride + 2 * kTileBytes); };
  if (tid == 0)
    for (int s = 0; s < kStages; ++s) barrier_init(&filled[s], kProducers), barrier_init(&emptied[s], kConsumers / 32);
  __syncthreads();

  if (tid < kProducers) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kProducerRegisters));
    // Producer thread tid: 16-byte chunk tid % 8 of weight and token rows tid / 8 + 16i (a warp
    // reads whole 128-byte rows; row tid / 8 + 16i's chunk lands 2 048 i bytes after row tid / 8's,
    // keeping its swizzle), and token tid's scale. The steps come in order, so a tile's rows are
    // found once, at its first K block, and kept in registers. A row past the matrix is zeros; its
    // address is not read.
    const int chunk = tid % 8;
    const uint32_t to = shared_address(smem) + swizzled(tid / 8, chunk);
    const uint32_t scale_to = shared_address(scales_of(0) + scale_place<kBN>(tid));
    constexpr int kRows = kBM / 16;  // of each operand per thread
    const uint8_t *w_at[kRows], *x_at[kRows];  // the tile's rows, at chunk
    bool w_in[kRows], x_in[kRows];             // whether they are the matrix's
    const float* token_scales = sx;            // the tile's token tid, K block 0
    bool scale_in = false;
    int kb = 0, slot = 0;
    auto issue = [&](int64_t step) {
      if (kb == 0) {
        const int64_t tile = step / n_kb, n0 = row_of(tile), t0 = token_of(tile);
#pragma unroll
        for (int i = 0; i < kRows; ++i) {
          const int64_t row = tid / 8 + 16 * i;
          w_at[i] = W.data + (p.row0 + n0 + row) * K + 16 * chunk, w_in[i] = n0 + row < p.rows;
          x_at[i] = x + (t0 + row) * K + 16 * chunk, x_in[i] = t0 + row < T;
        }
        scale_in = t0 + tid < T, token_scales = sx + (t0 + tid);
      }
      const uint32_t w_to = to + slot * kStageStride, x_to = w_to + kTileBytes, k0 = kb * kBK;
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        copy_async_16(w_to + 2048 * i, w_at[i] + k0, w_in[i]);
        copy_async_16(x_to + 2048 * i, x_at[i] + k0, x_in[i]);
      }
      copy_async_4(scale_to + slot * kStageStride, token_scales + int64_t(kb) * T, scale_in);
      kb = kb + 1 == n_kb ? 0 : kb + 1;
      slot = slot + 1 == kStages ? 0 : slot + 1;
    };
    produce_ring<kStages>(steps, filled, emptied, issue);
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kConsumerRegisters));
  const int ct = tid - kProducers, wg = ct / 128, warp = ct % 128 / 32;
  const int wrow = 64 * wg + 16 * warp;  // the warp's 16 weight rows; this thread's: wrow + lane / 4 (+ 8)
  const int lr = lane / 4, lc = lane % 4;
  int64_t step = 0;
  for (int64_t tile = 0; tile < my_tiles; ++tile) {
    const int64_t n0 = row_of(tile), t0 = token_of(tile);
    const uint8_t* w_scales = scale_row<kFp8>(W, p.row0 + n0);  // the tile's rows are one 128-row block
    float acc[64] = {}, part[64];
    for (int kb = 0; kb < n_kb; ++kb, ++step) {
      const int slot = int(step % kStages);
      const float w_scale = scale_at(w_scales, kb, W.scale_is_f32);
      barrier_wait(&filled[slot], int((step / kStages) & 1));
      const uint64_t a = tile_descriptor(weights_of(slot) + 64 * wg * kBK), b = tile_descriptor(tokens_of(slot));
      wgmma_begin();
      wgmma_k32<false>(part, a, b);
#pragma unroll
      for (int q = 1; q < kBK / 32; ++q) wgmma_k32<true>(part, a + 2 * q, b + 2 * q);  // 32 bytes on, in 16s
      wgmma_commit();
      wgmma_finish(part);
      promote(acc, part, scales_of(slot), lc, [w_scale](float s) { return s * w_scale; });
      __syncwarp();
      if (lane == 0) barrier_arrive(&emptied[slot]);  // the warp is done with the stage
    }
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      const int64_t n = n0 + wrow + lr + (i % 4 >= 2 ? 8 : 0), t = t0 + 8 * (i / 4) + 2 * lc + i % 2;
      if (n < p.rows && t < T) p.y[t * p.y_stride + n] = round_bf16(acc[i]);
    }
  }
#endif
}

// The products the kernel can take: FP8 weights, K whole 128-blocks, rows from a scale block's first.
bool fits_tensor_core_fp8(const GemmRequest& r) {
  return r.W.format == kFp8 && r.W.in % kBK == 0 && r.row0 % kBM == 0 && r.W.scale_cols == r.W.in / kBK &&
         device_has_wgmma();
}

}  // namespace

bool uses_tensor_core_fp8(const GemmRequest& r) {
  // DSV4_CUDA_CUBLASLT_FP8=1 leaves them all to cuBLASLt (to measure what the kernel buys).
  static const bool cublaslt = [] {
    const char* v = std::getenv("DSV4_CUDA_CUBLASLT_FP8");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return !cublaslt && fits_tensor_core_fp8(r) && (r.W.in <= kShortK || r.T % 4 != 0);
}

void CudaBackend::tensor_core_fp8(const GemmRequest& r, const uint8_t* x, const float* sx) {
  DSV4_CUDA_REQUIRE(fits_tensor_core_fp8(r), "FP8 tensor-core product: K ", r.W.in, " must be whole 128-blocks and row0 ",
                    r.row0, " a scale block's first row, on a Hopper (sm_90a)");
  if (r.T == 0 || r.rows == 0) return;
  const int64_t tiles = (r.rows + kBM - 1) / kBM * ((r.T + kBN - 1) / kBN);
  allow_shared_memory(reinterpret_cast<const void*>(fp8_gemm_kernel), kSmemBytes, "FP8 tensor-core product");
  launch(fp8_gemm_kernel, unsigned(std::min<int64_t>(tiles, sm_count_)), kThreads, kSmemBytes, stream_, r, x, sx);
  DSV4_CUDA_LAUNCHED("linear (FP8 tensor cores)");
}

}  // namespace dsv4::cuda
