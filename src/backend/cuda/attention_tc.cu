// deepseek-tc's prefill attention on the bf16 tensor cores, as DeepSeek's own sparse-attention
// kernels run it (the exact kernels, attention.cu, sum every product in double).
//
// What changes against the exact definition: the query is rounded to bf16 (the stored rows already
// are bf16 values: window rows in deepseek numerics, compact rows' e4m3 · 2^e and bf16 dims); the
// logits and P·V accumulate in fp32 on the tensor cores; the softmax is online (flash attention),
// so a probability is rounded to bf16 as exp(logit − running max) and rescaled in fp32 when the
// max grows, where the exact path rounds exp(logit − final max). The sink still joins the
// denominator, not the max, and the denominator sums the unrounded exponentials.
//
// Every row is a bf16 row first: the chunk's window and the compressed rows are converted once
// per call (compact rows' e4m3 codes by bit placement times their block's exponent, exact), so a
// row read by many queries is converted once, not once per query (H200, 4 synthetic V4-Flash
// layers, 256K prompt, ncu over all launches, tiles of 32 rows: 594 ms against 776 when each query's
// block converted its tiles in shared memory).
//
// One block per (query, 64 heads): the heads of a query share its rows (one KV head), so both
// products have the 64 heads as M, one wgmma's height. The rows come in tiles of 64, and tiles in
// pairs (A, B); a row serves as key and as value from the same shared memory, stored as wgmma's
// 128-byte swizzle reads a K-major operand (blocks of 64 dims, a row 128 bytes), which is also the
// N-major layout of the values' B. Three warpgroups, as FlashMLA splits its MLA kernel's work (the
// output, 64 heads × 512 dims of fp32, is two warpgroups' registers):
//   producer: copies a pair's bf16 rows with cp.async into four stages of half a tile (A's dims
//     0–255 and 256–511, then B's), each refilled as soon as the consumers are done with it; zeros
//     for skipped or missing rows and for dims past the head dim;
//   consumer c (c = 0 for A, 1 for B): tile c's logits against all 64 heads over all dims (wgmma
//     m64n64k16, the query and the rows from shared memory), then its softmax: consumer 0 from the
//     running max, consumer 1 from A's (handed over with A's probabilities in shared memory, which
//     consumer 1 multiplies while it computes B's);
//   values: consumer c adds P · V of both tiles over its dims 256c … 256c + 255 (wgmma m64n256k16,
//     128 fp32 accumulators a thread), rescaled first when a max grew.
// So one consumer's softmax runs while the other's products do (the one-tile kernel before left the
// tensor cores idle through every softmax and its exchange of maxima: 27% of the bf16 peak at a 1M
// prompt's HCA layer), and the rows arrive while the pair before is summed. The arithmetic is the
// one-tile kernel's: A's probabilities are exp(logit − the max after A), B's exp(logit − the max
// after B), rounded to bf16, and o is rescaled in fp32 each time the max grows; only the
// denominator's fp32 sum is in another order (each consumer sums its tiles'). The query (64 × 512
// bf16), the four stages and two tiles' probabilities take 210 KB of shared memory: one block per SM.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/attention_rows.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/wgmma.cuh"

