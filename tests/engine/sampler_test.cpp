// The sampler's truncations (top-k, top-p, min-p), the untruncated fast path, seeds, and the
// log-probabilities that the server reports.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/sampler.h"

namespace dsv4::engine {

TEST(Sampler, GreedyTakesTheArgmaxTiesToTheLowerId) {
  Sampler s(SamplingParams{});
  const std::vector<float> logits = {0.5f, 2.0f, 2.0f, -1.0f};
  EXPECT_EQ(s.sample(logits), 1);
}

TEST(Sampler, UntruncatedSamplingFollowsTheSoftmax) {
  // p(1) = 3/4 at temperature 1.
  const std::vector<float> logits = {0.0f, float(std::log(3.0)), -50.0f};
  Sampler s(SamplingParams{1.0f, 0, 1.0f, 0.0f, 42});
  int ones = 0;
  for (int i = 0; i < 4000; ++i) ones += s.sample(logits) == 1;
  EXPECT_NEAR(ones / 4000.0, 0.75, 0.03);
}

TEST(Sampler, SameSeedSameTokens) {
  std::vector<float> logits(1000);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = float(std::sin(double(i)));
  for (SamplingParams p : {SamplingParams{1.0f, 0, 1.0f, 0.0f, 7}, SamplingParams{0.7f, 50, 0.9f, 0.05f, 7}}) {
    Sampler a(p), b(p);
    for (int i = 0; i < 20; ++i) EXPECT_EQ(a.sample(logits), b.sample(logits));
  }
}

TEST(Sampler, MinPDropsUnlikelyCandidates) {
  // p(0) ≈ 0.84, p(1) ≈ 0.11 < 0.2 · p(0): only token 0 survives min_p = 0.2.
  const std::vector<float> logits = {2.0f, 0.0f, -1.0f};
  Sampler s(SamplingParams{1.0f, 0, 1.0f, 0.2f, 3});
  for (int i = 0; i < 200; ++i) EXPECT_EQ(s.sample(logits), 0);
}

TEST(Sampler, LogprobsAreTheLogSoftmax) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 3.0f};
  const Logprobs lp = logprobs_of(logits, 2, 3);
  double z = 0;
  for (float l : logits) z += std::exp(double(l));
  EXPECT_NEAR(lp.chosen, 2.0 - std::log(z), 1e-6);
  ASSERT_EQ(lp.top.size(), 3u);
  EXPECT_EQ(lp.top[0].id, 1);  // ties to the lower id
  EXPECT_EQ(lp.top[1].id, 3);
  EXPECT_EQ(lp.top[2].id, 2);
  EXPECT_FLOAT_EQ(lp.top[2].logprob, lp.chosen);
}

}  // namespace dsv4::engine
