#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace dsv4::engine {

int32_t argmax(std::span<const float> logits) {
  return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

int32_t Sampler::sample(std::span<const float> logits) {
  const int64_t V = int64_t(logits.size());
  if (params_.temperature <= 0.0f) return argmax(logits);

  // No truncation: sample the softmax directly (sorting 129 280 candidates per token costs more
  // than a decode step of a small model).
  if (params_.top_k <= 0 && params_.top_p >= 1.0f && params_.min_p <= 0.0f) {
    const double mx = *std::max_element(logits.begin(), logits.end());
    std::vector<double> p(logits.size());
    for (size_t i = 0; i < p.size(); ++i) p[i] = std::exp((double(logits[i]) - mx) / params_.temperature);
    std::discrete_distribution<size_t> pick(p.begin(), p.end());
    return int32_t(pick(rng_));
  }

  // Candidates by descending logit, cut to top-k.
  std::vector<int32_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  const int64_t k = params_.top_k > 0 ? std::min(params_.top_k, V) : V;
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
    return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
  });
  order.resize(size_t(k));

  // Softmax at the temperature, then the smallest prefix with mass >= top_p.
  std::vector<double> p(order.size());
  const double mx = logits[size_t(order[0])];
  double sum = 0.0;
  for (size_t i = 0; i < order.size(); ++i)
    sum += (p[i] = std::exp((double(logits[size_t(order[i])]) - mx) / params_.temperature));
  size_t keep = order.size();
  if (params_.top_p < 1.0f) {
    double mass = 0.0;
    for (size_t i = 0; i < order.size(); ++i) {
      mass += p[i] / sum;
      if (mass >= params_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  for (size_t i = 1; i < keep; ++i)  // p is descending: cut at the first one below the floor
    if (p[i] < params_.min_p * p[0]) {
      keep = i;
      break;
    }
  std::discrete_distribution<size_t> pick(p.begin(), p.begin() + std::ptrdiff_t(keep));
  return order[pick(rng_)];
}

Logprobs logprobs_of(std::span<const float> logits, int32_t chosen, int64_t n_top) {
  const int64_t V = int64_t(logits.size());
  const double mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float l : logits) sum += std::exp(double(l) - mx);
  const double log_z = mx + std::log(sum);
  Logprobs out;
  out.chosen = float(double(logits[size_t(chosen)]) - log_z);
  const int64_t k = std::min(n_top, V);
  std::vector<int32_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
    return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
  });
  for (int64_t i = 0; i < k; ++i) out.top.push_back({order[size_t(i)], float(double(logits[size_t(order[size_t(i)])]) - log_z)});
  return out;
}

}  // namespace dsv4::engine
