// deepseek-tc's routed FP4 experts on the bf16 tensor cores (gemm_experts_tc.h).
//
// The rows are grouped by expert (row_grouping.cuh) and each block takes 64 rows of one expert
// against 128 of its output rows, so an expert's weights are read once per 64 tokens, as stored
// (FP4 nibbles and their E8M0 1×32 scales). Every operand is exact in bf16: an activation is its
// e4m3 value times its row's 1×128 scale, a weight its e2m1 value times its 1×32 scale (powers of
// two), so the products are the exact path's; only the sum differs, accumulated in fp32 over the
// whole K on the tensor cores (mma.m16n8k16) where the exact path folds each 32-block's exact
// integer sum into fp32 in K order.
//
// K steps of 32, one FP4 scale block: each thread loads its share of the next step into registers
// (8 activations; 16 weight nibbles and their scale) while the current one is summed from shared
// memory, then converts it: activations times their scale, weights through byte tables (a code's
// bf16 high and low bytes picked by its magnitude, the sign from its top bit) times theirs. The 8
// warps take 32 × 32 of the block's 64 × 128 each.
#include <cuda_bf16.h>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/gemm_experts_tc.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/row_grouping.cuh"
#include "backend/cuda/weight_access.cuh"

namespace dsv4::cuda {

namespace {

constexpr int kRows = kGroupTileRows, kCols = 128, kStep = 32, kThreads = 256;
constexpr int kPitch = kStep + 8;  // bf16 per staged row (80 B): ldmatrix's 8 rows on distinct banks

// One thread's share of a step: activations of row threadIdx.x / 4, elements 8 · (threadIdx.x % 4)
// on; weight nibbles of output row threadIdx.x / 2, elements 16 · (threadIdx.x % 2) on.
struct Staged {
  float4 x[2];
  float sx;
  uint2 w;
  float sw;
};

__device__ inline uint32_t bf16x2_bits(__nv_bfloat162 v) { return *reinterpret_cast<const uint32_t*>(&v); }

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

__device__ inline uint32_t scaled(uint32_t pair, __nv_bfloat162 scale) {  // exact: scale is a power of two
  return bf16x2_bits(__hmul2(*reinterpret_cast<const __nv_bfloat162*>(&pair), scale));
}

__global__ void __launch_bounds__(kThreads) experts_tc_kernel(GemmRequest p, const float* sxs, Grouping g) {
  await_previous_kernel();
  __shared__ __align__(16) __nv_bfloat16 As[kRows][kPitch];
  __shared__ __align__(16) __nv_bfloat16 Bs[kCols][kPitch];
  __shared__ int64_t src_of[kRows], out_of[kRows];
  LinearView W;
  if (!tile_rows(p, g, kCols, src_of, out_of, W)) return;
  const int64_t n0 = int64_t(blockIdx.x) * kCols, K = p.W.in, nb = K / 2, n_k128 = (K + 127) / 128;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int ra = tid / 4, pa = tid % 4, rb = tid / 2, hb = tid % 2;
  const int64_t src = src_of[ra], n = n0 + rb;
  const float* x_row = src >= 0 ? p.x + src * p.x_stride : nullptr;
  const uint8_t* w_row = n < p.rows ? W.data + (p.row0 + n) * nb : nullptr;

  auto load = [&](Staged& st, int64_t k0) {
    if (x_row) {
      st.x[0] = *reinterpret_cast<const float4*>(x_row + k0 + 8 * pa);
      st.x[1] = *reinterpret_cast<const float4*>(x_row + k0 + 8 * pa + 4);
      st.sx = sxs[src * n_k128 + k0 / 128];
    } else {
      st.x[0] = st.x[1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f), st.sx = 0.0f;
    }
    if (w_row) {
      st.w = *reinterpret_cast<const uint2*>(w_row + k0 / 2 + 8 * hb);
      st.sw = block_scale<kFp4>(W, p.row0 + n, k0);
    } else {
      st.w = make_uint2(0u, 0u), st.sw = 0.0f;
    }
  };
  auto store = [&](const Staged& st) {
    const float s = st.sx;
    *reinterpret_cast<uint4*>(&As[ra][8 * pa]) =
        make_uint4(bf16x2_bits(__floats2bfloat162_rn(st.x[0].x * s, st.x[0].y * s)),
                   bf16x2_bits(__floats2bfloat162_rn(st.x[0].z * s, st.x[0].w * s)),
                   bf16x2_bits(__floats2bfloat162_rn(st.x[1].x * s, st.x[1].y * s)),
                   bf16x2_bits(__floats2bfloat162_rn(st.x[1].z * s, st.x[1].w * s)));
    const __nv_bfloat162 scale = __float2bfloat162_rn(st.sw);
    const uint2 q0 = e2m1x4_bf16(st.w.x), q1 = e2m1x4_bf16(st.w.x >> 16), q2 = e2m1x4_bf16(st.w.y),
                q3 = e2m1x4_bf16(st.w.y >> 16);
    uint4* dst = reinterpret_cast<uint4*>(&Bs[rb][16 * hb]);
    dst[0] = make_uint4(scaled(q0.x, scale), scaled(q0.y, scale), scaled(q1.x, scale), scaled(q1.y, scale));
    dst[1] = make_uint4(scaled(q2.x, scale), scaled(q2.y, scale), scaled(q3.x, scale), scaled(q3.y, scale));
  };

  const int wm = warp / 4 * 32, wn = warp % 4 * 32;
  const __nv_bfloat16* a_at = &As[wm + lane % 16][(lane / 16) * 8];
  const __nv_bfloat16* b_at = &Bs[wn + lane % 8 + (lane / 16) * 8][(lane / 8) % 2 * 8];
  float acc[2][4][4] = {};
  Staged st;
  load(st, 0);
  for (int64_t k0 = 0; k0 < K; k0 += kStep) {
    store(st);
    __syncthreads();
    if (k0 + kStep < K) load(st, k0 + kStep);
#pragma unroll
    for (int kk = 0; kk < kStep; kk += 16) {
      uint32_t a[2][4], b[2][4];
#pragma unroll
      for (int i = 0; i < 2; ++i) load_matrices<false>(a[i], a_at + 16 * i * kPitch + kk);
#pragma unroll
      for (int j = 0; j < 2; ++j) load_matrices<false>(b[j], b_at + 16 * j * kPitch + kk);
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) mma_bf16(acc[i][j], a[i], b[j / 2][2 * (j % 2)], b[j / 2][2 * (j % 2) + 1]);
    }
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = wm + 16 * i + lane / 4 + (e >= 2 ? 8 : 0);
        const int64_t m = out_of[row], col = n0 + wn + 8 * j + 2 * (lane % 4) + (e & 1);
        if (m >= 0 && col < p.rows) p.y[m * p.y_stride + col] = round_bf16(acc[i][j][e]);
      }
}

}  // namespace

bool fits_tensor_core_experts(const GemmRequest& r) {
  return r.table && r.W.format == kFp4 && r.W.in % kStep == 0;
}

int64_t tensor_core_experts_scratch_ints(const GemmRequest& r) {
  Grouping g;
  return lay_out_grouping(r, nullptr, g);
}

void tensor_core_experts(const GemmRequest& r, const float* sx, int32_t* scratch, cudaStream_t stream) {
  DSV4_CUDA_REQUIRE(fits_tensor_core_experts(r) && r.x_stride % 4 == 0, "tensor-core experts: K ", r.W.in,
                    ", activation rows of ", r.x_stride);
  if (r.T == 0 || r.rows == 0) return;
  Grouping g{};
  group_rows(r, scratch, g, stream);
  const dim3 grid{unsigned((r.rows + kCols - 1) / kCols), unsigned(row_tile_count(r))};
  launch(experts_tc_kernel, grid, kThreads, 0, stream, r, sx, g);
  DSV4_CUDA_LAUNCHED("linear (experts on the bf16 tensor cores)");
}

}  // namespace dsv4::cuda
