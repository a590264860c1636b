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
// A block takes kBM = 192 token rows (wgmma's A, 64 for each of three consumer warpgroups) against
// 128 weight rows (one scale block: B), both K-major tiles of 128-byte rows in shared memory under
// wgmma's 128-byte swizzle. Tokens as A leave each thread two token rows (lane / 4 and + 8) against
// 32 weight rows in pairs: a K block's promotion takes two token scales, and the output leaves as
// pairs of adjacent floats. The grid is one block per SM, each taking tile after tile. One producer
// warp fills a ring of kStages stages, kStages − 1 K blocks ahead and across tiles: its lane 0 asks
// the tensor memory accelerator for the two tiles (tensor maps made on the host, rows past T or the
// product's rows zeros), its 32 lanes copy the tile's token scales by cp.async, and the stage's
// `filled` barrier completes when both have landed. The consumers multiply, then promote; while one
// promotes, the others' products keep the tensor cores busy. Each warp releases the stage at its
// `emptied` barrier.
//
// Measured (one H100, 8K prefill, wq_b per call; bench/cuda_decode.md, forty-second session): the
// ring fed by a warpgroup of cp.async copies (≈ 140 producer instructions per K block; the tensor
// maps take two) with the weights as A and two consumers, 1 130 µs; fed by the tensor memory
// accelerator with the tokens as A, 906; with three consumers (a block reads 40 KB from L2 per 6.3
// MFLOP instead of 32 KB per 4.2), 840, 652 TFLOP/s. Clusters of two blocks sharing each weight
// tile by TMA multicast were slower (2 020 µs with two consumers, 1 567 with three). Halves of 64
// tokens, one promoted while the other's products run, would read the weight tile from shared
// memory twice: at m64n64k32 the two operands take 128 bytes a cycle, all that shared memory gives.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/gemm_tc.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/tensor_map.h"
#include "backend/cuda/weight_access.cuh"
#include "backend/cuda/wgmma.cuh"

namespace dsv4::cuda {

namespace {

// The consumer warpgroups, 64 token rows each: a block's tile is kBM token rows against kBN weight
// rows (one scale block), over K blocks of kBK.
constexpr int kGroups = 3;
constexpr int kBM = 64 * kGroups, kBN = 128, kBK = 128;
// Where the kernel runs rather than cuBLASLt (uses_tensor_core_fp8): products of K ≤ kShortK, where
// it measured faster (one H100, 8K prefill, per call: wq_b with K 1 024, 840 µs against cuBLASLt's
// 1 538 when last measured; the indexer's wq_b 242 against 413), and token counts cuBLASLt has no
// algorithm for (not a multiple of 4: those ran on the exact FP64 kernels). At longer K the two
// measured alike (wo_b, K 8 192: 746 against 750 µs; wq_a, K 4 096: 191–194 against 194–199) or
// cuBLASLt ahead (wkv, 512 rows: 162–166 against 155–157), so those stay with cuBLASLt.
constexpr int64_t kShortK = 1024;
constexpr int kBandTiles = 8;  // weight row tiles per band of the tile order (see the kernel)
constexpr int kProducers = 128, kConsumers = 128 * kGroups, kThreads = kProducers + kConsumers;
// Registers per thread of each role once the roles split (setmaxnreg): together no more than the
// block is given at launch (__launch_bounds__ with one block per SM: the register file over the
// threads, in eights). The producer warpgroup's one working warp needs few.
constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8, kProducerRegisters = 32;
constexpr int kConsumerRegisters = (kLaunchRegisters * kThreads - kProducers * kProducerRegisters) / kConsumers / 8 * 8;
static_assert(kProducers * kProducerRegisters + kConsumers * kConsumerRegisters <= kThreads * kLaunchRegisters,
              "the block's registers");
static_assert(kConsumerRegisters <= 256, "setmaxnreg's largest count");
static_assert(kBM % 32 == 0, "the producer warp's lanes copy kBM / 32 token scales each");
// A stage: the token tile, the weight tile (each from a swizzle period), the token scales; as many
// stages as fit the 227 KB a block may have (less the static barriers).
constexpr int kTokenBytes = kBM * kBK, kWeightBytes = kBN * kBK, kStageBytes = kTokenBytes + kWeightBytes + kBM * 4;
constexpr int kStageStride = (kStageBytes + kSwizzlePeriod - 1) / kSwizzlePeriod * kSwizzlePeriod;
constexpr int kStages = (227 * 1024 - kSwizzlePeriod - 256) / kStageStride;
constexpr size_t kSmemBytes = kSwizzlePeriod + size_t(kStages) * kStageStride;

#ifdef DSV4_WGMMA
// d (+)= A · Bᵀ over 32 of K: A 64 token rows, B 128 weight rows, both e4m3 in shared memory;
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

// x_map, w_map: tensor maps of the token rows' e4m3 codes [T][K] (boxes of kBM rows) and of the
// product's weight rows [p.rows][K] from row0 (boxes of kBN); sx: the tokens' scales [K/128][T].
// Persistent: block b takes tiles b, b + gridDim.x, … (in the band order below), and its K blocks
// run through the ring as one sequence, so the producer fills the next tile's first stages while
// the consumers finish this one.
__global__ void __launch_bounds__(kThreads, 1)
    fp8_gemm_kernel(const __grid_constant__ CUtensorMap x_map, const __grid_constant__ CUtensorMap w_map, GemmRequest p,
                    const float* sx) {
#ifdef DSV4_WGMMA
  await_previous_kernel();
  extern __shared__ unsigned char smem_base[];
  unsigned char* smem = at_swizzle_period(smem_base);
  __shared__ uint64_t filled[kStages], emptied[kStages];
  const LinearView& W = p.W;
  const int64_t K = W.in, T = p.T, row_tiles = (p.rows + kBN - 1) / kBN, tiles = row_tiles * ((T + kBM - 1) / kBM);
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
    return row ? (band * kBandTiles + in_band % band_rows) * kBN : in_band / band_rows * kBM;
  };
  auto row_of = [&](int64_t i) { return tile_at(i, true); };
  auto token_of = [&](int64_t i) { return tile_at(i, false); };
  auto tokens_of = [&](int slot) { return smem + slot * kStageStride; };
  auto weights_of = [&](int slot) { return smem + slot * kStageStride + kTokenBytes; };
  auto scales_of = [&](int slot) {
    return reinterpret_cast<float*>(smem + slot * kStageStride + kTokenBytes + kWeightBytes);
  };
  if (tid == 0)  // filled: the producer warp's lanes (their scale copies) and lane 0's expected bytes
    for (int s = 0; s < kStages; ++s) barrier_init(&filled[s], 32 + 1), barrier_init(&emptied[s], kConsumers / 32);
  __syncthreads();

