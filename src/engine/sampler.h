// Token sampling from logits: greedy at temperature 0, else temperature, top-k, top-p (nucleus).
#pragma once

#include <cstdint>
#include <random>
#include <span>

namespace dsv4::engine {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  int64_t top_k = 0;         // 0: no limit
  float top_p = 1.0f;
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}
  int32_t sample(std::span<const float> logits);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
};

}  // namespace dsv4::engine
