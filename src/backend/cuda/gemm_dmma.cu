// Many-row matrix products on the tensor cores, exact to the canonical arithmetic (gemm_dmma.h
// says why): the double paths and the quantized FP8 products on the FP64 tensor cores, the
// quantized FP4 products (the routed experts) on the integer ones.
//
// FP64 tiling: a block of 4 warps computes 64 token rows × 64 output rows, stepping K by 32. Each
// step stages both operands in shared memory as doubles (the e4m3 / bf16 / fp32 values converted
// exactly; each thread's share of the next step is loaded into registers while this step's
// products run), then every warp runs mma.m16n8k4.f64 over its 32 × 32 quarter (4 × 4 fragments of
// 8 × 8, two per instruction). In the quantized path the double fragments hold one K tile of 128 and are folded into
// fp32 accumulators at each tile's end, in increasing K: partial · (s_x · s_w), exactly as the CPU
// does. The integer path (imma_fp4_kernel) is described where it starts.
//
// Routed experts (a table of views): the rows are first grouped by expert (a counting sort on the
// device), and each block takes 64 rows of one group, so an expert's weights are read once per 64
// tokens instead of once per token. Rows without an expert form a last group that writes zeros.
#include "backend/cuda/gemm_dmma.h"
#include "backend/cuda/row_grouping.cuh"
#include "backend/cuda/async_copy.cuh"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/quant.cuh"
#include "backend/cuda/weight_access.cuh"