  if (tid < kProducers) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kProducerRegisters));
    if (tid >= 32) return;
    // Step s fills stage s % kStages once the consumers have emptied it (from the second round of
    // the ring on). Lane l copies the scales of tokens l, l + 32, …; a token past T gets a zero,
    // its address (sx) not read.
    int kb = 0, slot = 0;
    int64_t t0 = 0, n0 = 0;
    for (int64_t step = 0; step < steps; ++step) {
      if (kb == 0) n0 = row_of(step / n_kb), t0 = token_of(step / n_kb);
      if (step >= kStages) barrier_wait(&emptied[slot], int((step / kStages - 1) & 1));
      if (lane == 0) {
        barrier_expect_bytes(&filled[slot], kTokenBytes + kWeightBytes);
        copy_tile(tokens_of(slot), &x_map, kb * kBK, int(t0), &filled[slot]);
        copy_tile(weights_of(slot), &w_map, kb * kBK, int(n0), &filled[slot]);
      }
      const float* from = sx + int64_t(kb) * T + t0;
#pragma unroll
      for (int e = 0; e < kBM / 32; ++e) {
        const int token = lane + 32 * e;
        const bool in = t0 + token < T;
        copy_async_4(scales_of(slot) + token, in ? from + token : sx, in);
      }
      barrier_arrive_on_copies(&filled[slot]);
      kb = kb + 1 == n_kb ? 0 : kb + 1;
      slot = slot + 1 == kStages ? 0 : slot + 1;
    }
    await_async_copies<0>();  // (the block's shared memory outlives the copies in flight)
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kConsumerRegisters));
  const int ct = tid - kProducers, wg = ct / 128, warp = ct % 128 / 32;
  const int lr = lane / 4, lc = lane % 4;
  const int trow = 64 * wg + 16 * warp + lr;  // this thread's token rows in the tile: trow and trow + 8
  int64_t step = 0;
  for (int64_t tile = 0; tile < my_tiles; ++tile) {
    const int64_t n0 = row_of(tile), t0 = token_of(tile);
    const uint8_t* w_scales = scale_row<kFp8>(W, p.row0 + n0);  // the tile's rows are one 128-row block
    float acc[64] = {}, part[64];
    for (int kb = 0; kb < n_kb; ++kb, ++step) {
      const int slot = int(step % kStages);
      const float w_scale = scale_at(w_scales, kb, W.scale_is_f32);
      barrier_wait(&filled[slot], int((step / kStages) & 1));
      const uint64_t a = tile_descriptor(tokens_of(slot) + 64 * wg * kBK), b = tile_descriptor(weights_of(slot));
      wgmma_begin();
      wgmma_k32<false>(part, a, b);
#pragma unroll
      for (int q = 1; q < kBK / 32; ++q) wgmma_k32<true>(part, a + 2 * q, b + 2 * q);  // 32 bytes on, in 16s
      wgmma_commit();
      wgmma_finish(part);
      // part[4j + e]: token row trow (+ 8 for e ≥ 2) against weight row 8j + 2 lc + e % 2.
      const float s0 = scales_of(slot)[trow] * w_scale, s8 = scales_of(slot)[trow + 8] * w_scale;
#pragma unroll
      for (int i = 0; i < 64; ++i) acc[i] = fmaf(i % 4 >= 2 ? s8 : s0, part[i], acc[i]);
      __syncwarp();
      if (lane == 0) barrier_arrive(&emptied[slot]);  // the warp is done with the stage
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t t = t0 + trow + 8 * h;
      if (t >= T) continue;
      float* y = p.y + t * p.y_stride;
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const int64_t n = n0 + 8 * j + 2 * lc;
        const float v0 = round_bf16(acc[4 * j + 2 * h]), v1 = round_bf16(acc[4 * j + 2 * h + 1]);
        if (n + 1 < p.rows) *reinterpret_cast<float2*>(y + n) = make_float2(v0, v1);  // y rows 16-byte aligned
        else if (n < p.rows) y[n] = v0;
      }
    }
  }
