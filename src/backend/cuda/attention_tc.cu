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
// One block of 8 warps per (query, 64 heads): the heads of a query share its rows (one KV head),
// so both products have the heads as M. The rows come in tiles of 64 (12% faster than 32 at a
// 256K prompt: fewer barriers and max exchanges per row):
//   staging: each thread copies its share of one bf16 row with cp.async (no registers) into a
//     tile slot, the next tile's while the current one is summed; zeros for skipped or missing rows;
//   logits: warp (r, c) takes heads 16r … 16r + 15 against the tile's c-th half of rows over all dims;
//   softmax: the two warps of a head row meet in shared memory for the tile's max, then write the
//     bf16 probabilities;
//   values: warp (r, c) adds P · V for its 16 heads over dims 256c … 256c + 255 (128 fp32
//     accumulators per lane), rescaled first when a max grew.
// The query (64 × 512 bf16), two tile slots and the probabilities take 205 KB of shared memory:
// one block per SM, its 256 threads with up to 255 registers each.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/attention_rows.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/launch.cuh"

namespace dsv4::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kHeads = 64;                  // per block: 4 warp rows of 16
constexpr int kTileRows = 64;               // rows per step: the logits' N, the values' K
constexpr int kColRows = kTileRows / 2;     // the logits' rows per warp column
constexpr int kRowTiles = kColRows / 8;     // their mma tiles of 8 rows
constexpr int kMaxDim = 512;                // two warp columns of 256 dims
constexpr int kPitch = kMaxDim + 8;         // bf16 per staged head or row: 1 040 B, so ldmatrix's 8 rows hit distinct banks
constexpr int kProbPitch = kTileRows + 8;   // bf16 per head of probabilities (144 B: distinct banks too)
constexpr int kValueDims = kMaxDim / 2;     // per warp column
constexpr int kValueTiles = kValueDims / 8;  // fp32 accumulator fragments per lane (4 floats each)

constexpr size_t kQueryBytes = size_t(kHeads) * kPitch * 2, kTileBytes = size_t(kTileRows) * kPitch * 2,
                 kProbBytes = size_t(kHeads) * kProbPitch * 2;
constexpr size_t kSmemBytes = kQueryBytes + 2 * kTileBytes + kProbBytes + 2 * kHeads * sizeof(float) +
                              2 * kTileRows * sizeof(int);

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

