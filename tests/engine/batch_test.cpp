// Continuous batching and prefix reuse at the engine level: a batched forward over several
// sequences (prefill chunks, decode rows, no-logits chunks mixed) is bit-identical to running each
// step alone, and a sequence restored from a snapshot continues bit-identically to one that never
// stopped. Both numerics, on tiny-flash (CSA, HCA and SWA layers).
#include <gtest/gtest.h>

#include <cstring>

#include "core/error.h"
#include "engine/engine.h"
#include "fixtures.h"

namespace dsv4::engine {

class Batch : public testing::TestWithParam<Numerics> {
 protected:
  void SetUp() override {
    model_ = Model::load(test::fixture_model("tiny-flash"));
    tokens_ = test::read_tokens(test::fixture_logits("tiny-flash") + "/tokens.json");
    engine_ = std::make_unique<Engine>(*model_, make_cpu_backend(GetParam()));
  }
  std::span<const int32_t> tokens(int64_t begin, int64_t n) const {
    return std::span<const int32_t>(tokens_).subspan(size_t(begin), size_t(n));
  }
  static void expect_bit_identical(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << what;
  }

  std::unique_ptr<Model> model_;
  std::unique_ptr<Engine> engine_;
  std::vector<int32_t> tokens_;
};

TEST_P(Batch, MixedPrefillAndDecodeMatchesEachSequenceAlone) {
  // Three sequences at different depths (past the window of 128 and the first HCA row): A decodes,
  // B prefills a chunk, C runs a chunk without logits; then all three decode one token together.
  struct World {
    SequenceState a, b, c;
  };
  auto setup = [&](World& w) {
    engine_->forward(w.a, tokens(0, 140), false);
    engine_->forward(w.c, tokens(1000, 130), false);
  };
  World alone{engine_->new_sequence(), engine_->new_sequence(), engine_->new_sequence()};
  World batched{engine_->new_sequence(), engine_->new_sequence(), engine_->new_sequence()};
  setup(alone);
  setup(batched);

  std::vector<std::vector<float>> want;
  want.push_back(engine_->forward(alone.a, tokens(140, 1), false));
  want.push_back(engine_->forward(alone.b, tokens(500, 60), true));
  engine_->forward(alone.c, tokens(1130, 20), false);
  want.push_back(engine_->forward(alone.a, tokens(141, 1), false));
  want.push_back(engine_->forward(alone.b, tokens(560, 1), false));
  want.push_back(engine_->forward(alone.c, tokens(1150, 1), false));

  const std::vector<Step> first = {{&batched.a, tokens(140, 1), LogitRows::last},
                                   {&batched.b, tokens(500, 60), LogitRows::all},
                                   {&batched.c, tokens(1130, 20), LogitRows::none}};
  std::vector<std::vector<float>> got = engine_->forward_batch(first);
  EXPECT_TRUE(got[2].empty());
  got.pop_back();
  const std::vector<Step> second = {{&batched.a, tokens(141, 1), LogitRows::last},
                                    {&batched.b, tokens(560, 1), LogitRows::last},
                                    {&batched.c, tokens(1150, 1), LogitRows::last}};
  for (std::vector<float>& l : engine_->forward_batch(second)) got.push_back(std::move(l));

  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) expect_bit_identical(got[i], want[i], "output " + std::to_string(i));
  EXPECT_EQ(batched.a.n_past, 142);
  EXPECT_EQ(batched.b.n_past, 61);
  EXPECT_EQ(batched.c.n_past, 151);
}

TEST_P(Batch, RejectsTheSameSequenceTwice) {
  SequenceState seq = engine_->new_sequence();
  const std::vector<Step> steps = {{&seq, tokens(0, 2), LogitRows::last}, {&seq, tokens(2, 2), LogitRows::last}};
  EXPECT_THROW(engine_->forward_batch(steps), Error);
  EXPECT_EQ(seq.n_past, 0);
}

TEST_P(Batch, RestoredSnapshotContinuesBitIdentically) {
  // 262 is neither a multiple of 4 nor 128 nor inside the first window: the carries, the ring and
  // the compressed rows all matter.
  const int64_t at = 262, rest = 150;
  SequenceState original = engine_->new_sequence();
  engine_->forward(original, tokens(0, at), false);
  const StateSnapshot snap = original.snapshot();
  EXPECT_EQ(snap.n_past, at);
  EXPECT_GT(snap.bytes(), 0u);
  const std::vector<float> want = engine_->forward(original, tokens(at, rest), true);

  SequenceState resumed = engine_->new_sequence();
  engine_->forward(resumed, tokens(2000, 60), false);  // some other conversation first
  resumed.restore(snap);
  EXPECT_EQ(resumed.n_past, at);
  expect_bit_identical(engine_->forward(resumed, tokens(at, rest), true), want, "resumed");
}

INSTANTIATE_TEST_SUITE_P(Numerics, Batch, testing::Values(Numerics::deepseek, Numerics::plain),
                         [](const testing::TestParamInfo<Numerics>& info) { return std::string(to_string(info.param)); });

}  // namespace dsv4::engine
