// Many-row matrix products on the FP64 tensor cores (DMMA), exact to the canonical arithmetic:
// the prefill path of every linear and of the routed experts (a grouped GEMM over the rows routed
// to each expert).
//
// Why FP64 and not FP8 tensor cores: in the quantized path each K-tile partial is a sum of ≤ 128
// exact e4m3×e4m3 (or e4m3×e2m1) products whose bits span at most 43 places, so a double
// accumulator holds it exactly in any order, and rounded once to fp32 it equals the CPU's partial
// bit for bit. Hopper's FP8 tensor cores keep only part of such a sum (on an H200, 1.3 % of K = 128
// partials of normal data came out exact), and these numerics are chaotic: with partials
// truncated to 14 bits the fixtures' logits agree on 89 % of argmaxes, max|Δ| 11–25
// (tools/oracle/NOTES.md §5). The plain and bf16/f32 paths take double dot products of fp32 values
// (exact products), rounded once, like the CPU.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_backend.h"

namespace dsv4::cuda {

// One product y[m] = x[src(m)] · W_mᵀ over output rows [row0, row0 + rows), m in [0, T).
// W_m is `W`, or table[view_of_row[m]] (routed experts; an index outside [0, n_views) gives 0).
// x has rows of x_stride, src(m) = m / x_div; quantized (tiled) problems pass the e4m3 activation
// values there and their per-128 scales in sx [n_src, K/128].
struct DmmaProblem {
  LinearView W;
  const LinearView* table = nullptr;
  const int32_t* view_of_row = nullptr;
  int64_t n_views = 0;
  const float* x = nullptr;
  int64_t x_stride = 0, x_div = 1;
  const float* sx = nullptr;
  int64_t K = 0, T = 0;
  float* y = nullptr;
  int64_t y_stride = 0, row0 = 0, rows = 0;
  bool tiled = false, round_out = false;
};

// Enqueues the product on `stream` (scratch memory is stream-ordered).
void dmma_gemm(const DmmaProblem& p, cudaStream_t stream);

}  // namespace dsv4::cuda
