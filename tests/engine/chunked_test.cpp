// Chunked prefill at any chunk size, continuing at any position, and single-token decode give
// the same logits as one-shot prefill (issue 2, item 5): the compressor carries, the ring and
// the visibility rules make the state independent of how the prompt was cut.
#include <gtest/gtest.h>

#include "core/error.h"
#include "engine/engine.h"
#include "fixtures.h"

namespace dsv4::engine {

class Chunked : public testing::Test {
 protected:
  void SetUp() override {
    model_ = Model::load(test::fixture_model("tiny-flash"));
    const std::vector<int32_t> all = test::read_tokens(test::fixture_logits("tiny-flash") + "/tokens.json");
    tokens_.assign(all.begin(), all.begin() + kPrompt);
    engine_ = std::make_unique<Engine>(*model_, make_cpu_backend(Numerics::plain));
  }

  // The one-shot prefill's logits, made on first use: it is the slowest step of a case (ctest runs
  // each case in its own process), and a case that does not compare against it skips it.
  const std::vector<float>& one_shot() {
    if (one_shot_.empty()) {
      SequenceState seq = engine_->new_sequence();
      one_shot_ = engine_->forward(seq, tokens_, true);
    }
    return one_shot_;
  }

  void expect_matches_one_shot(const std::vector<float>& logits, const std::string& what) {
    const int64_t V = model_->config().vocab_size;
    ASSERT_EQ(logits.size(), one_shot().size()) << what;
    const test::LogitsDiff d = test::compare_logits(logits.data(), one_shot().data(), kPrompt, V);
    EXPECT_LE(d.max_abs, 1e-4) << what << ": worst position " << d.worst_row;
  }

  void expect_prefill_matches_one_shot(int64_t chunk) {
    SequenceState seq = engine_->new_sequence();
    expect_matches_one_shot(engine_->prefill(seq, tokens_, chunk, true), "chunk " + std::to_string(chunk));
    EXPECT_EQ(seq.n_past, kPrompt);
  }

  // Long enough for several HCA windows (ratio 128) and far more CSA rows than index_topk.
  static constexpr int64_t kPrompt = 1100;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Engine> engine_;
  std::vector<int32_t> tokens_;
  std::vector<float> one_shot_;
};

TEST_F(Chunked, AnyChunkSizeMatchesOneShot) {
  for (int64_t chunk : {3, 64, 1000}) expect_prefill_matches_one_shot(chunk);
}

// Chunks of one token are 1 100 forward passes, most of the suite's time: the sanitizer pass skips
// this case (scripts/test's `_long` rule), and DecodeAfterPrefillMatchesOneShot runs the same
// single-token code there.
TEST_F(Chunked, TokenByTokenPrefillMatchesOneShot_long) { expect_prefill_matches_one_shot(1); }

TEST_F(Chunked, ChunkedPrefillForGenerationReturnsTheLastRow) {
  const int64_t V = model_->config().vocab_size;
  SequenceState seq = engine_->new_sequence();
  const std::vector<float> last = engine_->prefill(seq, tokens_, 400, false);
  ASSERT_EQ(int64_t(last.size()), V);
  const test::LogitsDiff d = test::compare_logits(last.data(), one_shot().data() + (kPrompt - 1) * V, 1, V);
  EXPECT_LE(d.max_abs, 1e-4);
}

TEST_F(Chunked, DecodeAfterPrefillMatchesOneShot) {
  SequenceState seq = engine_->new_sequence();
  const int64_t prefill = 1000;
  std::vector<float> logits =
      engine_->forward(seq, std::span<const int32_t>(tokens_.data(), size_t(prefill)), true);
  for (int64_t t = prefill; t < kPrompt; ++t) {
    const std::vector<float> step = engine_->forward(seq, std::span<const int32_t>(&tokens_[size_t(t)], 1), true);
    logits.insert(logits.end(), step.begin(), step.end());
  }
  expect_matches_one_shot(logits, "decode");
}

TEST_F(Chunked, ResetStartsAFreshSequence) {
  SequenceState seq = engine_->new_sequence();
  engine_->forward(seq, std::span<const int32_t>(tokens_.data(), 300), false);
  seq.reset();
  expect_matches_one_shot(engine_->forward(seq, tokens_, true), "after reset");
}

TEST_F(Chunked, RejectsTokensOutsideTheVocabulary) {
  SequenceState seq = engine_->new_sequence();
  const std::vector<int32_t> bad = {1, 2, int32_t(model_->config().vocab_size)};
  try {
    engine_->forward(seq, bad, false);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token 256 at position 2: outside the vocabulary"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(seq.n_past, 0);  // nothing ran
}

}  // namespace dsv4::engine
