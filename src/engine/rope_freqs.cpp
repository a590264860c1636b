#include "engine/rope_freqs.h"

#include <algorithm>
#include <cmath>

namespace dsv4::engine {

RopeFreqs make_rope_freqs(int64_t rope_dims, double base, const model::YarnScaling* yarn) {
  const int64_t half = rope_dims / 2;
  RopeFreqs r;
  r.freqs.resize(size_t(half));
  for (int64_t i = 0; i < half; ++i)
    r.freqs[size_t(i)] = 1.0f / std::pow(float(base), float(2 * i) / float(rope_dims));
  if (!yarn || !yarn->enabled) return r;

  // Correction range in host double math, then the fp32 ramp (op order as §3.0).
  auto correction_dim = [&](double rotations) {
    return double(rope_dims) * std::log(double(yarn->original_max_position) / (rotations * 2.0 * M_PI)) /
           (2.0 * std::log(base));
  };
  const double low = std::max(std::floor(correction_dim(yarn->beta_fast)), 0.0);
  double high = std::min(std::ceil(correction_dim(yarn->beta_slow)), double(rope_dims - 1));
  if (low == high) high += 0.001;
  for (int64_t i = 0; i < half; ++i) {
    const float ramp = std::clamp((float(i) - float(low)) / (float(high) - float(low)), 0.0f, 1.0f);
    const float smooth = 1.0f - ramp;
    const float f = r.freqs[size_t(i)];
    r.freqs[size_t(i)] = f / float(yarn->factor) * (1.0f - smooth) + f * smooth;
  }
  return r;
}

RopeFreqs layer_rope_freqs(const model::ModelConfig& c, model::AttnKind kind) {
  if (kind == model::AttnKind::swa) return make_rope_freqs(c.rope_head_dim, c.rope_theta, nullptr);
  return make_rope_freqs(c.rope_head_dim, c.compress_rope_theta, &c.yarn);
}

}  // namespace dsv4::engine
