// Many-row matrix products on the tensor cores, exact to the canonical arithmetic (gemm_dmma.h
// says why): the double paths and the quantized FP8 products on the FP64 tensor cores, the
// quantized FP4 products (the routed experts) on the integer ones.
//
// FP64 tiling: a block of 4 warps computes 64 token rows × 64 output rows, stepping K by 32. Each
// step stages both operands in shared memory as doubles (the e4m3 / bf16 / fp32 values converted
// exactly), then every warp runs mma.m8n8k4.f64 over its 32 × 32 quarter (4 × 4 fragments of
// 8 × 8). In the quantized path the double fragments hold one K tile of 128 and are folded into
// fp32 accumulators at each tile's end, in increasing K: partial · (s_x · s_w), exactly as the CPU
// does. The integer path (imma_fp4_kernel) is described where it starts.
//
// Routed experts (a table of views): the rows are first grouped by expert (a counting sort on the
// device), and each block takes 64 rows of one group, so an expert's weights are read once per 64
// tokens instead of once per token. Rows without an expert form a last group that writes zeros.
#include "backend/cuda/gemm_dmma.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/quant.cuh"
#include "backend/cuda/weight_access.cuh"

namespace dsv4::cuda {

namespace {

constexpr int kBM = 64, kBN = 64, kBK = 32, kThreads = 128;
// Row pitch of the staged tiles, in doubles: +4 puts the 8 × 4 fragment reads of a half-warp on
// 16 distinct bank pairs.
constexpr int kPitch = kBK + 4;

// Visits the 4 × 4 fragments of 8 × 8 (two elements each) that a lane holds of its warp's 32 × 32
// quarter at (wm, wn): f(i, j, c, row, col) for d[i][j][c], at (row, col) of the block's tile (the
// accumulator layout of mma.m8n8k4: lane = 4 · fg + ft holds row fg, columns 2 · ft and 2 · ft + 1).
// col is 64-bit like the output columns it is added to (in 32 bits the FP4 kernel takes 16 more
// registers).
template <class F>
__device__ __forceinline__ void for_each_fragment_element(int wm, int wn, int fg, int ft, F&& f) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) f(i, j, c, wm + i * 8 + fg, int64_t(wn) + j * 8 + 2 * ft + c);
}

// Rows grouped by view: group g < n_views holds the rows of view g, group n_views those without
// one. offsets[g] is the group's first position in `order`, offsets[n_views + 1] = T; every
// 64-row tile of a group is listed in tile_group / tile_row0 (−1 past the last).
struct Grouping {
  int32_t* counts;   // [n_views + 1]
  int32_t* offsets;  // [n_views + 2]
  int32_t* cursor;   // [n_views + 1]
  int32_t* order;    // [T]
  int32_t* tile_group;
  int32_t* tile_row0;
  int64_t max_tiles;
};

__device__ __forceinline__ int64_t group_of(const int32_t* view_of_row, int64_t m, int64_t n_views) {
  const int32_t v = view_of_row[m];
  return v >= 0 && v < n_views ? v : n_views;
}

__global__ void count_rows_kernel(const int32_t* view_of_row, int64_t T, int64_t n_views, Grouping g) {
  for (int64_t m = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; m < T; m += int64_t(gridDim.x) * blockDim.x)
    atomicAdd(&g.counts[group_of(view_of_row, m, n_views)], 1);
}

// One thread: the groups are few (the experts of a layer), the tiles at most T/64 + groups.
__global__ void plan_tiles_kernel(int64_t n_views, Grouping g) {
  int64_t tile = 0, start = 0;
  for (int64_t v = 0; v <= n_views; ++v) {
    g.offsets[v] = int32_t(start);
    g.cursor[v] = int32_t(start);
    for (int64_t r = 0; r < g.counts[v]; r += kBM, ++tile) {
      g.tile_group[tile] = int32_t(v);
      g.tile_row0[tile] = int32_t(start + r);
    }
    start += g.counts[v];
  }
  g.offsets[n_views + 1] = int32_t(start);
  for (; tile < g.max_tiles; ++tile) g.tile_group[tile] = -1;
}

