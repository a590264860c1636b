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
// One block of two warpgroups per (query, 64 heads): the heads of a query share its rows (one KV
// head), so both products have the 64 heads as M, one wgmma's height. The rows come in tiles of 64;
// a row serves as key and as value from the same shared memory, stored as wgmma's 128-byte
// swizzle reads a K-major operand (blocks of 64 dims, a row 128 bytes), which is also the
// N-major layout of the values' B:
//   staging: each thread copies its share of the next tile's bf16 rows with cp.async (no
//     registers) while the current tile is summed; zeros for skipped or missing rows and for dims
//     past the head dim;
//   logits: warpgroup c takes the tile's rows 32c … 32c + 31 against all 64 heads over all dims
//     (wgmma m64n32k16, the query and the rows from shared memory);
//   softmax: the two warpgroups meet in shared memory for the tile's max per head, then write the
//     bf16 probabilities in the A operand's layout;
//   values: warpgroup c adds P · V for all heads over dims 256c … 256c + 255 (wgmma m64n256k16,
//     128 fp32 accumulators per thread), rescaled first when a max grew.
// The query (64 × 512 bf16), two tile slots and the probabilities take 202 KB of shared memory:
// one block per SM. (With mma.sync and ldmatrix, every warp re-read the query and the tile from
// shared memory, which bounded it: 530.9 ms at a 256K prompt.)
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

constexpr int kThreads = 256;              // two warpgroups
constexpr int kHeads = 64;                  // per block: wgmma's M
constexpr int kTileRows = 64;               // rows per step: the logits' N (two warpgroups), the values' K
constexpr int kGroupRows = kTileRows / 2;   // the logits' rows per warpgroup
constexpr int kMaxDim = 512;                // two warpgroups of 256 value dims
constexpr int kGroupDims = kMaxDim / 2;     // the values' N per warpgroup
constexpr int kDimBlock = 64;               // bf16 per 128-byte swizzled row
constexpr int kDimBlocks = kMaxDim / kDimBlock;