namespace dsv4::cuda {

namespace {

constexpr int kBM = kGroupTileRows, kBN = 64, kBK = 32, kThreads = 128;
// Row pitch of the staged tiles, in doubles: +4 puts the 8 × 4 fragment reads of a half-warp on
// 16 distinct bank pairs.
constexpr int kPitch = kBK + 4;

// Visits the 4 × 4 fragments of 8 × 8 (two elements each) that a lane holds of its warp's 32 × 32
// quarter at (wm, wn): f(i, j, c, row, col) for d[i][j][c], at (row, col) of the block's tile (the
// accumulator layout of an 8 × 8 half of mma.m16n8k4: lane = 4 · fg + ft holds row fg, columns 2 · ft and
// 2 · ft + 1).
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

__device__ __forceinline__ int64_t group_of(const int32_t* view_of_row, int64_t m, int64_t n_views) {
  const int32_t v = view_of_row[m];
  return v >= 0 && v < n_views ? v : n_views;
}

__global__ void count_rows_kernel(const int32_t* view_of_row, int64_t T, int64_t n_views, Grouping g) {
  await_previous_kernel();
  for (int64_t m = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; m < T; m += int64_t(gridDim.x) * blockDim.x)
    atomicAdd(&g.counts[group_of(view_of_row, m, n_views)], 1);
}

// One thread: the groups are few (the experts of a layer), the tiles at most T/tile_rows + groups.
__global__ void plan_tiles_kernel(int64_t n_views, Grouping g) {
  await_previous_kernel();
  int64_t tile = 0, start = 0;
  for (int64_t v = 0; v <= n_views; ++v) {
    g.offsets[v] = int32_t(start);
    g.cursor[v] = int32_t(start);
    for (int64_t r = 0; r < g.counts[v]; r += g.tile_rows, ++tile) {
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
  await_previous_kernel();
  for (int64_t m = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; m < T; m += int64_t(gridDim.x) * blockDim.x)
    g.order[atomicAdd(&g.cursor[group_of(view_of_row, m, n_views)], 1)] = int32_t(m);
}

// The kernel's arguments: the request (with the quantized activations as x) and what dmma_gemm
// adds to it. sx is read through this struct on purpose: copied to a local or passed as a
// parameter of its own, it raised the FP8 kernel from 128 to 162 registers (fewer blocks per SM).
struct DmmaArgs {
  GemmRequest r;
  const float* sx;  // quantized: the activation scales [n_src, K/128]; nullptr in the double paths
  bool round_out;   // double paths: round the results to bf16
  int64_t k_part;   // double paths: K per part of the grid's z (a multiple of kBK; K when unsplit)
  double* partials;  // with parts: [parts, T, rows] double sums, added in part order by sum_parts_kernel
};

// One thread's share of a K step's operands, loaded into registers a step ahead (the loads are in
// flight while the current step's products run): half a row, 16 elements, of the activations (row
// threadIdx.x / 2 of the tile, elements 16 · (threadIdx.x % 2) on) and of the weights, the latter
// as stored words with their block scale.
template <int kFormat>
struct Staged {
  static constexpr int kBits = kFormat == kFp8 ? 8 : kFormat == kFp4 ? 4 : kFormat == kBf16 ? 16 : 32;
  static constexpr int kWords = 16 * kBits / 32;
  float x[16];
  uint32_t w[kWords];
  float scale;  // the weights' block scale (FP8, FP4), for the double paths' dequantized values
};

// Loads step k0 into st: 16-byte loads where the rows allow (x_vec, w_vec) and the step lies inside
// K, else element by element with zeros past K and past the tile's rows.
template <int kFormat>
__device__ __forceinline__ void load_step(Staged<kFormat>& st, const GemmRequest& p, const LinearView& W,
                                          const int64_t* src_of, int64_t n0, int64_t k0, bool x_vec, bool w_vec) {
  constexpr int kBits = Staged<kFormat>::kBits;
  const int r = threadIdx.x / 2;
  const int64_t K = p.W.in, k = k0 + 16 * (threadIdx.x % 2), s = src_of[r], n = n0 + r;
  const bool inside = k + 16 <= K;
  if (s >= 0 && x_vec && inside) {
    const float4* src = reinterpret_cast<const float4*>(p.x + s * p.x_stride + k);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float4 v = __ldg(src + q);
      st.x[4 * q] = v.x, st.x[4 * q + 1] = v.y, st.x[4 * q + 2] = v.z, st.x[4 * q + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int e = 0; e < 16; ++e) st.x[e] = s >= 0 && k + e < K ? p.x[s * p.x_stride + k + e] : 0.0f;
  }
  const int64_t o = p.row0 + n, nb = row_bytes(kFormat, K);
  row_words(W.data + o * nb, k * kBits / 8, n < p.rows ? nb : 0, n < p.rows && w_vec && inside, st.w);
  if constexpr (kFormat == kFp8 || kFormat == kFp4)
    st.scale = n < p.rows && k < K ? block_scale<kFormat>(W, o, k) : 0.0f;
}

// Element e of the staged weights: the stored value (quantized path) or the dequantized one.
template <int kFormat, bool kTiled>
__device__ __forceinline__ float staged_weight(const Staged<kFormat>& st, int e) {
  if constexpr (kFormat == kFp8) {
    const float v = e4m3_to_f32(uint8_t(st.w[e / 4] >> (8 * (e % 4))));
    return kTiled ? v : v * st.scale;
  } else if constexpr (kFormat == kFp4) {
    return e2m1_to_f32(uint8_t((st.w[e / 8] >> (4 * (e % 8))) & 0xf)) * st.scale;  // low nibble first (§2.2)
  } else if constexpr (kFormat == kBf16) {
    return bf16_to_f32(uint16_t(st.w[e / 2] >> (16 * (e % 2))));
  } else {
    return __uint_as_float(st.w[e]);
  }
}

// Writes the staged step into the tiles as doubles, two per 16-byte store. Half h of a row starts
// its 8 stores at pair h, so the 8 lanes of a quarter warp (4 rows × 2 halves) hit distinct banks.
template <int kFormat, bool kTiled>
__device__ __forceinline__ void store_step(const Staged<kFormat>& st, double (*As)[kPitch], double (*Bs)[kPitch]) {
  const int r = threadIdx.x / 2, h = threadIdx.x % 2;
#pragma unroll
  for (int q = 0; q < 8; ++q) {
    // Register indices stay compile-time constants (a run-time index would put st in local memory):
    // both candidates are converted and one is selected.
    const int e0 = 2 * q, e1 = 2 * ((q + 1) % 8), c = 16 * h + (h ? e1 : e0);
    const double2 a0 = make_double2(st.x[e0], st.x[e0 + 1]), a1 = make_double2(st.x[e1], st.x[e1 + 1]);
    const double2 b0 = make_double2(staged_weight<kFormat, kTiled>(st, e0), staged_weight<kFormat, kTiled>(st, e0 + 1));
    const double2 b1 = make_double2(staged_weight<kFormat, kTiled>(st, e1), staged_weight<kFormat, kTiled>(st, e1 + 1));
    *reinterpret_cast<double2*>(&As[r][c]) = h ? a1 : a0;
    *reinterpret_cast<double2*>(&Bs[r][c]) = h ? b1 : b0;
  }
}

// Registers: 128 for the double paths (4 blocks per SM); the quantized FP8 kernel keeps its fold's
// scales and staged words in 168 without spilling (3 blocks; capped at 128 it spilled).
template <int kFormat, bool kTiled>
__global__ void __launch_bounds__(kThreads, kTiled ? 3 : 4) dmma_kernel(DmmaArgs args, Grouping g) {
  await_previous_kernel();
  const GemmRequest& p = args.r;
  __shared__ __align__(16) double As[kBM][kPitch];
  __shared__ __align__(16) double Bs[kBN][kPitch];
  __shared__ int64_t src_of[kBM];  // the x / qx row of each tile row, −1 for none
  __shared__ int64_t out_of[kBM];  // its y row

  LinearView W;
  if (!tile_rows(p, g, kBN, src_of, out_of, W)) return;
  const int64_t n0 = int64_t(blockIdx.x) * kBN, K = p.W.in;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = (warp / 2) * 32, wn = (warp % 2) * 32, fg = lane / 4, ft = lane % 4;
  static_assert(!kTiled || kFormat == kFp8, "quantized FP4 products run on the integer tensor cores (imma_fp4_kernel)");
  constexpr int64_t kTile = 128;
  double d[4][4][2] = {};
  float acc[4][4][2] = {};

  // Rows allow 16-byte loads: the activations' (fp32) and the weights' (device weights start
  // 256-byte aligned).
  const bool x_vec = reinterpret_cast<uintptr_t>(p.x) % 16 == 0 && p.x_stride % 4 == 0;
  const bool w_vec = row_bytes(kFormat, K) % 16 == 0;
  Staged<kFormat> st;
  const int64_t k_begin = int64_t(blockIdx.z) * args.k_part, k_end = k_begin + args.k_part < K ? k_begin + args.k_part : K;
  load_step(st, p, W, src_of, n0, k_begin, x_vec, w_vec);
  for (int64_t k0 = k_begin; k0 < k_end; k0 += kBK) {
    store_step<kFormat, kTiled>(st, As, Bs);
    __syncthreads();
    if (k0 + kBK < k_end) load_step(st, p, W, src_of, n0, k0 + kBK, x_vec, w_vec);
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 4) {
      double a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = As[wm + i * 8 + fg][kk + ft];
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = Bs[wn + j * 8 + fg][kk + ft];
#pragma unroll
      for (int i = 0; i < 4; i += 2)
#pragma unroll
        for (int j = 0; j < 4; ++j) dmma(d[i][j], d[i + 1][j], a[i], a[i + 1], b[j]);
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
    } else if (args.partials) {
      args.partials[(int64_t(blockIdx.z) * p.T + m) * p.rows + n] = d[i][j][c];
      return;
    } else {
      v = float(d[i][j][c]);
      if (args.round_out) v = round_bf16(v);
    }
    p.y[m * p.y_stride + n] = v;
  });
}

// The double paths split over K: each output's part sums added in part order, rounded once.
__global__ void sum_parts_kernel(const double* partials, int64_t parts, int64_t T, int64_t rows, bool round_out,
                                 float* y, int64_t y_stride) {
  await_previous_kernel();
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < T * rows; e += int64_t(gridDim.x) * blockDim.x) {
    double sum = 0.0;
    for (int64_t z = 0; z < parts; ++z) sum += partials[z * T * rows + e];
    const float v = float(sum);
    y[e / rows * y_stride + e % rows] = round_out ? round_bf16(v) : v;
  }
}

// ---- FP4 weights, quantized: the integer tensor cores ------------------------------------------
// An FP4 K tile's partial is an integer sum (gemm.cu's top): with the activations' e4m3 values as
// k = x · 2^9 in three byte planes (k = b0 + 2^8 b1 + 2^16 b2, b2 signed; act_quant_kernel writes
// them, 24 words per 32-element tile: 8 groups of 4 elements × 3 planes) and the weights as the
// int8 2·e2m1, one mma.m16n8k32 per plane sums a tile exactly in int32 for 16 tokens × 8 outputs,
// s0 + 2^8 s1 + 2^16 s2 (< 2^27) is the tile's Σ k·w2, and float(·) · 2^-10 is the CPU's partial.
// Each 32-wide K step ends a tile, so the fold (partial · s_x) · s_w runs right after its products,
// in increasing K like the CPU's. Tiling as dmma_kernel: 64 × 64 per block, a 32 × 32 quarter per
// warp (2 × 4 fragments of 16 × 8). A stage holds 2 tiles; while one is multiplied, the next one's
// activation planes arrive in a second buffer by asynchronous copies (cp.async) and its weights
// and scales in registers (ncu at dad3d1e, with synchronous staging of 4 tiles: 41% of the
// warps' stalls waited on global loads).
constexpr int kImmaTiles = 2;
constexpr int kPlaneWordsPerTile = 24;
static_assert(kThreads == kBN * kImmaTiles, "a thread stages one weight chunk per stage");
static_assert(128 % (32 * kImmaTiles) == 0, "a stage lies in one activation scale block of 128");
// Row pitches in shared memory, in words: ≡ 4 · odd (mod 32), so the 32 lanes of a fragment load
// hit 32 distinct banks (A: 4g' + 3i + plane, B: 4g' + i, g' a permutation of g).
constexpr int kAPitch = kImmaTiles * kPlaneWordsPerTile + 4;
constexpr int kBPitch = kImmaTiles * 8 + 4;

// Starts copying stage t0's activation planes into A (zeros for absent rows and tiles past K), as
// one group of asynchronous copies.
__device__ __forceinline__ void stage_planes_async(const GemmRequest& p, const int64_t* src_of, int64_t t0,
                                                   int64_t n_tiles, uint32_t* A) {
  constexpr int kRowVectors = kImmaTiles * kPlaneWordsPerTile / 4;  // 16-byte copies per row and stage
  const uint32_t* planes = reinterpret_cast<const uint32_t*>(p.x);  // rows of p.x_stride = n_tiles · 24 words
  for (int i = threadIdx.x; i < kBM * kRowVectors; i += kThreads) {
    const int r = i / kRowVectors, v = i % kRowVectors;
    const int64_t s = src_of[r];
    const bool valid = s >= 0 && t0 + v / (kPlaneWordsPerTile / 4) < n_tiles;
    copy_async_16(A + r * kAPitch + 4 * v, valid ? planes + s * p.x_stride + t0 * kPlaneWordsPerTile + 4 * v : planes,
                  valid);
  }
  commit_async_copies();
}

// This thread's share of a stage's weights (output row threadIdx.x / 2, tile threadIdx.x % 2, as
// stored) and scales, loaded a stage ahead.
struct ImmaStage {
  uint4 w;
  float s_w, s_x;  // s_x: the activation scale of row threadIdx.x (threads below kBM)
};

__device__ __forceinline__ ImmaStage load_stage(const DmmaArgs& args, const LinearView& W, const int64_t* src_of,
                                                int64_t n0, int64_t t0, int64_t n_tiles, bool w_vec) {
  const GemmRequest& p = args.r;
  const int64_t K = p.W.in, n = n0 + threadIdx.x / kImmaTiles, tile = t0 + threadIdx.x % kImmaTiles;
  const bool ok = n < p.rows && tile < n_tiles;
  ImmaStage st;
  st.w = ok ? row_chunk(W, p.row0 + n, tile, K, w_vec) : make_uint4(0, 0, 0, 0);
  st.s_w = ok ? block_scale<kFp4>(W, p.row0 + n, tile * 32) : 0.0f;
  const int64_t s = threadIdx.x < kBM ? src_of[threadIdx.x] : -1;
  st.s_x = s >= 0 ? args.sx[s * ((K + 127) / 128) + t0 * 32 / 128] : 0.0f;
  return st;
}

// The weights as int8 (8 words per tile) and the scales into shared memory.
__device__ __forceinline__ void store_stage(const ImmaStage& st, uint32_t* Bs, float (*sw_s)[kImmaTiles],
                                            float* sx_s) {
  const int r = threadIdx.x / kImmaTiles, t = threadIdx.x % kImmaTiles;
  uint32_t q[8];
  fp4_to_int8x8(st.w.x, q[0], q[1]);
  fp4_to_int8x8(st.w.y, q[2], q[3]);
  fp4_to_int8x8(st.w.z, q[4], q[5]);
  fp4_to_int8x8(st.w.w, q[6], q[7]);
  uint4* dst = reinterpret_cast<uint4*>(Bs + r * kBPitch + 8 * t);
  dst[0] = make_uint4(q[0], q[1], q[2], q[3]);
  dst[1] = make_uint4(q[4], q[5], q[6], q[7]);
  sw_s[r][t] = st.s_w;
  if (threadIdx.x < kBM) sx_s[threadIdx.x] = st.s_x;
}

// 154 registers, 3 blocks per SM (capped at 128 for 4 it spilled).
__global__ void __launch_bounds__(kThreads, 3) imma_fp4_kernel(DmmaArgs args, Grouping g) {
  await_previous_kernel();
  const GemmRequest& p = args.r;
  __shared__ __align__(16) uint32_t As[2][kBM * kAPitch];  // activation planes: this stage's, the next's
  __shared__ __align__(16) uint32_t Bs[kBN * kBPitch];     // weights as int8, 8 words per tile
  __shared__ float sx_s[kBM];                              // the stage's activation scale per row
  __shared__ float sw_s[kBN][kImmaTiles];                  // the weight scale per output and tile
  __shared__ int64_t src_of[kBM], out_of[kBM];

  LinearView W;
  if (!tile_rows(p, g, kBN, src_of, out_of, W)) return;
  const int64_t n0 = int64_t(blockIdx.x) * kBN, K = p.W.in, n_tiles = (K + 31) / 32;
  const bool w_vec = row_bytes(kFp4, K) % 16 == 0;  // device weights start 256-byte aligned

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = (warp / 2) * 32, wn = (warp % 2) * 32, fg = lane / 4, ft = lane % 4;
  float acc[2][4][4] = {};  // [m fragment][n fragment][element of the mma's c]

  stage_planes_async(p, src_of, 0, n_tiles, As[0]);
  ImmaStage next = load_stage(args, W, src_of, n0, 0, n_tiles, w_vec);
  for (int64_t t0 = 0, stage = 0; t0 < n_tiles; t0 += kImmaTiles, ++stage) {
    const uint32_t* A = As[stage % 2];
    store_stage(next, Bs, sw_s, sx_s);
    const bool more = t0 + kImmaTiles < n_tiles;
    if (more) {
      stage_planes_async(p, src_of, t0 + kImmaTiles, n_tiles, As[(stage + 1) % 2]);
      await_async_copies<1>();  // this stage's planes have arrived
    } else {
      await_async_copies<0>();
    }
    __syncthreads();
    if (more) next = load_stage(args, W, src_of, n0, t0 + kImmaTiles, n_tiles, w_vec);

    float s_x[2][2];  // the stage's activation scale of this lane's rows: [m fragment][row g, g + 8]
#pragma unroll
    for (int i = 0; i < 2; ++i) s_x[i][0] = sx_s[wm + 16 * i + fg], s_x[i][1] = sx_s[wm + 16 * i + fg + 8];
#pragma unroll
    for (int t = 0; t < kImmaTiles; ++t) {
      if (t0 + t >= n_tiles) break;
      // Every operand of the tile's 24 products first: the loads overlap instead of each product
      // waiting on its own.
      uint32_t b[4][2];
      float s_w[4][2];  // [n fragment][column 2·ft, 2·ft + 1]
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int col = wn + 8 * j;
        b[j][0] = Bs[(col + fg) * kBPitch + 8 * t + ft];
        b[j][1] = Bs[(col + fg) * kBPitch + 8 * t + 4 + ft];
        s_w[j][0] = sw_s[col + 2 * ft][t], s_w[j][1] = sw_s[col + 2 * ft + 1][t];
      }
      uint32_t a[2][3][4];  // [m fragment][plane][fragment register]
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const uint32_t* ap = A + (wm + 16 * i + fg) * kAPitch + kPlaneWordsPerTile * t;
#pragma unroll
        for (int pl = 0; pl < 3; ++pl) {
          a[i][pl][0] = ap[3 * ft + pl];
          a[i][pl][1] = ap[8 * kAPitch + 3 * ft + pl];
          a[i][pl][2] = ap[3 * (4 + ft) + pl];
          a[i][pl][3] = ap[8 * kAPitch + 3 * (4 + ft) + pl];
        }
      }
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          int s0[4], s1[4], s2[4];
          mma_i8<true>(s0, a[i][0], b[j][0], b[j][1]);
          mma_i8<true>(s1, a[i][1], b[j][0], b[j][1]);
          mma_i8<false>(s2, a[i][2], b[j][0], b[j][1]);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float partial = float(s0[e] + 256 * s1[e] + 65536 * s2[e]) * 0x1p-10f;
            acc[i][j][e] += (partial * s_x[i][e / 2]) * s_w[j][e % 2];  // the FP4 kernel's order (§5)
          }
        }
    }
    __syncthreads();
  }

  store_warp_tile(p, out_of, acc, wm, n0 + wn);
}

}  // namespace