// The order of rows inside a group follows the atomics, so it varies from run to run; each row's
// result does not depend on it.
__global__ void scatter_rows_kernel(const int32_t* view_of_row, int64_t T, int64_t n_views, Grouping g) {
  for (int64_t m = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; m < T; m += int64_t(gridDim.x) * blockDim.x)
    g.order[atomicAdd(&g.cursor[group_of(view_of_row, m, n_views)], 1)] = int32_t(m);
}

// The kernels' common start: the block's 64 token rows (out_of: the y row, src_of: the x / qx
// row, −1 for none) and its weights. Returns false when the block has nothing to compute: no
// tile, or rows routed to no expert, whose outputs it sets to zero (they contribute nothing, as on
// the CPU). Called by every thread; ends with a barrier.
__device__ bool tile_rows(const GemmRequest& p, const Grouping& g, int64_t* src_of, int64_t* out_of, LinearView& W) {
  W = p.W;
  bool zeros = false;
  if (p.table) {
    const int32_t group = g.tile_group[blockIdx.y];
    if (group < 0) return false;
    const int64_t r0 = g.tile_row0[blockIdx.y], end = g.offsets[group + 1];
    zeros = group == p.n_views;
    if (!zeros) W = p.table[group];
    for (int i = threadIdx.x; i < kBM; i += blockDim.x) {
      const int64_t m = r0 + i < end ? g.order[r0 + i] : -1;
      out_of[i] = m;
      src_of[i] = m < 0 ? -1 : m / p.x_div;
    }
  } else {
    const int64_t r0 = int64_t(blockIdx.y) * kBM;
    for (int i = threadIdx.x; i < kBM; i += blockDim.x) {
      const int64_t m = r0 + i < p.T ? r0 + i : -1;
      out_of[i] = m;
      src_of[i] = m < 0 ? -1 : m / p.x_div;
    }
  }
  __syncthreads();
  if (!zeros) return true;
  const int64_t n0 = int64_t(blockIdx.x) * kBN;
  for (int i = threadIdx.x; i < kBM * kBN; i += blockDim.x) {
    const int r = i / kBN, c = i % kBN;
    if (out_of[r] >= 0 && n0 + c < p.rows) p.y[out_of[r] * p.y_stride + n0 + c] = 0.0f;
  }
  return false;
}

// The kernel's arguments: the request (with the quantized activations as x) and what dmma_gemm
// adds to it. sx is read through this struct on purpose: copied to a local or passed as a
// parameter of its own, it raised the FP8 kernel from 128 to 162 registers (fewer blocks per SM).
struct DmmaArgs {
  GemmRequest r;
  const float* sx;  // quantized: the activation scales [n_src, K/128]; nullptr in the double paths
  bool round_out;   // double paths: round the results to bf16
};

