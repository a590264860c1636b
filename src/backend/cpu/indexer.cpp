// Lightning Indexer scoring and top-k (architecture.md §3.5).
//
// score_w = Σ_h relu(q_h · K_w) · wts_h over the rows visible to the query (w < ⌊(t+1)/ratio⌋).
// In deepseek numerics the per-head dot, each weighted term and the sum are rounded to bf16, so
// ties are possible; they go to the lower row (the reference leaves tie order to torch.topk).
// Keys are read in their stored format, one decoded key at a time.
#include <algorithm>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/quant.h"
#include "core/error.h"
#include "core/parallel.h"

namespace dsv4::cpu {

void CpuBackend::indexer_select(const float* q, const float* wts, int64_t T, int64_t heads, int64_t dim,
                                const float* keys, const RowFormat& key_format, int64_t n_keys, int64_t ratio,
                                int64_t p0, int64_t k, int32_t* idx) {
  DSV4_CHECK(key_format.width == dim, "indexer keys of width {}, queries of {}", key_format.width, dim);
  parallel_for(T, [&](int64_t t) {
    const int64_t n_vis = std::min(n_keys, (p0 + t + 1) / ratio);
    std::vector<float> score(static_cast<size_t>(n_vis)), key(static_cast<size_t>(dim));
    for (int64_t w = 0; w < n_vis; ++w) {
      for (int64_t i = 0; i < dim; ++i) key[size_t(i)] = row_value(key_format, keys + w * key_format.stride, i);
      double acc = 0.0;
      for (int64_t h = 0; h < heads; ++h) {
        const float d = round(dot(q + (t * heads + h) * dim, key.data(), dim));
        acc += round(std::fmax(d, 0.0f) * wts[t * heads + h]);
      }
      score[size_t(w)] = round(float(acc));
    }
    std::vector<int32_t> order(static_cast<size_t>(n_vis));
    std::iota(order.begin(), order.end(), 0);
    const int64_t n_sel = std::min(k, n_vis);
    std::partial_sort(order.begin(), order.begin() + n_sel, order.end(), [&](int32_t x, int32_t y) {
      return score[size_t(x)] > score[size_t(y)] || (score[size_t(x)] == score[size_t(y)] && x < y);
    });
    for (int64_t i = 0; i < k; ++i) idx[t * k + i] = i < n_sel ? order[size_t(i)] : -1;
  });
}

}  // namespace dsv4::cpu
