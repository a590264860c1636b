// deepseek-tc's routed FP4 experts on the bf16 tensor cores (gemm_experts_tc.h).
//
// The rows are grouped by expert (row_grouping.cuh) and each block takes 64 rows of one expert
// against 256 of its output rows, so an expert's weights are read once per 64 tokens, as stored
// (FP4 nibbles and their E8M0 1×32 scales). Every operand is exact in bf16: an activation is its
// e4m3 value times its row's 1×128 scale (act_quant writes it so, QuantizedForm::scaled_bf16), a
// weight its e2m1 value times its 1×32 scale (powers of two), so the products are the exact
// path's; only the sum differs, accumulated in fp32 over the whole K on the tensor cores
// (mma.m16n8k16) where the exact path folds each 32-block's exact integer sum into fp32 in K order.
//
// K steps of 128. A step's activations (bf16), raw weight bytes and weight scales reach shared
// memory kStages − 1 steps ahead (cp.async; the scales through a register, as bf16, converted once
// per row instead of once per lane that reads them), one barrier per step.
// Each warp takes all 64 rows against 32 output rows and turns its own weights into mma operands
// in registers: a lane reads its column's 16-byte chunk (32 codes, one scale block), picks the 4
// bytes its fragments hold, and makes each code a bf16 from byte tables (its high and low bytes by
// magnitude, the sign from its top bit) times the block's scale. So each weight is converted once
// per block and read from shared memory as its 4 bits, not as a bf16 (the activations' ldmatrix
// is then most of the shared-memory traffic).
#include <cuda_bf16.h>

#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/gemm_experts_tc.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/row_grouping.cuh"
#include "backend/cuda/weight_access.cuh"

