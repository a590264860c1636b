// One attention call's operands and the rows each query attends, shared by the exact kernels
// (attention.cu) and deepseek-tc's tensor-core kernel (attention_tc.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/backend.h"

namespace dsv4::cuda {

struct AttnArgs {
  const float* q;
  int64_t H, hd, p0;
  SwaRows swa;
  CompressedRows comp;
  const float* sinks;
  float softmax_scale;
  int64_t n_max;
  bool bf16;
  float* out;
};

// Row j of a query's rows: its data, and whether it is a window row (fp32) or a compressed row
// (stored kind). p is nullptr for a skipped selection entry and past the last row.
// (No member initialisers: an array of them lives in shared memory.)
struct RowRef {
  const float* p;
  bool window;
};

// Row j of a query's rows by number: row i of the window's (window) or of the compressed rows;
// i < 0 for a skipped selection entry and past the last row.
struct RowIndex {
  int64_t i;
  bool window;
};

// The rows query t attends, in order: window rows [lo, pos], then the compressed rows (the
// visible ones, or the indexer's selection, whose −1 entries stay in place as skipped rows).
struct QueryRows {
  int64_t lo, n_win, n;
  __device__ QueryRows(const AttnArgs& a, int64_t t) {
    const int64_t pos = a.p0 + t;
    lo = pos - a.swa.window + 1 > 0 ? pos - a.swa.window + 1 : 0;
    n_win = pos - lo + 1;
    const int64_t visible = a.comp.ratio > 0 ? (pos + 1) / a.comp.ratio : 0;
    n = n_win + (a.comp.idx ? a.comp.k : (visible < a.comp.n ? visible : a.comp.n));
  }
  __device__ RowIndex index(const AttnArgs& a, int64_t t, int64_t j) const {
    if (j >= n) return {-1, false};
    if (j < n_win) return {lo + j - a.swa.first_pos, true};
    const int64_t w = j - n_win;
    if (!a.comp.idx) return {w, false};
    const int32_t sel = a.comp.idx[t * a.comp.k + w];
    return {sel < 0 || sel >= a.comp.n ? -1 : sel, false};
  }
  __device__ RowRef row(const AttnArgs& a, int64_t t, int64_t j) const {
    const RowIndex r = index(a, t, j);
    if (r.i < 0) return {nullptr, false};
    return {r.window ? a.swa.kv + r.i * a.hd : a.comp.kv + r.i * a.comp.format.stride, r.window};
  }
};

// Whether deepseek-tc's tensor-core attention (attention_tc.cu) takes these operands: on a device
// with wgmma (sm_90a), head dims a multiple of 16 up to 512, compressed rows (if any) in the
// compact layout.
bool fits_tensor_core_attention(const AttnArgs& a);

}  // namespace dsv4::cuda
