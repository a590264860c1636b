// deepseek-tc's quantized FP8 products of a few token rows (decode) on the FP8 tensor cores
// (gemm_tc.h): mma.sync m16n8k32 with e4m3 operands, so the weights stream with no conversion, where
// the exact kernel (gemm.cu) spends integer work on every code and reaches 1–1.3 TB/s.
//
// A warp takes a tile of 16 weight rows (the mma's A) against up to 8 token rows (its B: the
// activations' e4m3 codes from act_quant, QuantizedForm::codes) over a share of the K blocks of 128.
// Each lane loads 16 consecutive codes of its two rows (g = lane / 4 and g + 8) and of token g
// from every 64 codes of K, at 16 · (lane % 4): two mma steps, whose fragments the lane fills
// with those words in the same order for A and B. That permutes K inside the 64, and a sum over
// K does not depend on its order, while the loads are 16 bytes wide and a warp's cover 64 bytes
// of each row. A block of 128 K sums on the tensor cores (their reduced-precision fp32), then its
// partial is scaled by the two block scales and added to an fp32 accumulator (the official
// kernels' promotion, architecture.md §5), as the cuBLASLt path of many rows does. The 16 rows lie
// in one 128-row scale block (row0 and the tile start are multiples of 16). The S warps of a tile
// split its K blocks (warp s takes s, s + S, …), and their sums are added in warp order in shared
// memory, then rounded to bf16.
#include <cuda_runtime.h>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/gemm_tc.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/weight_access.cuh"

namespace dsv4::cuda {

namespace {

constexpr int kWarps = 8, kTileRows = 16, kTokens = 8;

struct TcGemvArgs {
  LinearView W;
  const uint8_t* x;   // [source rows][K] e4m3 codes
  const float* sx;    // [K / 128][source rows]
  int64_t n_src, x_div, K, T;
  float* y;
  int64_t y_stride, row0, rows;
  int split;          // S: warps per tile
};

// One K block of 128 for the lane: its two rows' and its token's 16-byte words of both 64s.
struct BlockWords {
  uint4 lo[2], hi[2], x[2];
};

__device__ __forceinline__ void load_weights(BlockWords& w, const uint8_t* lo, const uint8_t* hi, int64_t at) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    w.lo[h] = __ldg(reinterpret_cast<const uint4*>(lo + at + 64 * h));
    w.hi[h] = __ldg(reinterpret_cast<const uint4*>(hi + at + 64 * h));
  }
}

__device__ __forceinline__ void load_x(BlockWords& w, const uint8_t* x, bool has_token, int64_t at) {
#pragma unroll
  for (int h = 0; h < 2; ++h) w.x[h] = has_token ? __ldg(reinterpret_cast<const uint4*>(x + at + 64 * h)) : make_uint4(0, 0, 0, 0);
}

// The block's four mma steps: words 0, 1 of each 64 are the first step's A[g][4i..], A[g][16+4i..]
// (and B's b0, b1), words 2, 3 the second's.
__device__ __forceinline__ void block_products(const BlockWords& w, float (&c)[4]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t a0[4] = {w.lo[h].x, w.hi[h].x, w.lo[h].y, w.hi[h].y};
    mma_e4m3(c, a0, w.x[h].x, w.x[h].y);
    const uint32_t a1[4] = {w.lo[h].z, w.hi[h].z, w.lo[h].w, w.hi[h].w};
    mma_e4m3(c, a1, w.x[h].z, w.x[h].w);
  }
}

