// The KV compressors' pooling step (architecture.md §3.4.3, §4.2–§4.4).
//
// Per source token j the engine computes a_j = x_j·wkvᵀ and s_j = x_j·wgateᵀ (fp32); here ape is
// added, the pair is pushed into the per-sequence carry, and each window that completes is pooled
// with an independent softmax per channel over its rows. Windows are aligned to absolute
// positions, so any chunking of the prompt gives the same rows.
//   ratio 4 (overlapping, width 2d): the carry has 8 rows: 0–3 the previous window, 4–7 the
//     current one. Window w pools the A halves [0, d) of the previous window's rows and the B
//     halves [d, 2d) of its own. Before the first window the previous rows have s = −∞ (weight 0).
//   ratio 128 (width d): the carry has 128 rows, slot = position mod 128.
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/quant.h"

namespace dsv4::cpu {

void CpuBackend::compressor_reset(const model::CompressorWeights& cw, CompressorCarry carry) {
  const size_t n = size_t(cw.carry_rows() * cw.width());
  fill(carry.a, 0.0f, n);
  fill(carry.s, -INFINITY, n);
}

int64_t CpuBackend::compressor_push(const model::CompressorWeights& cw, CompressorCarry carry, const float* a,
                                    const float* s, int64_t p0, int64_t T, float* pooled) {
  const int64_t r = cw.ratio, d = cw.dim, width = cw.width();
  const bool overlap = r == 4;
  int64_t n_emitted = 0;
  std::vector<float> sw(static_cast<size_t>(2 * r)), aw(size_t(2 * r));
  for (int64_t i = 0; i < T; ++i) {
    const int64_t j = p0 + i;
    const int64_t slot = overlap ? 4 + j % 4 : j % r;
    float* ca = carry.a + slot * width;
    float* cs = carry.s + slot * width;
    const float* ape = cw.ape.data() + (j % r) * width;
    for (int64_t c = 0; c < width; ++c) {
      ca[c] = a[i * width + c];
      cs[c] = s[i * width + c] + ape[c];
    }
    if ((j + 1) % r != 0) continue;

    // Window complete: pool each channel over its rows.
    const int64_t n_rows = overlap ? 2 * r : r;
    float* out = pooled + n_emitted * d;
    for (int64_t c = 0; c < d; ++c) {
      for (int64_t row = 0; row < n_rows; ++row) {
        // overlap: rows 0..3 read the A half, rows 4..7 the B half
        const int64_t col = overlap && row >= 4 ? d + c : c;
        sw[size_t(row)] = carry.s[row * width + col];
        aw[size_t(row)] = carry.a[row * width + col];
      }
      float mx = -INFINITY;
      for (int64_t row = 0; row < n_rows; ++row) mx = std::fmax(mx, sw[size_t(row)]);
      double sum = 0.0;
      for (int64_t row = 0; row < n_rows; ++row) sum += (sw[size_t(row)] = exp_f(sw[size_t(row)] - mx));
      double acc = 0.0;
      for (int64_t row = 0; row < n_rows; ++row)
        acc += double(sw[size_t(row)] / float(sum)) * double(aw[size_t(row)]);
      out[c] = round(float(acc));  // the pooled value is rounded before its RMSNorm (§3.4.3)
    }
    ++n_emitted;
    if (overlap) {  // the current window becomes the previous one
      copy(carry.a, carry.a + 4 * width, size_t(4 * width));
      copy(carry.s, carry.s + 4 * width, size_t(4 * width));
    }
  }
  return n_emitted;
}

}  // namespace dsv4::cpu