// Block (query t, heads h0 … h0 + 63); `window` and `compressed` are a.swa.kv and a.comp.kv as bf16
// rows of a.hd (same row numbers).
__global__ void __launch_bounds__(kThreads, 1)
    tc_attention_kernel(AttnArgs a, const __nv_bfloat16* window, const __nv_bfloat16* compressed) {
  await_previous_kernel();
  extern __shared__ __align__(16) unsigned char smem[];
  __nv_bfloat16* qs = reinterpret_cast<__nv_bfloat16*>(smem);                        // [kHeads][kPitch]
  __nv_bfloat16* tiles = reinterpret_cast<__nv_bfloat16*>(smem + kQueryBytes);      // [2][kTileRows][kPitch]
  __nv_bfloat16* probs = tiles + 2 * kTileRows * kPitch;                             // [kHeads][kProbPitch]
  float* meet = reinterpret_cast<float*>(probs + kHeads * kProbPitch);               // [2][kHeads]
  int* present = reinterpret_cast<int*>(meet + 2 * kHeads);                          // [2][kTileRows]

  const int64_t t = blockIdx.x, h0 = int64_t(blockIdx.y) * kHeads;
  const int hd = int(a.hd);
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, g = lane / 4, i = lane % 4;
  const int head_row = warp / 2, col = warp % 2;  // heads 16·head_row …; rows kColRows·col …, dims 256·col …
  const QueryRows rows(a, t);
  const int n_tiles = int((rows.n + kTileRows - 1) / kTileRows);

  // The query's heads as bf16, zeros past H (dims past hd are never read).
  for (int e = tid; e < kHeads * (hd / 4); e += kThreads) {
    const int h = e / (hd / 4), d0 = 4 * (e % (hd / 4));
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (h0 + h < a.H) v = *reinterpret_cast<const float4*>(a.q + (t * a.H + h0 + h) * hd + d0);
    *reinterpret_cast<uint2*>(qs + h * kPitch + d0) = make_uint2(bf16x2_bits(v.x, v.y), bf16x2_bits(v.z, v.w));
  }

  // Staging: thread (row r, part u) copies every 8th 16-byte piece of rows r, r + 32, … of a tile.
  auto stage = [&](int tile, int slot) {
    for (int r = tid / 8; r < kTileRows; r += kThreads / 8) {
      const RowIndex ref = rows.index(a, t, int64_t(tile) * kTileRows + r);
      const __nv_bfloat16* src = (ref.window ? window : compressed) + (ref.i >= 0 ? ref.i : 0) * a.hd;
      __nv_bfloat16* dst = tiles + (slot * kTileRows + r) * kPitch;
      for (int c = tid % 8; c < hd / 8; c += 8) copy_async_16(dst + 8 * c, src + 8 * c, ref.i >= 0);  // else zeros
      if (tid % 8 == 0) present[slot * kTileRows + r] = ref.i >= 0;
    }
  };

  // ldmatrix row addresses of this lane (see load_matrices): the query's A fragments; slot 0's tile
  // as the logits' B (rows as N) and as the values' B (rows as K, transposed); the probabilities' A.
  const __nv_bfloat16* q_at = qs + (16 * head_row + lane % 16) * kPitch + (lane / 16) * 8;
  const __nv_bfloat16* key_at = tiles + (kColRows * col + lane % 8 + (lane / 16) * 8) * kPitch + (lane / 8) % 2 * 8;
  const __nv_bfloat16* value_at = tiles + (lane % 8 + (lane / 8) % 2 * 8) * kPitch + kValueDims * col + (lane / 16) * 8;
  const __nv_bfloat16* prob_at = probs + (16 * head_row + lane % 16) * kProbPitch + (lane / 16) * 8;

  float o[kValueTiles][4] = {};
  float running_max[2] = {-INFINITY, -INFINITY}, sum[2] = {0.0f, 0.0f};  // heads g, g + 8 of the head row

  // Each tile's copies are one group, issued while the tile before is summed and awaited at the
  // start of its own step, once every warp has left the slot they refill.
  stage(0, 0);
  commit_async_copies();
  for (int tile = 0; tile < n_tiles; ++tile) {
    const int slot = tile % 2, slot_at = slot * kTileRows * kPitch;
    await_async_copies<0>();  // this tile's copies
    __syncthreads();          // every thread's copies landed; every warp is done with the last tile
    if (tile + 1 < n_tiles) stage(tile + 1, slot ^ 1);  // (into the slot the last tile left)
    commit_async_copies();

    // Logits: c[n][k] is head 16·head_row + g + 8·(k / 2), tile row kColRows·col + 8n + 2i + k % 2.
    float c[kRowTiles][4] = {};
    for (int kk = 0; kk < hd / 16; ++kk) {
      uint32_t qa[4];
      load_matrices<false>(qa, q_at + 16 * kk);
#pragma unroll
      for (int n = 0; n < kRowTiles; n += 2) {
        uint32_t kb[4];
        load_matrices<false>(kb, key_at + slot_at + 8 * n * kPitch + 16 * kk);
        mma_bf16(c[n], qa, kb[0], kb[1]);
        mma_bf16(c[n + 1], qa, kb[2], kb[3]);
      }
    }
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < kRowTiles; ++n)
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const bool here = present[slot * kTileRows + kColRows * col + 8 * n + 2 * i + k % 2];
        c[n][k] = here ? c[n][k] * a.softmax_scale : -INFINITY;
        mx[k / 2] = fmaxf(mx[k / 2], c[n][k]);
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(kFullMask, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(kFullMask, mx[r], 2));
      if (i == 0) meet[col * kHeads + 16 * head_row + g + 8 * r] = mx[r];
    }
    __syncthreads();
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int h = 16 * head_row + g + 8 * r;
      const float m = fmaxf(running_max[r], fmaxf(meet[h], meet[kHeads + h]));
      const float base = m == -INFINITY ? 0.0f : m;  // every row so far absent: all terms stay 0
      alpha[r] = __expf(running_max[r] - base);
      running_max[r] = m;
      float s = 0.0f;