namespace dsv4::cuda {

namespace {

constexpr int kRows = kGroupTileRows, kCols = 256, kStep = 128, kStages = 3, kThreads = 256;
constexpr int kPitch = kStep + 8;    // bf16 per staged activation row (272 B): ldmatrix's 8 rows on distinct banks
constexpr int kRawRow = kStep / 2;   // bytes of a weight row per step: 4 chunks of 32 codes, one scale block each
constexpr int kChunkCodes = 32;
constexpr size_t kActBytes = size_t(kStages) * kRows * kPitch * 2, kRawBytes = size_t(kStages) * kCols * kRawRow,
                 kScaleBytes = size_t(kStages) * kCols * 8;
constexpr size_t kSmemBytes = kActBytes + kRawBytes + kScaleBytes;  // 107 520: two blocks per SM
// The copies' shares (see the kernel): a thread per weight row, 4 chunks of a step per
// activation row's 16, a step's 4 scale blocks in one word of E8M0 bytes (two of bf16).
static_assert(kThreads == kCols && kRows * 16 == 4 * kThreads && kStep == 4 * kChunkCodes);

// Where chunk c of weight row r sits in its 64 bytes: the 8 rows a warp's lanes read at once
// (one chunk each) land on distinct banks.
__device__ __forceinline__ int chunk_at(int r, int c) { return c ^ ((r >> 1) & 3); }

// Four e2m1 codes (the low 16 bits, the first in the low nibble) as four bf16, two per word.
__device__ inline uint2 e2m1x4_bf16(uint32_t n) {
  // bf16 of the magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6: high bytes, then low bytes, by code 0–7.
  constexpr uint32_t kHi0 = 0x3F3F3F00u, kHi1 = 0x40404040u, kLo0 = 0xC0800000u, kLo1 = 0xC0804000u;
  const uint32_t magnitude = n & 0x7777u;
  const uint32_t hi_pos = __byte_perm(kHi0, kHi1, magnitude),
                 hi_neg = __byte_perm(kHi0 | 0x80808080u, kHi1 | 0x80808080u, magnitude);
  const uint32_t hi = __byte_perm(hi_pos, hi_neg, 0x3210u | ((n >> 1) & 0x4444u));  // negative codes' bytes
  const uint32_t lo = __byte_perm(kLo0, kLo1, magnitude);
  return make_uint2(__byte_perm(lo, hi, 0x5140u), __byte_perm(lo, hi, 0x7362u));
}

__device__ __forceinline__ uint32_t scaled(uint32_t pair, __nv_bfloat162 scale) {  // exact: a power of two
  return bf16x2_bits(__hmul2(*reinterpret_cast<const __nv_bfloat162*>(&pair), scale));
}

// x: the activations as bf16, rows of K.
__global__ void __launch_bounds__(kThreads, 2) experts_tc_kernel(GemmRequest p, const __nv_bfloat16* x, Grouping g) {
  await_previous_kernel();
  extern __shared__ __align__(16) unsigned char smem[];
  __nv_bfloat16* act = reinterpret_cast<__nv_bfloat16*>(smem);  // [kStages][kRows][kPitch]
  uint8_t* raw = smem + kActBytes;                               // [kStages][kCols][kRawRow], chunks by chunk_at
  uint2* scales = reinterpret_cast<uint2*>(raw + kRawBytes);  // [kStages][kCols]: a row's 4 scales of a step, bf16
  __shared__ int64_t src_of[kRows], out_of[kRows];
  LinearView W;
  if (!tile_rows(p, g, kCols, src_of, out_of, W)) return;
  const int64_t n0 = int64_t(blockIdx.x) * kCols, K = p.W.in, nb = K / 2, n_steps = (K + kStep - 1) / kStep;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;

  // Thread tid copies chunk tid % 16 (8 bf16) of activation rows tid / 16 + 16j, chunk tid % 4 of
  // weight rows tid / 4 + 64h, and the scales of weight row tid.
  const int64_t n_own = n0 + tid;
  // Scale rows of whole words are read a word per step (device scales start 256-byte aligned).
  const bool own_ok = n_own < p.rows, whole_words = W.scale_cols % 4 == 0;
  const uint8_t* own_scales = scale_row<kFp4>(W, own_ok ? p.row0 + n_own : 0);
  auto issue = [&](int64_t step) {
    const int slot = int(step % kStages);
    const int64_t k0 = step * kStep;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int r = tid / 16 + 16 * j, c = tid % 16;
      const int64_t src = src_of[r], k = k0 + 8 * c;
      const bool ok = src >= 0 && k < K;
      copy_async_16(act + (slot * kRows + r) * kPitch + 8 * c, x + (ok ? src * K + k : 0), ok);
    }
#pragma unroll
    for (int h = 0; h < 4; ++h) {
      const int r = tid / 4 + 64 * h, c = tid % 4;
      const int64_t n = n0 + r, k = k0 + kChunkCodes * c;
      const bool ok = n < p.rows && k < K;
      copy_async_16(raw + (slot * kCols + r) * kRawRow + 16 * chunk_at(r, c), W.data + (ok ? (p.row0 + n) * nb + k / 2 : 0),
                    ok);
    }
  };
  auto scales_of = [&](int64_t step) {  // the E8M0 bytes of row n_own's 4 blocks in a step (byte 0 past K)
    const int64_t b0 = step * (kStep / kChunkCodes);
    if (!own_ok) return 0u;
    if (whole_words) return *reinterpret_cast<const uint32_t*>(own_scales + b0);
    uint32_t v = 0;
#pragma unroll
    for (int b = 0; b < 4; ++b)
      if (b0 + b < W.scale_cols) v |= uint32_t(own_scales[b0 + b]) << (8 * b);
    return v;
  };
  auto as_bf16 = [](uint32_t e8m0x4) {  // exact: a power of two, 2^-127 a bf16 subnormal
    uint32_t bf16[4];
#pragma unroll
    for (int b = 0; b < 4; ++b) bf16[b] = f32_to_bf16(e8m0_to_f32(uint8_t(e8m0x4 >> (8 * b))));
    return make_uint2(bf16[0] | bf16[1] << 16, bf16[2] | bf16[3] << 16);
  };