#endif
}

// The products the kernel can take: FP8 weights, K whole 128-blocks, rows from a scale block's first.
bool fits_tensor_core_fp8(const GemmRequest& r) {
  return r.W.format == kFp8 && r.W.in % kBK == 0 && r.row0 % kBN == 0 && r.W.scale_cols == r.W.in / kBK &&
         device_has_wgmma();
}

}  // namespace

bool uses_tensor_core_fp8(const GemmRequest& r) {
  // DSV4_CUDA_CUBLASLT_FP8=1 leaves them all to cuBLASLt, 0 gives the kernel every product it can
  // take (to measure the two against each other).
  static const int cublaslt = [] {
    const char* v = std::getenv("DSV4_CUDA_CUBLASLT_FP8");
    return v == nullptr ? -1 : std::strcmp(v, "1") == 0 ? 1 : std::strcmp(v, "0") == 0 ? 0 : -1;
  }();
  return cublaslt != 1 && fits_tensor_core_fp8(r) && (cublaslt == 0 || r.W.in <= kShortK || r.T % 4 != 0);
}

void CudaBackend::tensor_core_fp8(const GemmRequest& r, const uint8_t* x, const float* sx) {
  DSV4_CUDA_REQUIRE(fits_tensor_core_fp8(r), "FP8 tensor-core product: K ", r.W.in, " must be whole 128-blocks and row0 ",
                    r.row0, " a scale block's first row, on a Hopper (sm_90a)");
  if (r.T == 0 || r.rows == 0) return;
  const int64_t tiles = (r.rows + kBN - 1) / kBN * ((r.T + kBM - 1) / kBM);
  const int64_t K = r.W.in;
  const CUtensorMap x_map = swizzled_byte_tiles(x, r.T, K, kBM, "FP8 tensor-core product's activations");
  const CUtensorMap w_map =
      swizzled_byte_tiles(r.W.data + r.row0 * K, r.rows, K, kBN, "FP8 tensor-core product's weights");
  allow_shared_memory(reinterpret_cast<const void*>(fp8_gemm_kernel), kSmemBytes, "FP8 tensor-core product");
  launch(fp8_gemm_kernel, unsigned(std::min<int64_t>(tiles, sm_count_)), kThreads, kSmemBytes, stream_, x_map, w_map, r,
         sx);
  DSV4_CUDA_LAUNCHED("linear (FP8 tensor cores)");
}

}  // namespace dsv4::cuda
