// Token sampling from logits: greedy at temperature 0, else temperature, top-k, top-p (nucleus)
// and min-p; and the log-probabilities that OpenAI's `logprobs` report.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace dsv4::engine {

// The most likely token; ties go to the lower id (greedy sampling, and the draft model's guess).
int32_t argmax(std::span<const float> logits);

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  int64_t top_k = 0;         // 0: no limit
  float top_p = 1.0f;
  float min_p = 0.0f;        // drop candidates below min_p × the most likely one's probability
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

struct TokenLogprob {
  int32_t id;
  float logprob;
};

// log_softmax of the raw logits (the model's distribution, before temperature and truncation) for
// `chosen`, and the `n_top` most likely tokens (descending, ties to the lower id).
struct Logprobs {
  float chosen = 0;
  std::vector<TokenLogprob> top;
};
Logprobs logprobs_of(std::span<const float> logits, int32_t chosen, int64_t n_top);

}  // namespace dsv4::engine