// Shared memory from a 1024-byte boundary (the swizzle's period). A dim block holds its 64 dims of
// every head or row: [head or row][128 B].
constexpr uint32_t kQueryBlockBytes = kHeads * 128, kTileBlockBytes = kTileRows * 128;
constexpr uint32_t kQueryBytes = kDimBlocks * kQueryBlockBytes, kTileBytes = kDimBlocks * kTileBlockBytes;
constexpr uint32_t kProbBytes = kHeads * kTileRows * 2;  // [head][64 rows of bf16]: one 128-byte row each
constexpr uint32_t kTilesOff = kQueryBytes, kProbOff = kTilesOff + 2 * kTileBytes, kMeetOff = kProbOff + kProbBytes;
constexpr uint32_t kPresentOff = kMeetOff + 2 * kHeads * sizeof(float);
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
// The logits' step: 64 heads × 32 rows over 16 dims, b K-major.
template <bool kAccumulate>
__device__ __forceinline__ void wgmma_logits(float (&d)[16], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(a), "l"(b), "n"(int(kAccumulate)));
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
// rows of a.hd (same row numbers).
__global__ void __launch_bounds__(kThreads, 1)
    tc_attention_kernel(AttnArgs a, const __nv_bfloat16* window, const __nv_bfloat16* compressed) {
#ifdef DSV4_WGMMA
  await_previous_kernel();
  extern __shared__ unsigned char smem_base[];
  unsigned char* smem = at_swizzle_period(smem_base);
  unsigned char* qs = smem;                // [kDimBlocks][kHeads][128 B]
  unsigned char* tiles = smem + kTilesOff;  // [2][kDimBlocks][kTileRows][128 B]
  unsigned char* probs = smem + kProbOff;   // [kHeads][128 B]
  float* meet = reinterpret_cast<float*>(smem + kMeetOff);       // [2][kHeads]
  int* present = reinterpret_cast<int*>(smem + kPresentOff);     // [2][kTileRows]

  const int64_t t = blockIdx.x, h0 = int64_t(blockIdx.y) * kHeads;
  const int hd = int(a.hd);
  const int tid = threadIdx.x, lane = tid % 32, g = lane / 4, i = lane % 4;
  const int group = tid / 128, warp = tid / 32 % 4;  // the warpgroup's rows 32·group …, dims 256·group …; its heads 16·warp …
  const QueryRows rows(a, t);
  const int n_tiles = int((rows.n + kTileRows - 1) / kTileRows);

  // The query's heads as bf16, zeros past H and past hd (the products always run over kMaxDim: a
  // loop bound known to the compiler keeps the wgmma chain free of injected waits).
  for (int e = tid; e < kHeads * (kMaxDim / 4); e += kThreads) {
    const int h = e / (kMaxDim / 4), d0 = 4 * (e % (kMaxDim / 4));
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (h0 + h < a.H && d0 < hd) v = *reinterpret_cast<const float4*>(a.q + (t * a.H + h0 + h) * hd + d0);
    *reinterpret_cast<uint2*>(qs + (d0 / kDimBlock) * kQueryBlockBytes + swizzled(h, d0 % kDimBlock / 8) + d0 % 8 * 2) =
        make_uint2(bf16x2_bits(v.x, v.y), bf16x2_bits(v.z, v.w));
  }

  // Staging: thread (row r, part u) copies 16-byte piece u of rows r, r + 32 in every dim block.
  auto stage = [&](int tile, int slot) {
    for (int r = tid / 8; r < kTileRows; r += kThreads / 8) {
      const RowIndex ref = rows.index(a, t, int64_t(tile) * kTileRows + r);
      const __nv_bfloat16* src = (ref.window ? window : compressed) + (ref.i >= 0 ? ref.i : 0) * a.hd;
      unsigned char* dst = tiles + slot * kTileBytes + swizzled(r, tid % 8);
      for (int b = 0; b < kDimBlocks; ++b) {
        const int d0 = kDimBlock * b + 8 * (tid % 8);
        copy_async_16(dst + b * kTileBlockBytes, src + (d0 < hd ? d0 : 0), ref.i >= 0 && d0 < hd);  // else zeros
      }
      if (tid % 8 == 0) present[slot * kTileRows + r] = ref.i >= 0;
    }
  };

  float o[128] = {};  // o[4j + 2r + e]: head 16·warp + g + 8r, dim 256·group + 8j + 2i + e
  float running_max[2] = {-INFINITY, -INFINITY}, sum[2] = {0.0f, 0.0f};  // heads 16·warp + g + 8r
  const bool has_values = kGroupDims * group < hd;  // (dims past hd: the group has nothing to add)

  // Each tile's copies are one group, issued while the tile before is summed and awaited at the
  // start of its own step, once every warpgroup has left the slot they refill.
  stage(0, 0);
  commit_async_copies();
  for (int tile = 0; tile < n_tiles; ++tile) {
    const int slot = tile % 2;
    const unsigned char* rows_at = tiles + slot * kTileBytes;
    await_async_copies<0>();  // this tile's copies,
    fence_for_tensor_cores();  // visible to the tensor cores
    __syncthreads();          // for every thread's; every warpgroup is done with the last tile
    if (tile + 1 < n_tiles) stage(tile + 1, slot ^ 1);  // (into the slot the last tile left)
    commit_async_copies();

    // Logits: c[4j + 2r + e] is head 16·warp + g + 8r, tile row 32·group + 8j + 2i + e. Step kk
    // takes dims 16·kk …: dim block kk / 4, 32 bytes on per step inside it.
    float c[16];
    const unsigned char* keys_at = rows_at + group * kGroupRows * 128;
    auto logits_step = [&](auto accumulate, int kk) {
      const int block = kk / 4, within = kk % 4 * 32;
      wgmma_logits<decltype(accumulate)::value>(c, tile_descriptor(qs + block * kQueryBlockBytes + within),
                                                tile_descriptor(keys_at + block * kTileBlockBytes + within));
    };
    wgmma_begin();
    logits_step(std::false_type{}, 0);
#pragma unroll
    for (int kk = 1; kk < kMaxDim / 16; ++kk) logits_step(std::true_type{}, kk);
    wgmma_commit();
    wgmma_finish(c);
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int k = 0; k < 16; ++k) {
      const bool here = present[slot * kTileRows + kGroupRows * group + 8 * (k / 4) + 2 * i + k % 2];
      c[k] = here ? c[k] * a.softmax_scale : -INFINITY;
      mx[k / 2 % 2] = fmaxf(mx[k / 2 % 2], c[k]);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(kFullMask, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(kFullMask, mx[r], 2));
      if (i == 0) meet[group * kHeads + 16 * warp + g + 8 * r] = mx[r];
    }
    __syncthreads();
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int h = 16 * warp + g + 8 * r;
      const float m = fmaxf(running_max[r], fmaxf(meet[h], meet[kHeads + h]));
      const float base = m == -INFINITY ? 0.0f : m;  // every row so far absent: all terms stay 0
      alpha[r] = __expf(running_max[r] - base);
      running_max[r] = m;
      float s = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float* pair = c + 4 * j + 2 * r;
        pair[0] = __expf(pair[0] - base);
        pair[1] = __expf(pair[1] - base);
        s += pair[0] + pair[1];
        // (head h, rows 32·group + 8j + 2i, + 1): 16-byte piece 4·group + j of the head's row
        *reinterpret_cast<uint32_t*>(probs + swizzled(h, 4 * group + j) + 4 * i) = bf16x2_bits(pair[0], pair[1]);
      }
      sum[r] = sum[r] * alpha[r] + s;
    }
    fence_for_tensor_cores();
    __syncthreads();

    // Values: rescale where a max grew (all lanes alike once the maxima settle), then P · V.
    if (!has_values) continue;
    if (__any_sync(kFullMask, alpha[0] != 1.0f || alpha[1] != 1.0f))
#pragma unroll
      for (int k = 0; k < 128; ++k) o[k] *= alpha[k / 2 % 2];
    wgmma_begin();
#pragma unroll
    for (int ks = 0; ks < kTileRows / 16; ++ks)  // rows 16·ks …: 32 bytes on in the probabilities' rows
      wgmma_values(o, tile_descriptor(probs + 32 * ks),
                   n_major_descriptor(rows_at + 16 * ks * 128 + 4 * group * kTileBlockBytes, kTileBlockBytes));
    wgmma_commit();
    wgmma_finish(o);
  }

  // The denominator: the lanes' and the two warpgroups' sums, then the sink.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    sum[r] += __shfl_xor_sync(kFullMask, sum[r], 1);
    sum[r] += __shfl_xor_sync(kFullMask, sum[r], 2);
  }
  __syncthreads();  // every warp is done reading the maxima
  if (i == 0)
    for (int r = 0; r < 2; ++r) meet[group * kHeads + 16 * warp + g + 8 * r] = sum[r];
  __syncthreads();
  if (!has_values) return;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t h = h0 + 16 * warp + g + 8 * r;
    if (h >= a.H) continue;
    const int hl = int(h - h0);
    const float den = meet[hl] + meet[kHeads + hl] + __expf(a.sinks[h] - running_max[r]);
    float* out = a.out + (t * a.H + h) * hd;
#pragma unroll
    for (int j = 0; j < kGroupDims / 8; ++j) {
      const int d = kGroupDims * group + 8 * j + 2 * i;
      if (d >= hd) break;
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