namespace dsv4::cuda {

namespace {

constexpr int kProducers = 128, kConsumers = 256, kThreads = kProducers + kConsumers;  // three warpgroups
constexpr int kHeads = 64;                 // per block: wgmma's M
constexpr int kTileRows = 64;              // rows per tile: the logits' N, the values' K
constexpr int kMaxDim = 512;               // two consumers of 256 value dims
constexpr int kHalfDims = kMaxDim / 2;     // a tile's half: a consumer's value dims
constexpr int kDimBlock = 64;              // bf16 per 128-byte swizzled row
constexpr int kDimBlocks = kMaxDim / kDimBlock, kHalfBlocks = kDimBlocks / 2;
// The ring: a pair of tiles (A, then B) in four stages of half a tile, in the order they empty:
// A's dims 0–255 and 256–511, then B's.
constexpr int kStages = 4;
// Registers per thread once the roles split (setmaxnreg): together what the block is given at
// launch, 168 a thread (__launch_bounds__ with one block per SM).
constexpr int kProducerRegisters = 56, kConsumerRegisters = 224;
static_assert(kProducers * kProducerRegisters + kConsumers * kConsumerRegisters == kThreads * 168, "the block's registers");
// The consumers' named barriers (wgmma.cuh): a pair's hand-overs between them, each consumer's own
// barrier before its products read the probabilities it wrote, and the barrier of both.
constexpr int kABarrier = 1, kBBarrier = 2, kAFreeBarrier = 3, kBFreeBarrier = 4, kOwnBarrier = 5, kBothBarrier = 7;

// Shared memory from a 1024-byte boundary (the swizzle's period). A dim block holds its 64 dims of
// every head or row: [head or row][128 B].
constexpr uint32_t kQueryBlockBytes = kHeads * 128, kHalfBlockBytes = kTileRows * 128;
constexpr uint32_t kQueryBytes = kDimBlocks * kQueryBlockBytes, kStageBytes = kHalfBlocks * kHalfBlockBytes;
constexpr uint32_t kProbBytes = kHeads * kTileRows * 2;  // [head][64 rows of bf16]: one 128-byte row each
constexpr uint32_t kStagesOff = kQueryBytes, kProbOff = kStagesOff + kStages * kStageBytes;  // then A's, B's
constexpr uint32_t kMaxOff = kProbOff + 2 * kProbBytes;            // [A, B][kHeads] floats: a tile's max
constexpr uint32_t kSumOff = kMaxOff + 2 * kHeads * sizeof(float);  // [consumer][kHeads] floats
constexpr uint32_t kPresentOff = kSumOff + 2 * kHeads * sizeof(float);  // [A, B][kTileRows] ints
constexpr size_t kSmemBytes = kPresentOff + 2 * kTileRows * sizeof(int) + kSwizzlePeriod;

// Four e4m3 codes (a word, the first in the low byte) of a block with E8M0 exponent e, as four bf16
// (two per word). A code's 7 magnitude bits placed under a float's sign are its value · 2^-120,
// normal and subnormal codes alike; two exact multiplications give the value · 2^(e − 127).
__device__ inline uint2 e4m3x4_bf16(uint32_t word, uint32_t e) {
  const float scale = __uint_as_float(e ? e << 23 : 0x00400000u);  // 2^(e − 127), 2^-127 a subnormal
  float v[4];
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const uint32_t code = word >> (8 * c);
    v[c] = __uint_as_float(((code & 0x7fu) << 20) | ((code & 0x80u) << 24)) * 0x1p120f * scale;
  }
  return make_uint2(bf16x2_bits(v[0], v[1]), bf16x2_bits(v[2], v[3]));
}

__global__ void window_bf16_kernel(const float* kv, int64_t n, __nv_bfloat16* out) {
  await_previous_kernel();
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x)
    out[e] = __float2bfloat16_rn(kv[e]);
}

// The n compact rows of kv (format f) as bf16 rows of f.width, a group of 4 dims per thread.
__global__ void compact_bf16_kernel(const float* kv, RowFormat f, int64_t n, __nv_bfloat16* out) {
  await_previous_kernel();
  const int groups = f.width / 4;
  const int64_t n_groups = n * groups;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n_groups; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t w = e / groups;
    const int d0 = 4 * int(e % groups);
    const unsigned char* src = reinterpret_cast<const unsigned char*>(kv + w * f.stride);
    uint2 v;
    if (d0 < f.quant_dims) {
      v = e4m3x4_bf16(*reinterpret_cast<const uint32_t*>(src + d0), src[f.quant_dims + d0 / RowFormat::kFp8Block]);
    } else {  // the bf16 dims: 2-byte aligned only
      const uint16_t* tail = reinterpret_cast<const uint16_t*>(src + f.tail_offset()) + (d0 - f.quant_dims);
      v = make_uint2(uint32_t(tail[0]) | uint32_t(tail[1]) << 16, uint32_t(tail[2]) | uint32_t(tail[3]) << 16);
    }
    *reinterpret_cast<uint2*>(out + w * f.width + d0) = v;
  }
}

#ifdef DSV4_WGMMA
// The products, each its warpgroup's: d (+)= a · b with both operands in shared memory (descriptors),
// bf16 in and fp32 accumulators in wgmma's fragment order (d[4j + 2r + e]: head 16w + g + 8r, column
// 8j + 2i + e, for warp w of the group, g = lane / 4, i = lane % 4).
// The logits' step: 64 heads × 64 rows over 16 dims, b K-major.
template <bool kAccumulate>
__device__ __forceinline__ void wgmma_logits(float (&d)[32], uint64_t a, uint64_t b) {
#define DSV4_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
      "%23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : DSV4_D8(0), DSV4_D8(8), DSV4_D8(16), DSV4_D8(24)
      : "l"(a), "l"(b), "n"(int(kAccumulate)));
