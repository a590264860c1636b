// Sparse attention with sinks over the sliding window plus compressed rows (architecture.md §3.3,
// §3.4, §4.1), and the sliding-window ring that feeds it.
//
// Softmax is exact two-pass per (query, head): logits, their max, then the weighted sum. The sink
// joins the denominator but not the max; in deepseek numerics the probabilities are rounded to
// bf16 before P·V while the denominator uses the unrounded exponentials (§3.3). (The reference
// kernel runs an online softmax over 64-row blocks; that only changes which max each bf16
// rounding is relative to.)
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/quant.h"
#include "core/error.h"
#include "core/parallel.h"

namespace dsv4::cpu {

void CpuBackend::swa_gather(const float* ring, int64_t window, int64_t width, int64_t pos_begin, int64_t pos_end,
                            float* dst) {
  for (int64_t p = pos_begin; p < pos_end; ++p)
    copy(dst + (p - pos_begin) * width, ring + (p % window) * width, size_t(width));
}

void CpuBackend::swa_store(float* ring, int64_t window, int64_t width, const float* rows, int64_t pos0, int64_t n) {
  for (int64_t i = std::max<int64_t>(0, n - window); i < n; ++i)
    copy(ring + ((pos0 + i) % window) * width, rows + i * width, size_t(width));
}

void CpuBackend::attention(const float* q, int64_t T, int64_t H, int64_t hd, int64_t p0, const SwaRows& swa,
                           const CompressedRows& comp, const float* sinks, float softmax_scale, float* out) {
  DSV4_CHECK(swa.first_pos <= std::max<int64_t>(0, p0 - swa.window + 1) && swa.first_pos + swa.n >= p0 + T,
             "window rows [{}, {}) do not cover queries [{}, {})", swa.first_pos, swa.first_pos + swa.n, p0, p0 + T);
  DSV4_CHECK(!comp.kv || comp.format.width == hd, "compressed rows of width {}, heads of {}", comp.format.width, hd);
  parallel_for(T, [&](int64_t t) {
    const int64_t pos = p0 + t;
    // Phase 1: the rows this query attends, oldest window row first, then compressed rows
    // (decoded from their stored format).
    std::vector<int64_t> comp_rows;
    if (comp.idx) {
      for (int64_t i = 0; i < comp.k; ++i) {
        const int32_t w = comp.idx[t * comp.k + i];
        if (w >= 0 && w < comp.n) comp_rows.push_back(w);
      }
    } else if (comp.ratio > 0) {
      for (int64_t w = 0; w < std::min(comp.n, (pos + 1) / comp.ratio); ++w) comp_rows.push_back(w);
    }
    std::vector<float> decoded(comp_rows.size() * size_t(hd));
    std::vector<const float*> rows;
    for (int64_t j = std::max<int64_t>(0, pos - swa.window + 1); j <= pos; ++j)
      rows.push_back(swa.kv + (j - swa.first_pos) * hd);
    for (size_t r = 0; r < comp_rows.size(); ++r) {
      float* row = decoded.data() + r * size_t(hd);
      for (int64_t d = 0; d < hd; ++d) row[d] = row_value(comp.format, comp.kv + comp_rows[r] * comp.format.stride, d);
      rows.push_back(row);
    }
    const int64_t n = int64_t(rows.size());
    std::vector<float> p(static_cast<size_t>(n));
    std::vector<double> acc(static_cast<size_t>(hd));
    for (int64_t h = 0; h < H; ++h) {
      const float* qh = q + (t * H + h) * hd;
      // Phase 2: logits and their max (the sink is not part of the max).
      float mx = -INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        p[size_t(j)] = dot(qh, rows[size_t(j)], hd) * softmax_scale;
        mx = std::fmax(mx, p[size_t(j)]);
      }
      // Phase 3: exponentials, denominator with the sink, P·V.
      double den = 0.0;
      for (int64_t j = 0; j < n; ++j) {
        const float e = exp_f(p[size_t(j)] - mx);
        den += e;
        p[size_t(j)] = round(e);
      }
      den += exp_f(sinks[h] - mx);
      for (int64_t d = 0; d < hd; ++d) acc[size_t(d)] = 0.0;
      for (int64_t j = 0; j < n; ++j) {
        const double pj = p[size_t(j)];
        const float* v = rows[size_t(j)];
        for (int64_t d = 0; d < hd; ++d) acc[size_t(d)] += pj * double(v[d]);
      }
      float* oh = out + (t * H + h) * hd;
      for (int64_t d = 0; d < hd; ++d) oh[d] = round(float(acc[size_t(d)]) / float(den));
    }
  });
}

}  // namespace dsv4::cpu