#pragma unroll
      for (int n = 0; n < kRowTiles; ++n) {
        c[n][2 * r] = __expf(c[n][2 * r] - base);
        c[n][2 * r + 1] = __expf(c[n][2 * r + 1] - base);
        s += c[n][2 * r] + c[n][2 * r + 1];
        *reinterpret_cast<uint32_t*>(probs + h * kProbPitch + kColRows * col + 8 * n + 2 * i) =
            bf16x2_bits(c[n][2 * r], c[n][2 * r + 1]);
      }
      sum[r] = sum[r] * alpha[r] + s;
    }
    __syncthreads();

    // Values: rescale where a max grew (all lanes alike once the maxima settle), then P · V.
    if (__any_sync(kFullMask, alpha[0] != 1.0f || alpha[1] != 1.0f))
#pragma unroll
      for (int n = 0; n < kValueTiles; ++n) o[n][0] *= alpha[0], o[n][1] *= alpha[0], o[n][2] *= alpha[1], o[n][3] *= alpha[1];
#pragma unroll
    for (int ks = 0; ks < kTileRows / 16; ++ks) {
      uint32_t pa[4];
      load_matrices<false>(pa, prob_at + 16 * ks);
#pragma unroll
      for (int np = 0; np < kValueTiles / 2; ++np) {
        if (kValueDims * col + 16 * np >= hd) break;
        uint32_t vb[4];
        load_matrices<true>(vb, value_at + slot_at + 16 * ks * kPitch + 16 * np);
        mma_bf16(o[2 * np], pa, vb[0], vb[1]);
        mma_bf16(o[2 * np + 1], pa, vb[2], vb[3]);
      }
    }
  }

  // The denominator: the lanes' and the two column warps' sums, then the sink.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    sum[r] += __shfl_xor_sync(kFullMask, sum[r], 1);
    sum[r] += __shfl_xor_sync(kFullMask, sum[r], 2);
  }
  __syncthreads();  // every warp is done reading the maxima
  if (i == 0)
    for (int r = 0; r < 2; ++r) meet[col * kHeads + 16 * head_row + g + 8 * r] = sum[r];
  __syncthreads();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t h = h0 + 16 * head_row + g + 8 * r;
    if (h >= a.H) continue;
    const int hl = int(h - h0);
    const float den = meet[hl] + meet[kHeads + hl] + __expf(a.sinks[h] - running_max[r]);
    float* out = a.out + (t * a.H + h) * hd;
#pragma unroll
    for (int n = 0; n < kValueTiles; ++n) {
      const int d = kValueDims * col + 8 * n + 2 * i;
      if (d >= hd) break;
      *reinterpret_cast<float2*>(out + d) =
          make_float2(round_if(a.bf16, o[n][2 * r] / den), round_if(a.bf16, o[n][2 * r + 1] / den));
    }
  }
}

}  // namespace

bool fits_tensor_core_attention(const AttnArgs& a) {
  const bool compact_rows = !a.comp.kv || a.comp.format.kind == RowFormat::fp8_bf16;
  return a.hd % 16 == 0 && a.hd <= kMaxDim && compact_rows;
}

void CudaBackend::tensor_core_attention(const AttnArgs& a, int64_t T) {
  DSV4_CUDA_REQUIRE(fits_tensor_core_attention(a), "tensor-core attention: head dim ", a.hd, ", rows of kind ",
                    int(a.comp.format.kind));
  DeviceArray<__nv_bfloat16> window(stream_, size_t(a.swa.n * a.hd));
  launch(window_bf16_kernel, grid_for(a.swa.n * a.hd, 256), 256, 0, stream_, a.swa.kv, a.swa.n * a.hd, window.get());
  DSV4_CUDA_LAUNCHED("attention (window as bf16)");
  const int64_t n_comp = a.comp.kv ? a.comp.n : 0;
  DeviceArray<__nv_bfloat16> compressed(stream_, size_t(std::max<int64_t>(n_comp, 1) * a.hd));
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