template <int kFormat, bool kTiled>
__global__ void __launch_bounds__(kThreads) dmma_kernel(DmmaArgs args, Grouping g) {
  const GemmRequest& p = args.r;
  __shared__ double As[kBM][kPitch];
  __shared__ double Bs[kBN][kPitch];
  __shared__ int64_t src_of[kBM];  // the x / qx row of each tile row, −1 for none
  __shared__ int64_t out_of[kBM];  // its y row

  LinearView W;
  if (!tile_rows(p, g, src_of, out_of, W)) return;
  const int64_t n0 = int64_t(blockIdx.x) * kBN, K = p.W.in;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = (warp / 2) * 32, wn = (warp % 2) * 32, fg = lane / 4, ft = lane % 4;
  static_assert(!kTiled || kFormat == kFp8, "quantized FP4 products run on the integer tensor cores (imma_fp4_kernel)");
  constexpr int64_t kTile = 128;
  double d[4][4][2] = {};
  float acc[4][4][2] = {};

  for (int64_t k0 = 0; k0 < K; k0 += kBK) {
    for (int i = threadIdx.x; i < kBM * kBK; i += kThreads) {
      const int r = i / kBK, c = i % kBK;
      const int64_t s = src_of[r], k = k0 + c;
      float v = 0.0f;
      if (s >= 0 && k < K) v = p.x[s * p.x_stride + k];
      As[r][c] = v;
    }
    for (int i = threadIdx.x; i < kBN * kBK; i += kThreads) {
      const int r = i / kBK, c = i % kBK;
      const int64_t n = n0 + r, k = k0 + c;
      float v = 0.0f;
      if (n < p.rows && k < K) {
        const int64_t o = p.row0 + n;
        v = kTiled ? stored_value<kFormat>(W, o, k) : dequantized<kFormat>(W, o, k);
      }
      Bs[r][c] = v;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 4) {
      double a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = As[wm + i * 8 + fg][kk + ft];
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = Bs[wn + j * 8 + fg][kk + ft];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) dmma(d[i][j], a[i], b[j]);
    }
    __syncthreads();

    // Quantized: the K tile ending here is complete; fold its exact partials (kBK divides kTile,
    // so [k0, k0 + kBK) lies inside the tile starting at kt).
    if (kTiled && ((k0 + kBK) % kTile == 0 || k0 + kBK >= K)) {
      const int64_t kt = k0 / kTile * kTile;
      for_each_fragment_element(wm, wn, fg, ft, [&](int i, int j, int c, int row, int64_t col) {
        const int64_t s = src_of[row], n = n0 + col;
        if (s >= 0 && n < p.rows) {
          const float partial = float(d[i][j][c]);
          const float s_x = args.sx[s * ((K + 127) / 128) + kt / 128];
          const float s_w = block_scale<kFormat>(W, p.row0 + n, kt);
          acc[i][j][c] += partial * (s_x * s_w);  // the FP8 kernel's order (§5)
        }
        d[i][j][c] = 0.0;
      });
    }
  }

  for_each_fragment_element(wm, wn, fg, ft, [&](int i, int j, int c, int row, int64_t col) {
    const int64_t m = out_of[row], n = n0 + col;
    if (m < 0 || n >= p.rows) return;
    float v;
    if (kTiled) {
      v = round_bf16(acc[i][j][c]);
    } else {
      v = float(d[i][j][c]);
      if (args.round_out) v = round_bf16(v);
    }
    p.y[m * p.y_stride + n] = v;
  });
}

// ---- FP4 weights, quantized: the integer tensor cores ------------------------------------------
// An FP4 K tile's partial is an integer sum (gemm.cu's top): with the activations' e4m3 values as
// k = x · 2^9 in three byte planes (k = b0 + 2^8 b1 + 2^16 b2, b2 signed; act_quant_kernel writes
// them, 24 words per 32-element tile: 8 groups of 4 elements × 3 planes) and the weights as the
// int8 2·e2m1, one mma.m16n8k32 per plane sums a tile exactly in int32 for 16 tokens × 8 outputs,
// s0 + 2^8 s1 + 2^16 s2 (< 2^27) is the tile's Σ k·w2, and float(·) · 2^-10 is the CPU's partial.
// Each 32-wide K step ends a tile, so the fold (partial · s_x) · s_w runs right after its products,
// in increasing K like the CPU's. Tiling as dmma_kernel: 64 × 64 per block, a 32 × 32 quarter per
// warp (2 × 4 fragments of 16 × 8); a stage holds 4 tiles (one activation scale block of 128).
constexpr int kImmaTiles = 4;
constexpr int kPlaneWordsPerTile = 24;
// Row pitches in shared memory, in words: ≡ 4 (mod 32), so the 32 lanes of a fragment load hit
// 32 distinct banks (A: 4g + 3i + plane, B: 4g + i).
constexpr int kAPitch = kImmaTiles * kPlaneWordsPerTile + 4;
constexpr int kBPitch = kImmaTiles * 8 + 4;

