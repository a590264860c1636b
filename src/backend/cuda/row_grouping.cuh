// Rows of a table-driven product (the routed experts) grouped by expert on the device, in tiles
// of rows of one expert: the grouped GEMMs' plan (gemm_dmma.cu, exact, tiles of kGroupTileRows;
// gemm_experts_tc.cu, deepseek-tc, tiles of its own height).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_backend.h"
#include "core/formats.h"

namespace dsv4::cuda {

constexpr int kGroupTileRows = 64;

// Rows grouped by view: group g < n_views holds the rows of view g, group n_views those without
// one. offsets[g] is the group's first position in `order`, offsets[n_views + 1] = T; every
// tile of tile_rows rows of a group is listed in tile_group / tile_row0 (−1 past the last).
struct Grouping {
  int32_t* counts;   // [n_views + 1]
  int32_t* offsets;  // [n_views + 2]
  int32_t* cursor;   // [n_views + 1]
  int32_t* order;    // [T]
  int32_t* tile_group;
  int32_t* tile_row0;
  int64_t max_tiles;
  int32_t tile_rows;
};

// Token-row tiles of a grouped grid (with a table each group's last tile may be partial), and the
// int32 scratch elements the grouping takes (laid out from `scratch`; nullptr: only sized; fewer
// for taller tiles).
int64_t row_tile_count(const GemmRequest& r, int tile_rows = kGroupTileRows);
int64_t lay_out_grouping(const GemmRequest& r, int32_t* scratch, Grouping& g, int tile_rows = kGroupTileRows);
// Groups r's rows by view on `stream` (a counting sort) into g, laid out in scratch.
void group_rows(const GemmRequest& r, int32_t* scratch, Grouping& g, cudaStream_t stream,
                int tile_rows = kGroupTileRows);

// A grouped kernel's common start: the block's kTileRows token rows (out_of: the y row,
// src_of: the x / qx row, −1 for none) and its weights. Returns false when the block has nothing
// to compute: no tile, or rows routed to no expert, whose outputs (columns from blockIdx.x · cols
// on) it sets to zero (they contribute nothing, as on the CPU). Called by every thread; ends with
// a barrier.
template <int kTileRows = kGroupTileRows>
__device__ inline bool tile_rows(const GemmRequest& p, const Grouping& g, int cols, int64_t* src_of, int64_t* out_of,
                                 LinearView& W) {
  W = p.W;
  bool zeros = false;
  if (p.table) {
    const int32_t group = g.tile_group[blockIdx.y];
    if (group < 0) return false;
    const int64_t r0 = g.tile_row0[blockIdx.y], end = g.offsets[group + 1];
    zeros = group == p.n_views;
    if (!zeros) W = p.table[group];
    for (int i = threadIdx.x; i < kTileRows; i += blockDim.x) {
      const int64_t m = r0 + i < end ? g.order[r0 + i] : -1;
      out_of[i] = m;
      src_of[i] = m < 0 ? -1 : m / p.x_div;
    }
  } else {
    const int64_t r0 = int64_t(blockIdx.y) * kTileRows;
    for (int i = threadIdx.x; i < kTileRows; i += blockDim.x) {
      const int64_t m = r0 + i < p.T ? r0 + i : -1;
      out_of[i] = m;
      src_of[i] = m < 0 ? -1 : m / p.x_div;
    }
  }
  __syncthreads();
  if (!zeros) return true;
  const int64_t n0 = int64_t(blockIdx.x) * cols;
  for (int i = threadIdx.x; i < kTileRows * cols; i += blockDim.x) {
    const int r = i / cols, c = i % cols;
    if (out_of[r] >= 0 && n0 + c < p.rows) p.y[out_of[r] * p.y_stride + n0 + c] = 0.0f;
  }
  return false;
}

// A warp's 16·kM × 32 tile of a grouped kernel's output in the mma fragment layout (acc[i][j][e]:
// row wm + 16i + lane/4 (+8 for e ≥ 2) of the block's, column col0 + 8j + 2·(lane%4) (+1 for odd
// e)), rounded to bf16 into its rows' outputs, as the exact products' are.
template <int kM>
__device__ inline void store_warp_tile(const GemmRequest& p, const int64_t* out_of, const float (&acc)[kM][4][4],
                                       int wm, int64_t col0) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int i = 0; i < kM; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t m = out_of[wm + 16 * i + lane / 4 + (e >= 2 ? 8 : 0)];
        const int64_t col = col0 + 8 * j + 2 * (lane % 4) + (e & 1);
        if (m >= 0 && col < p.rows) p.y[m * p.y_stride + col] = round_bf16(acc[i][j][e]);
      }
}

}  // namespace dsv4::cuda