#undef DSV4_D8
}

// The values' step: 64 heads × 256 dims over 16 rows, b N-major (transposed).
__device__ __forceinline__ void wgmma_values(float (&d)[128], uint64_t a, uint64_t b) {
#define DSV4_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
      "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, "
      "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, "
      "%59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, "
      "%78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, "
      "%97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, "
      "%113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
      "%128, %129, 1, 1, 1, 0, 1;\n"
      : DSV4_D8(0), DSV4_D8(8), DSV4_D8(16), DSV4_D8(24), DSV4_D8(32), DSV4_D8(40), DSV4_D8(48), DSV4_D8(56),
        DSV4_D8(64), DSV4_D8(72), DSV4_D8(80), DSV4_D8(88), DSV4_D8(96), DSV4_D8(104), DSV4_D8(112), DSV4_D8(120)
      : "l"(a), "l"(b));
#undef DSV4_D8
}
#endif

// Block (query t, heads h0 … h0 + 63); `window` and `compressed` are a.swa.kv and a.comp.kv as bf16
// rows of a.hd (same row numbers). See the top for the roles and the order of a pair's steps.
__global__ void __launch_bounds__(kThreads, 1)
    tc_attention_kernel(AttnArgs a, const __nv_bfloat16* window, const __nv_bfloat16* compressed) {
#ifdef DSV4_WGMMA
  await_previous_kernel();
  extern __shared__ unsigned char smem_base[];
  unsigned char* smem = at_swizzle_period(smem_base);
  unsigned char* qs = smem;                     // [kDimBlocks][kHeads][128 B]
  unsigned char* stages = smem + kStagesOff;    // [kStages][kHalfBlocks][kTileRows][128 B]
  unsigned char* probs = smem + kProbOff;       // [A, B][kHeads][128 B]
  float* tile_max = reinterpret_cast<float*>(smem + kMaxOff);  // [A, B][kHeads]
  float* sums = reinterpret_cast<float*>(smem + kSumOff);      // [consumer][kHeads]
  int* present = reinterpret_cast<int*>(smem + kPresentOff);   // [A, B][kTileRows]
  __shared__ uint64_t filled[kStages], emptied[kStages];

  const int64_t t = blockIdx.x, h0 = int64_t(blockIdx.y) * kHeads;
  const int tid = threadIdx.x, lane = tid % 32;
  const QueryRows rows(a, t);
  const int n_pairs = int((rows.n + 2 * kTileRows - 1) / (2 * kTileRows));
  if (tid == 0)
    for (int s = 0; s < kStages; ++s) {
      // Who is done with a stage (warps): A's dims 0–255 consumer 0 alone, its dims 256–511 both (the
      // logits and consumer 1's values), B's 0–255 both, its 256–511 consumer 1 alone.
      barrier_init(&filled[s], kProducers);
      barrier_init(&emptied[s], s == 0 || s == 3 ? 4 : 8);
    }
  __syncthreads();

  if (tid < kProducers) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kProducerRegisters));
    // Step k fills stage k % 4 with half k % 2 of tile k / 2. Thread tid copies 16-byte chunk tid % 32
    // of that half of rows tid / 32 + 4i (a warp's copy is one row's 512 contiguous bytes), zeros for
    // skipped and missing rows and for dims past the head dim; with the first half it notes which
    // rows are present.
    const int chunk = tid % 32, first_row = tid / 32;
    const uint32_t to = shared_address(stages) + (chunk / 8) * kHalfBlockBytes;
    auto issue = [&](int64_t step) {
      const int s = int(step % kStages), tile = int(step / 2), half = int(step % 2);
      const int d0 = kHalfDims * half + 8 * chunk;
      for (int r = first_row; r < kTileRows; r += kProducers / 32) {
        const RowIndex ref = rows.index(a, t, int64_t(tile) * kTileRows + r);
        const __nv_bfloat16* src = (ref.window ? window : compressed) + (ref.i >= 0 ? ref.i : 0) * a.hd;
        copy_async_16(to + s * kStageBytes + swizzled(r, chunk % 8), src + (d0 < a.hd ? d0 : 0), ref.i >= 0 && d0 < a.hd);
        if (half == 0 && chunk == 0) present[tile % 2 * kTileRows + r] = ref.i >= 0;
      }
    };
    // Not produce_ring: the consumers empty a pair's stages in another order than they fill them
    // (B's only once their products with A's are done), so every stage of a pair is announced before
    // the producer waits to refill any; each is refilled as soon as it is emptied, in turn.
    for (int pair = 0; pair < n_pairs; ++pair) {
      for (int s = 0; s < kStages; ++s) {
        if (pair > 0) barrier_wait(&emptied[s], (pair - 1) & 1);
        issue(int64_t(kStages) * pair + s);
        commit_async_copies();
      }
      auto announce = [&](int s) {  // (this thread's copies of stage s have landed)
        fence_for_tensor_cores();
        barrier_arrive(&filled[s]);
      };
      await_async_copies<3>(), announce(0);
      await_async_copies<2>(), announce(1);
      await_async_copies<1>(), announce(2);
      await_async_copies<0>(), announce(3);
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kConsumerRegisters));
  const int ct = tid - kProducers, c = ct / 128, warp = ct % 128 / 32, g = lane / 4, i = lane % 4;
  // The query's heads as bf16, zeros past H and past hd (the products always run over kMaxDim: a
  // loop bound known to the compiler keeps the wgmma chain free of injected waits).
  for (int e = ct; e < kHeads * (kMaxDim / 4); e += kConsumers) {
    const int h = e / (kMaxDim / 4), d0 = 4 * (e % (kMaxDim / 4));
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (h0 + h < a.H && d0 < a.hd) v = *reinterpret_cast<const float4*>(a.q + (t * a.H + h0 + h) * a.hd + d0);
    *reinterpret_cast<uint2*>(qs + (d0 / kDimBlock) * kQueryBlockBytes + swizzled(h, d0 % kDimBlock / 8) + d0 % 8 * 2) =
        make_uint2(bf16x2_bits(v.x, v.y), bf16x2_bits(v.z, v.w));
  }
  fence_for_tensor_cores();
  named_sync(kBothBarrier, kConsumers);

  // Consumer c computes tile c's logits (A: 0, B: 1) and softmax, and adds both tiles' P · V over
  // its value dims 256c … 256c + 255. Its stages: its tile's halves (2c, 2c + 1) for the logits, and
  // its dims' half of each tile (c, 2 + c) for the values.
  auto release = [&](int s) {
    __syncwarp();
    if (lane == 0) barrier_arrive(&emptied[s]);
  };
  // Tile c's logits, c[4j + 2r + e]: head 16·warp + g + 8r, tile row 8j + 2i + e. Step kk takes dims
  // 16·kk …: dim block kk / 4, 32 bytes on per step inside it; the half's stage once it is filled.
  float s_[32];
  auto logits_half = [&](int half, int parity) {
    const unsigned char* keys = stages + (2 * c + half) * kStageBytes;
    barrier_wait(&filled[2 * c + half], parity);
    wgmma_begin();
#pragma unroll
    for (int kk = 16 * half; kk < 16 * half + 16; ++kk) {
      const uint64_t q_at = tile_descriptor(qs + kk / 4 * kQueryBlockBytes + kk % 4 * 32);
      const uint64_t k_at = tile_descriptor(keys + (kk % 16) / 4 * kHalfBlockBytes + kk % 4 * 32);
      if (kk == 0) wgmma_logits<false>(s_, q_at, k_at);
      else wgmma_logits<true>(s_, q_at, k_at);
    }
    wgmma_commit();
  };
  // The probabilities of tile p (A: 0, B: 1) as bf16 in wgmma's A layout ((head h, rows 8j + 2i, + 1):
  // 16-byte piece j of the head's row), for both consumers' products.
  auto store_probs = [&](int p) {
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int j = 0; j < 8; ++j)
        *reinterpret_cast<uint32_t*>(probs + p * kProbBytes + swizzled(16 * warp + g + 8 * r, j) + 4 * i) =
            bf16x2_bits(s_[4 * j + 2 * r], s_[4 * j + 2 * r + 1]);
  };
  float o[128] = {};  // o[4j + 2r + e]: head 16·warp + g + 8r, dim 256·c + 8j + 2i + e
  // Per head r of the thread (16·warp + g + 8r): the running max after the pairs so far, and this
  // consumer's part of the denominator (its tiles' unrounded exponentials, at that max).
  float running_max[2] = {-INFINITY, -INFINITY}, sum[2] = {0.0f, 0.0f};
  // o *= alpha per head (its products are done), unless no head of the warp changes.
  auto rescale = [&](const float (&alpha)[2]) {
    if (__any_sync(kFullMask, alpha[0] != 1.0f || alpha[1] != 1.0f))
#pragma unroll
      for (int k = 0; k < 128; ++k) o[k] *= alpha[k / 2 % 2];
  };
  // o += P(tile p) · V over the consumer's dims, from tile p's stage of them.
  auto add_values = [&](int p) {
    const unsigned char* values = stages + (2 * p + c) * kStageBytes;
    wgmma_begin();
#pragma unroll
    for (int ks = 0; ks < kTileRows / 16; ++ks)  // rows 16·ks …: 32 bytes on in the probabilities' rows
      wgmma_values(o, tile_descriptor(probs + p * kProbBytes + 32 * ks), n_major_descriptor(values + 16 * ks * 128, kHalfBlockBytes));
    wgmma_commit();
  };
  // exp's base for a max: 0 while every row so far is absent (all terms stay 0).
  auto base_of = [](float m) { return m == -INFINITY ? 0.0f : m; };

  for (int pair = 0; pair < n_pairs; ++pair) {
    const int parity = pair & 1;
    logits_half(0, parity);
    logits_half(1, parity);
    wgmma_wait<0>(s_);
    // Scaled logits, −inf for absent rows, and their max per head.
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int k = 0; k < 32; ++k) {
      const bool here = present[c * kTileRows + 8 * (k / 4) + 2 * i + k % 2];
      s_[k] = here ? s_[k] * a.softmax_scale : -INFINITY;
      mx[k / 2 % 2] = fmaxf(mx[k / 2 % 2], s_[k]);
    }
    release(c == 0 ? 1 : 2);  // this tile's logits are done (and its presence read)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(kFullMask, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(kFullMask, mx[r], 2));
    }
    float max_a[2], alpha_a[2], alpha_b[2];
    if (c == 0) {
      // Tile A's softmax from the running max, its probabilities to shared memory (once consumer 1's
      // product of the last pair's is done) with its max, then o's product with them.
      float s[2] = {0.0f, 0.0f};
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        max_a[r] = fmaxf(running_max[r], mx[r]);
        alpha_a[r] = __expf(running_max[r] - base_of(max_a[r]));
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& x = s_[4 * j + 2 * r + e];
            x = __expf(x - base_of(max_a[r]));
            s[r] += x;
          }
        sum[r] = sum[r] * alpha_a[r] + s[r];
      }
      if (pair > 0) named_sync(kAFreeBarrier, kConsumers);
      store_probs(0);
      if (i == 0)
        for (int r = 0; r < 2; ++r) tile_max[16 * warp + g + 8 * r] = max_a[r];
      fence_for_tensor_cores();
      named_arrive(kABarrier, kConsumers);
      named_sync(kOwnBarrier, 128);  // every warp's probabilities, before this group's product reads them
      rescale(alpha_a);
      add_values(0);
      wgmma_wait<0>(o);
      release(0);  // A's dims 0–255, its logits and this product done: the producer refills them
      // Tile B's max from consumer 1, then o's product with B's probabilities.
      named_sync(kBBarrier, kConsumers);
      float max_b[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        max_b[r] = tile_max[kHeads + 16 * warp + g + 8 * r];
        alpha_b[r] = __expf(max_a[r] - base_of(max_b[r]));
        sum[r] *= alpha_b[r];
        running_max[r] = max_b[r];
      }
      rescale(alpha_b);
      add_values(1);
    } else {
      // Tile A's max from consumer 0, then o's product with A's probabilities; tile B's softmax meanwhile.
      named_sync(kABarrier, kConsumers);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        max_a[r] = tile_max[16 * warp + g + 8 * r];
        alpha_a[r] = __expf(running_max[r] - base_of(max_a[r]));
      }
      rescale(alpha_a);
      add_values(0);
      float s[2] = {0.0f, 0.0f}, max_b[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        max_b[r] = fmaxf(max_a[r], mx[r]);
        alpha_b[r] = __expf(max_a[r] - base_of(max_b[r]));
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& x = s_[4 * j + 2 * r + e];
            x = __expf(x - base_of(max_b[r]));
            s[r] += x;
          }
        sum[r] = sum[r] * alpha_a[r] * alpha_b[r] + s[r];
        running_max[r] = max_b[r];
      }
      if (pair > 0) named_sync(kBFreeBarrier, kConsumers);
      store_probs(1);
      if (i == 0)
        for (int r = 0; r < 2; ++r) tile_max[kHeads + 16 * warp + g + 8 * r] = max_b[r];
      fence_for_tensor_cores();
      named_arrive(kBBarrier, kConsumers);
      named_sync(kOwnBarrier + 1, 128);
      wgmma_wait<0>(o);
      release(1);  // A's dims 256–511: consumer 0's logits and this product are done
      if (pair + 1 < n_pairs) named_arrive(kAFreeBarrier, kConsumers);  // consumer 0 may write A's probabilities
      rescale(alpha_b);
      add_values(1);
    }
    // Tile B's product done before the next pair's logits (a group left in flight across the loop made
    // ptxas serialise every product): its stage of this consumer's dims is free, and B's probabilities.
    wgmma_finish(o);
    release(c == 0 ? 2 : 3);
    if (c == 0 && pair + 1 < n_pairs) named_arrive(kBFreeBarrier, kConsumers);  // consumer 1 may write them
  }

  // The denominator: the lanes' and the two consumers' sums, then the sink.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    sum[r] += __shfl_xor_sync(kFullMask, sum[r], 1);
    sum[r] += __shfl_xor_sync(kFullMask, sum[r], 2);
    if (i == 0) sums[c * kHeads + 16 * warp + g + 8 * r] = sum[r];
  }
  named_sync(kBothBarrier, kConsumers);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t h = h0 + 16 * warp + g + 8 * r;
    if (h >= a.H) continue;
    const int hl = int(h - h0);
    const float den = sums[hl] + sums[kHeads + hl] + __expf(a.sinks[h] - running_max[r]);
    float* out = a.out + (t * a.H + h) * a.hd;