// Token-row tiles of the grid: with a table each group's last tile may be partial.
int64_t row_tile_count(const GemmRequest& r, int tile_rows) {
  return (r.T + tile_rows - 1) / tile_rows + (r.table ? r.n_views + 1 : 0);
}

// Lays the grouping's arrays out one after another from `scratch` (nullptr: only sizes them) and
// returns the int32 elements they take.
int64_t lay_out_grouping(const GemmRequest& r, int32_t* scratch, Grouping& g, int tile_rows) {
  const int64_t groups = r.n_views + 1, tiles = row_tile_count(r, tile_rows);
  int64_t used = 0;
  auto take = [&](int64_t n) {
    int32_t* p = scratch ? scratch + used : nullptr;
    used += n;
    return p;
  };
  g = {take(groups), take(groups + 1), take(groups), take(r.T), take(tiles), take(tiles), tiles, tile_rows};
  return used;
}

void group_rows(const GemmRequest& r, int32_t* scratch, Grouping& g, cudaStream_t stream, int tile_rows) {
  lay_out_grouping(r, scratch, g, tile_rows);
  DSV4_CUDA_CHECK(cudaMemsetAsync(g.counts, 0, size_t(r.n_views + 1) * sizeof(int32_t), stream));
  const unsigned blocks = unsigned(std::min<int64_t>((r.T + 255) / 256, 1024));
  launch(count_rows_kernel, blocks, 256, 0, stream, r.view_of_row, r.T, r.n_views, g);
  DSV4_CUDA_LAUNCHED("linear (count rows per expert)");
  launch(plan_tiles_kernel, 1, 1, 0, stream, r.n_views, g);
  DSV4_CUDA_LAUNCHED("linear (plan expert tiles)");
  launch(scatter_rows_kernel, blocks, 256, 0, stream, r.view_of_row, r.T, r.n_views, g);
  DSV4_CUDA_LAUNCHED("linear (group rows by expert)");
}