  const int wn = warp * 32, fg = lane / 4, ft = lane % 4;
  const uint32_t pick = uint32_t(ft) | uint32_t(ft + 4) << 4;  // byte ft of two words
  const int a_off = (lane % 16) * kPitch + (lane / 16) * 8;
  float acc[4][4][4] = {};  // [16-row tile][8-column tile][element of the mma's c]
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_steps) issue(s), scales[s * kCols + tid] = as_bf16(scales_of(s));
    commit_async_copies();  // (empty groups keep the count per step uniform)
  }
  for (int64_t step = 0; step < n_steps; ++step) {
    await_async_copies<kStages - 2>();  // this step's copies, this thread's
    __syncthreads();  // everyone's; and every warp is done with the slot the step ahead takes
    const int64_t ahead = step + kStages - 1;
    if (ahead < n_steps) issue(ahead);
    commit_async_copies();
    const uint32_t ahead_scales = ahead < n_steps ? scales_of(ahead) : 0u;  // stored after the products

    const int slot = int(step % kStages);
    const __nv_bfloat16* A = act + slot * kRows * kPitch + a_off;
    const uint8_t* Wr = raw + slot * kCols * kRawRow;
    const uint32_t* S = reinterpret_cast<const uint32_t*>(scales + slot * kCols + wn + fg);
    uint32_t sc[4];  // the scales of this lane's column in each 8-column tile: two blocks' bf16
#pragma unroll
    for (int q = 0; q < kStep / kChunkCodes; ++q) {
      if (q % 2 == 0)
#pragma unroll
        for (int j = 0; j < 4; ++j) sc[j] = S[2 * 8 * j + q / 2];
      uint32_t b[4][4];  // [8-column tile][b0, b1 of the first 16 codes, of the second]
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int r = wn + 8 * j + fg;
        const uint4 w = *reinterpret_cast<const uint4*>(Wr + r * kRawRow + 16 * chunk_at(r, q));
        // byte ft of each word: codes 2ft, 2ft + 1 of each 8 (the fragments' k pairs), in k order
        const uint32_t bytes = __byte_perm(__byte_perm(w.x, w.y, pick), __byte_perm(w.z, w.w, pick), 0x5410u);
        const uint32_t pair = __byte_perm(sc[j], 0, q % 2 ? 0x3232u : 0x1010u);  // the block's bf16, twice
        const __nv_bfloat162 s = *reinterpret_cast<const __nv_bfloat162*>(&pair);
        const uint2 lo = e2m1x4_bf16(bytes), hi = e2m1x4_bf16(bytes >> 16);
        b[j][0] = scaled(lo.x, s), b[j][1] = scaled(lo.y, s), b[j][2] = scaled(hi.x, s), b[j][3] = scaled(hi.y, s);
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint32_t a[4][4];
#pragma unroll
        for (int i = 0; i < 4; ++i) load_matrices<false>(a[i], A + 16 * i * kPitch + kChunkCodes * q + 16 * h);
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) mma_bf16(acc[i][j], a[i], b[j][2 * h], b[j][2 * h + 1]);
      }
    }
    if (ahead < n_steps) scales[int(ahead % kStages) * kCols + tid] = as_bf16(ahead_scales);
  }
  store_warp_tile(p, out_of, acc, 0, n0 + wn);
}

}  // namespace

bool fits_tensor_core_experts(const GemmRequest& r) {
  return r.table && r.W.format == kFp4 && !r.W.scale_is_f32 && r.W.in % kChunkCodes == 0;
}

void CudaBackend::tensor_core_experts(const GemmRequest& r, const __nv_bfloat16* x, int32_t* scratch) {
  DSV4_CUDA_REQUIRE(fits_tensor_core_experts(r), "tensor-core experts: K ", r.W.in,
                    " must be a multiple of 32 and the scales E8M0");
  if (r.T == 0 || r.rows == 0) return;
  Grouping g{};
  group_rows(r, scratch, g, stream_);
  const dim3 grid{unsigned((r.rows + kCols - 1) / kCols), unsigned(row_tile_count(r))};
  allow_shared_memory(reinterpret_cast<const void*>(experts_tc_kernel), kSmemBytes, "tensor-core experts");
  launch(experts_tc_kernel, grid, kThreads, kSmemBytes, stream_, r, x, g);
  DSV4_CUDA_LAUNCHED("linear (experts on the bf16 tensor cores)");
}

}  // namespace dsv4::cuda
