// Rotary position embedding on the trailing dims of a row, interleaved pairs (architecture.md §3.0).
#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/quant.h"
#include "core/parallel.h"

namespace dsv4::cpu {

// For each group i (a token, or a compressed row) at position p = pos0 + i·pos_step, and each of
// its `group` rows (heads): angle_k = fp32(p)·f_k, computed afresh (never accumulated), and
// (a, b) ← (a·c − b·s, a·s + b·c) on pair k of the rope slice; inverse uses −s.
void CpuBackend::rope(float* x, int64_t n_groups, int64_t group, int64_t row_stride, const RopeFreqs& freqs,
                      int64_t pos0, int64_t pos_step, bool inverse) {
  const int64_t half = int64_t(freqs.freqs.size());
  const int64_t offset = row_stride - 2 * half;
  parallel_for(n_groups, [&](int64_t i) {
    const float p = float(pos0 + i * pos_step);
    for (int64_t k = 0; k < half; ++k) {
      const float angle = p * freqs.freqs[size_t(k)];
      const float c = cos_f(angle);
      const float s = inverse ? -sin_f(angle) : sin_f(angle);
      for (int64_t h = 0; h < group; ++h) {
        float* v = x + (i * group + h) * row_stride + offset + 2 * k;
        // A rotation is a pair of 2-term dot products: float64 (the products are exact), then
        // one rounding, as every sum here (quant.h).
        const double a = v[0], b = v[1];
        v[0] = round(float(a * c - b * s));
        v[1] = round(float(a * s + b * c));
      }
    }
  });
}

}  // namespace dsv4::cpu