#pragma unroll
    for (int j = 0; j < kHalfDims / 8; ++j) {
      const int d = kHalfDims * c + 8 * j + 2 * i;
      if (d >= a.hd) break;
      *reinterpret_cast<float2*>(out + d) =
          make_float2(round_if(a.bf16, o[4 * j + 2 * r] / den), round_if(a.bf16, o[4 * j + 2 * r + 1] / den));
    }
  }
#endif
}

}  // namespace

bool fits_tensor_core_attention(const AttnArgs& a) {
  const bool compact_rows = !a.comp.kv || a.comp.format.kind == RowFormat::fp8_bf16;
  return device_has_wgmma() && a.hd % 16 == 0 && a.hd <= kMaxDim && compact_rows;
}

void CudaBackend::tensor_core_attention(const AttnArgs& a, int64_t T) {
  DSV4_CUDA_REQUIRE(fits_tensor_core_attention(a), "tensor-core attention: head dim ", a.hd, ", rows of kind ",
                    int(a.comp.format.kind));
  DeviceArray<__nv_bfloat16> window(memory_, size_t(a.swa.n * a.hd));
  launch(window_bf16_kernel, grid_for(a.swa.n * a.hd, 256), 256, 0, stream_, a.swa.kv, a.swa.n * a.hd, window.get());
  DSV4_CUDA_LAUNCHED("attention (window as bf16)");
  const int64_t n_comp = a.comp.kv ? a.comp.n : 0;
  DeviceArray<__nv_bfloat16> compressed(memory_, size_t(std::max<int64_t>(n_comp, 1) * a.hd));
  if (n_comp > 0) {
    launch(compact_bf16_kernel, grid_for(n_comp * (a.hd / 4), 256), 256, 0, stream_, a.comp.kv, a.comp.format, n_comp,
           compressed.get());
    DSV4_CUDA_LAUNCHED("attention (compressed rows as bf16)");
  }
  allow_shared_memory(reinterpret_cast<const void*>(tc_attention_kernel), kSmemBytes, "tensor-core attention");
  launch(tc_attention_kernel, dim3(unsigned(T), unsigned((a.H + kHeads - 1) / kHeads)), kThreads, kSmemBytes, stream_,
         a, static_cast<const __nv_bfloat16*>(window.get()), static_cast<const __nv_bfloat16*>(compressed.get()));
  DSV4_CUDA_LAUNCHED("attention (tensor cores)");
}

}  // namespace dsv4::cuda