// Grid (tile groups of kWarps / S tiles, token groups of kTokens); see the top.
__global__ void __launch_bounds__(kWarps * 32) tc_gemv_kernel(TcGemvArgs a) {
  __shared__ float sums[kWarps][32][4];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, i = lane % 4;
  const int S = a.split, tile = blockIdx.x * (kWarps / S) + warp / S, s = warp % S;
  const int64_t r_base = int64_t(tile) * kTileRows, m0 = int64_t(blockIdx.y) * kTokens;
  const int nt = int(min(int64_t(kTokens), a.T - m0));
  const int64_t n_blocks = a.K / 128;
  // Rows past the end read the last row (their sums are not written).
  const int64_t last = a.row0 + a.rows - 1;
  const uint8_t* lo = a.W.data + min(a.row0 + r_base + g, last) * a.K + 16 * i;
  const uint8_t* hi = a.W.data + min(a.row0 + r_base + g + 8, last) * a.K + 16 * i;
  const uint8_t* s_w = scale_row<kFp8>(a.W, min(a.row0 + r_base, last));
  const bool has_token = g < nt;
  const uint8_t* x = a.x + (m0 + min(g, nt - 1)) / a.x_div * a.K + 16 * i;
  int64_t src[2];  // the source rows of the lane's two output tokens, 2i and 2i + 1
#pragma unroll
  for (int e = 0; e < 2; ++e) src[e] = (m0 + min(2 * i + e, nt - 1)) / a.x_div;

  float acc[4] = {};
  BlockWords next;
  // Weights are never written by a kernel: the first block's are in flight while the previous
  // kernel finishes.
  if (s < n_blocks) load_weights(next, lo, hi, 128 * s);
  await_previous_kernel();
  if (s < n_blocks) load_x(next, x, has_token, 128 * s);
  for (int64_t b = s; b < n_blocks; b += S) {
    const BlockWords now = next;
    if (b + S < n_blocks) load_weights(next, lo, hi, 128 * (b + S)), load_x(next, x, has_token, 128 * (b + S));
    float c[4] = {};
    block_products(now, c);
    const float sw = scale_at(s_w, b, a.W.scale_is_f32);
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[e] += c[e] * (__ldg(a.sx + b * a.n_src + src[e % 2]) * sw);  // §5: partial · (s_x · s_w)
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) sums[warp][lane][e] = acc[e];
  __syncthreads();
  if (s != 0) return;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    float v = 0.0f;
    for (int q = 0; q < S; ++q) v += sums[warp + q][lane][e];
    const int64_t row = r_base + g + 8 * (e / 2);
    const int n = 2 * i + e % 2;
    if (row < a.rows && n < nt) a.y[(m0 + n) * a.y_stride + row] = round_bf16(v);
  }
}

}  // namespace

bool tc_gemv_handles(const GemmRequest& r) {
  return !r.table && r.W.format == kFp8 && r.T < TensorCoreGemm::kMinRows && r.W.in % 128 == 0 &&
         r.row0 % kTileRows == 0 && r.rows > 0;
}

void tc_gemv(const GemmRequest& r, const uint8_t* x_codes, const float* x_scales, int sm_count, cudaStream_t stream) {
  const int64_t tiles = (r.rows + kTileRows - 1) / kTileRows, groups = (r.T + kTokens - 1) / kTokens;
  const int64_t n_blocks = r.W.in / 128;
  // S: the fewest warps per tile that give every SM 16 warps, while each keeps a K block.
  int split = 1;
  while (split < kWarps && 2 * split <= n_blocks && tiles * groups * split < 16 * int64_t(sm_count)) split *= 2;
  const int64_t tile_groups = (tiles + kWarps / split - 1) / (kWarps / split);
  DSV4_CUDA_REQUIRE(groups < 65536 && tile_groups < (int64_t(1) << 31), "tc_gemv: ", r.T, " tokens × ", r.rows,
                    " rows exceed the launch limits");
  TcGemvArgs a{};
  a.W = r.W, a.x = x_codes, a.sx = x_scales, a.n_src = r.source_rows(), a.x_div = r.x_div, a.K = r.W.in, a.T = r.T;
  a.y = r.y, a.y_stride = r.y_stride, a.row0 = r.row0, a.rows = r.rows, a.split = split;
  launch(tc_gemv_kernel, dim3(unsigned(tile_groups), unsigned(groups)), kWarps * 32, 0, stream, a);
  DSV4_CUDA_LAUNCHED("tc_gemv");
}

}  // namespace dsv4::cuda