// Parts of K for the double paths: when the tiles leave SMs idle (hc_pre's mix: 24 output rows of
// K = 16 384, 32 tiles at 2 048 tokens, 1.3 ms on an H200), enough parts for four blocks per SM,
// each at least 16 K steps. (The mix streams its activations, so it wants many loads in flight:
// with two blocks per SM, 640 µs at 8 192 tokens, 0.84 TB/s.)
static int64_t k_parts(const GemmRequest& r, bool quantized, int sm_count) {
  if (quantized || r.table) return 1;
  const int64_t tiles = (r.rows + kBN - 1) / kBN * row_tile_count(r);
  return std::clamp<int64_t>(4 * sm_count / tiles, 1, std::max<int64_t>(1, r.W.in / (16 * kBK)));
}

int64_t dmma_scratch_ints(const GemmRequest& r, bool quantized, int sm_count) {
  Grouping g;
  const int64_t parts = k_parts(r, quantized, sm_count);
  return r.table ? lay_out_grouping(r, nullptr, g) : parts > 1 ? 2 * parts * r.T * r.rows : 0;
}

void dmma_gemm(const GemmRequest& r, const float* sx, bool round_out, int32_t* scratch, int sm_count,
               cudaStream_t stream) {
  if (r.T == 0 || r.rows == 0) return;
  const int64_t col_tiles = (r.rows + kBN - 1) / kBN, row_tiles = row_tile_count(r);
  const int64_t parts = k_parts(r, sx != nullptr, sm_count);
  const int64_t k_part = parts > 1 ? (r.W.in + parts * kBK - 1) / (parts * kBK) * kBK : r.W.in;
  DSV4_CUDA_REQUIRE(r.T < (int64_t(1) << 31) && row_tiles < 65536 && col_tiles < (int64_t(1) << 31),
                    "linear: ", r.T, " tokens × ", r.rows, " rows exceed the launch grid");
  Grouping g{};
  if (r.table) group_rows(r, scratch, g, stream);
  const DmmaArgs args{r, sx, round_out, k_part, parts > 1 ? reinterpret_cast<double*>(scratch) : nullptr};
  const dim3 grid{unsigned(col_tiles), unsigned(row_tiles), unsigned((r.W.in + k_part - 1) / k_part)};
  // Quantized (sx): FP8 on the FP64 tensor cores, FP4 on the integer ones; else the double paths.
  // The DMMA kernel is launched plain: its early (dependent) launches cost a 4K prefill 5% (launch.cuh).
  switch (r.W.format) {
    case kFp8:
      if (sx) launch<Launch::plain>(dmma_kernel<kFp8, true>, grid, kThreads, 0, stream, args, g);
      else launch<Launch::plain>(dmma_kernel<kFp8, false>, grid, kThreads, 0, stream, args, g);
      break;
    case kFp4:
      if (sx) launch(imma_fp4_kernel, grid, kThreads, 0, stream, args, g);
      else launch<Launch::plain>(dmma_kernel<kFp4, false>, grid, kThreads, 0, stream, args, g);
      break;
    case kBf16: launch<Launch::plain>(dmma_kernel<kBf16, false>, grid, kThreads, 0, stream, args, g); break;
    default: launch<Launch::plain>(dmma_kernel<kF32, false>, grid, kThreads, 0, stream, args, g); break;
  }
  DSV4_CUDA_LAUNCHED("linear (tensor cores)");
  if (args.partials) {
    launch(sum_parts_kernel, grid_for(r.T * r.rows, 256), 256, 0, stream, args.partials, int64_t(grid.z), r.T, r.rows,
           round_out, r.y, r.y_stride);
    DSV4_CUDA_LAUNCHED("linear (K parts)");
  }
}

}  // namespace dsv4::cuda