__global__ void __launch_bounds__(kThreads) imma_fp4_kernel(DmmaArgs args, Grouping g) {
  const GemmRequest& p = args.r;
  __shared__ __align__(16) uint32_t As[kBM * kAPitch];  // activation planes of the stage's tiles
  __shared__ __align__(16) uint32_t Bs[kBN * kBPitch];  // weights as int8, 8 words per tile
  __shared__ float sx_s[kBM];                           // the stage's activation scale per row
  __shared__ float sw_s[kBN][kImmaTiles];               // the weight scale per output and tile
  __shared__ int64_t src_of[kBM], out_of[kBM];

  LinearView W;
  if (!tile_rows(p, g, src_of, out_of, W)) return;
  const int64_t n0 = int64_t(blockIdx.x) * kBN, K = p.W.in, n_tiles = (K + 31) / 32, n_k128 = (K + 127) / 128;
  const uint32_t* planes = reinterpret_cast<const uint32_t*>(p.x);  // rows of p.x_stride = n_tiles · 24 words
  const bool w_vec = row_bytes(kFp4, K) % 16 == 0;                   // device weights start 256-byte aligned

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = (warp / 2) * 32, wn = (warp % 2) * 32, fg = lane / 4, ft = lane % 4;
  float acc[2][4][4] = {};  // [m fragment][n fragment][element of the mma's c]

  for (int64_t t0 = 0; t0 < n_tiles; t0 += kImmaTiles) {
    constexpr int kRowVectors = kImmaTiles * kPlaneWordsPerTile / 4;  // uint4 per row and stage
    for (int i = threadIdx.x; i < kBM * kRowVectors; i += kThreads) {
      const int r = i / kRowVectors, v = i % kRowVectors;
      const int64_t s = src_of[r];
      uint4 val = make_uint4(0, 0, 0, 0);
      if (s >= 0 && t0 + v / (kPlaneWordsPerTile / 4) < n_tiles)
        val = __ldg(reinterpret_cast<const uint4*>(planes + s * p.x_stride + t0 * kPlaneWordsPerTile) + v);
      *reinterpret_cast<uint4*>(As + r * kAPitch + 4 * v) = val;
    }
    for (int i = threadIdx.x; i < kBN * kImmaTiles; i += kThreads) {
      const int r = i / kImmaTiles, t = i % kImmaTiles;
      const int64_t n = n0 + r, tile = t0 + t;
      const bool ok = n < p.rows && tile < n_tiles;
      const uint4 w = ok ? row_chunk(W, p.row0 + n, tile, K, w_vec) : make_uint4(0, 0, 0, 0);
      uint32_t q[8];
      fp4_to_int8x8(w.x, q[0], q[1]);
      fp4_to_int8x8(w.y, q[2], q[3]);
      fp4_to_int8x8(w.z, q[4], q[5]);
      fp4_to_int8x8(w.w, q[6], q[7]);
      uint4* dst = reinterpret_cast<uint4*>(Bs + r * kBPitch + 8 * t);
      dst[0] = make_uint4(q[0], q[1], q[2], q[3]);
      dst[1] = make_uint4(q[4], q[5], q[6], q[7]);
      sw_s[r][t] = ok ? block_scale<kFp4>(W, p.row0 + n, tile * 32) : 0.0f;
    }
    for (int r = threadIdx.x; r < kBM; r += kThreads)
      sx_s[r] = src_of[r] >= 0 ? args.sx[src_of[r] * n_k128 + t0 / 4] : 0.0f;
    __syncthreads();

#pragma unroll
    for (int t = 0; t < kImmaTiles; ++t) {
      if (t0 + t >= n_tiles) break;
      uint32_t b[4][2];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t* bp = Bs + (wn + 8 * j + fg) * kBPitch + 8 * t;
        b[j][0] = bp[ft];
        b[j][1] = bp[4 + ft];
      }
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int row = wm + 16 * i + fg;  // and row + 8
        const uint32_t* ap = As + row * kAPitch + kPlaneWordsPerTile * t;
        uint32_t a[3][4];  // [plane][fragment register]
#pragma unroll
        for (int pl = 0; pl < 3; ++pl) {
          a[pl][0] = ap[3 * ft + pl];
          a[pl][1] = ap[8 * kAPitch + 3 * ft + pl];
          a[pl][2] = ap[3 * (4 + ft) + pl];
          a[pl][3] = ap[8 * kAPitch + 3 * (4 + ft) + pl];
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          int s0[4], s1[4], s2[4];
          mma_i8<true>(s0, a[0], b[j][0], b[j][1]);
          mma_i8<true>(s1, a[1], b[j][0], b[j][1]);
          mma_i8<false>(s2, a[2], b[j][0], b[j][1]);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float partial = float(s0[e] + 256 * s1[e] + 65536 * s2[e]) * 0x1p-10f;
            const float s_x = sx_s[row + (e >= 2 ? 8 : 0)], s_w = sw_s[wn + 8 * j + 2 * ft + (e & 1)][t];
            acc[i][j][e] += (partial * s_x) * s_w;  // the FP4 kernel's order (§5)
          }
        }
      }
    }
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = wm + 16 * i + fg + (e >= 2 ? 8 : 0);
        const int64_t m = out_of[row], n = n0 + wn + 8 * j + 2 * ft + (e & 1);
        if (m >= 0 && n < p.rows) p.y[m * p.y_stride + n] = round_bf16(acc[i][j][e]);
      }
}

// Token-row tiles of the grid: with a table each group's last tile may be partial.
int64_t row_tile_count(const GemmRequest& r) { return (r.T + kBM - 1) / kBM + (r.table ? r.n_views + 1 : 0); }

// Lays the grouping's arrays out one after another from `scratch` (nullptr: only sizes them) and
// returns the int32 elements they take.
int64_t lay_out_grouping(const GemmRequest& r, int32_t* scratch, Grouping& g) {
  const int64_t groups = r.n_views + 1, tiles = row_tile_count(r);
  int64_t used = 0;
  auto take = [&](int64_t n) {
    int32_t* p = scratch ? scratch + used : nullptr;
    used += n;
    return p;
  };
  g = {take(groups), take(groups + 1), take(groups), take(r.T), take(tiles), take(tiles), tiles};
  return used;
}

}  // namespace

int64_t dmma_scratch_ints(const GemmRequest& r) {
  Grouping g;
  return r.table ? lay_out_grouping(r, nullptr, g) : 0;
}

void dmma_gemm(const GemmRequest& r, const float* sx, bool round_out, int32_t* scratch, cudaStream_t stream) {
  if (r.T == 0 || r.rows == 0) return;
  const int64_t col_tiles = (r.rows + kBN - 1) / kBN, row_tiles = row_tile_count(r);
  DSV4_CUDA_REQUIRE(r.T < (int64_t(1) << 31) && row_tiles < 65536 && col_tiles < (int64_t(1) << 31),
                    "linear: ", r.T, " tokens × ", r.rows, " rows exceed the launch grid");
  Grouping g{};
  if (r.table) {
    lay_out_grouping(r, scratch, g);
    DSV4_CUDA_CHECK(cudaMemsetAsync(g.counts, 0, size_t(r.n_views + 1) * sizeof(int32_t), stream));
    const unsigned blocks = unsigned(std::min<int64_t>((r.T + 255) / 256, 1024));
    count_rows_kernel<<<blocks, 256, 0, stream>>>(r.view_of_row, r.T, r.n_views, g);
    DSV4_CUDA_LAUNCHED("linear (count rows per expert)");
    plan_tiles_kernel<<<1, 1, 0, stream>>>(r.n_views, g);
    DSV4_CUDA_LAUNCHED("linear (plan expert tiles)");
    scatter_rows_kernel<<<blocks, 256, 0, stream>>>(r.view_of_row, r.T, r.n_views, g);
    DSV4_CUDA_LAUNCHED("linear (group rows by expert)");
  }
  const DmmaArgs args{r, sx, round_out};
  const dim3 grid{unsigned(col_tiles), unsigned(row_tiles)};
  // Quantized (sx): FP8 on the FP64 tensor cores, FP4 on the integer ones; else the double paths.
  switch (r.W.format) {
    case kFp8:
      if (sx) dmma_kernel<kFp8, true><<<grid, kThreads, 0, stream>>>(args, g);
      else dmma_kernel<kFp8, false><<<grid, kThreads, 0, stream>>>(args, g);
      break;
    case kFp4:
      if (sx) imma_fp4_kernel<<<grid, kThreads, 0, stream>>>(args, g);
      else dmma_kernel<kFp4, false><<<grid, kThreads, 0, stream>>>(args, g);
      break;
    case kBf16: dmma_kernel<kBf16, false><<<grid, kThreads, 0, stream>>>(args, g); break;
    default: dmma_kernel<kF32, false><<<grid, kThreads, 0, stream>>>(args, g); break;
  }
  DSV4_CUDA_LAUNCHED("linear (tensor cores)");
}

}  // namespace dsv4::cuda
