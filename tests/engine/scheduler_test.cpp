// The continuous-batching scheduler on tiny-flash: requests running together (with queueing and
// admission mid-flight) produce the same greedy tokens as each run alone; cancellation frees the
// sequence; a full queue refuses; a repeated prompt resumes from the prefix cache.
#include <gtest/gtest.h>

#include "core/error.h"
#include "engine/scheduler.h"
#include "fixtures.h"

namespace dsv4::engine {

namespace {

struct Result {
  std::vector<int32_t> tokens;
  Finished finished;
};

Result collect(RequestStream& stream) {
  Result r;
  while (true) {
    RequestStream::Update u = stream.wait(std::chrono::milliseconds(100));
    for (const TokenEvent& e : u.tokens) r.tokens.push_back(e.id);
    if (u.finished) {
      r.finished = *u.finished;
      return r;
    }
  }
}

}  // namespace

class SchedulerTest : public testing::Test {
 protected:
  void SetUp() override {
    model_ = Model::load(test::fixture_model("tiny-flash"));
    engine_ = std::make_unique<Engine>(*model_, make_cpu_backend(Numerics::deepseek));
    plan_ = plan_memory(model_->config(), 0, 64, engine_->state_layout());
  }
  std::vector<int32_t> prompt(int32_t seed, int64_t n) const {
    std::vector<int32_t> p;
    for (int64_t i = 0; i < n; ++i) p.push_back(int32_t((seed * 37 + i * 11) % 200 + 2));
    return p;
  }
  // Greedy decoding of one sequence with the engine alone (EOS ends it, as in the scheduler).
  std::vector<int32_t> alone(const std::vector<int32_t>& p, int64_t max_tokens) {
    SequenceState seq = engine_->new_sequence();
    std::vector<float> logits = engine_->forward(seq, p, false);
    std::vector<int32_t> out;
    Sampler greedy(SamplingParams{});
    while (int64_t(out.size()) < max_tokens) {
      out.push_back(greedy.sample(logits));
      if (out.back() == model_->config().eos_token_id) break;
      logits = engine_->forward(seq, std::span<const int32_t>(&out.back(), 1), false);
    }
    return out;
  }
  GenerationRequest request(std::vector<int32_t> p, int64_t max_tokens) {
    GenerationRequest r;
    r.prompt = std::move(p);
    r.max_tokens = max_tokens;
    return r;
  }

  std::unique_ptr<Model> model_;
  std::unique_ptr<Engine> engine_;
  MemoryPlan plan_;
};

TEST_F(SchedulerTest, BatchedRequestsMatchEachAlone) {
  SchedulerOptions o;
  o.max_seqs = 2;  // the third waits and is admitted while the others decode
  o.prefill_chunk = 24;
  o.snapshot_interval = 16;
  const std::vector<std::vector<int32_t>> prompts = {prompt(1, 70), prompt(2, 7), prompt(3, 40)};
  std::vector<std::vector<int32_t>> want;
  for (const auto& p : prompts) want.push_back(alone(p, 8));

  Scheduler scheduler(*engine_, plan_, o);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (const auto& p : prompts) streams.push_back(scheduler.submit(request(p, 8)));
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Result r = collect(*streams[i]);
    EXPECT_EQ(r.tokens, want[i]) << "request " << i;
    EXPECT_EQ(r.finished.completion_tokens, int64_t(want[i].size()));
    EXPECT_EQ(r.finished.prompt_tokens, int64_t(prompts[i].size()));
  }
}

TEST_F(SchedulerTest, RepeatedPromptResumesFromThePrefixCache) {
  Scheduler scheduler(*engine_, plan_, SchedulerOptions{});
  const std::vector<int32_t> p = prompt(4, 140);
  const Result first = collect(*scheduler.submit(request(p, 5)));
  const Result second = collect(*scheduler.submit(request(p, 5)));
  EXPECT_EQ(first.finished.cached_tokens, 0);
  EXPECT_EQ(second.finished.cached_tokens, 139);
  EXPECT_EQ(second.tokens, first.tokens);
  EXPECT_EQ(second.tokens, alone(p, 5));
}

TEST_F(SchedulerTest, CancelFreesTheSequence) {
  Scheduler scheduler(*engine_, plan_, SchedulerOptions{});
  std::shared_ptr<RequestStream> s = scheduler.submit(request(prompt(5, 20), 100000));
  while (s->wait(std::chrono::milliseconds(100)).tokens.empty()) {
  }
  s->cancel();
  EXPECT_EQ(collect(*s).finished.reason, FinishReason::cancelled);
  scheduler.drain(std::chrono::milliseconds(10000));
  EXPECT_EQ(scheduler.stats().running, 0);
  EXPECT_EQ(scheduler.stats().state_bytes, 0u);
}

TEST_F(SchedulerTest, RefusesWhatCannotRun) {
  SchedulerOptions o;
  o.max_seqs = 1;
  o.max_queue = 1;
  o.context = 64;
  Scheduler scheduler(*engine_, plan_, o);
  auto code_of = [&](GenerationRequest r) {
    try {
      scheduler.submit(std::move(r));
    } catch (const Error& e) {
      return e.code();
    }
    return ErrorCode::internal;
  };
  EXPECT_EQ(code_of(request(prompt(6, 64), 1)), ErrorCode::invalid_input);  // no room for an answer
  std::vector<std::shared_ptr<RequestStream>> held;
  // One running (once admitted) and one queued fill it; keep submitting until refused.
  ErrorCode refused = ErrorCode::internal;
  for (int i = 0; i < 4 && refused == ErrorCode::internal; ++i) {
    try {
      held.push_back(scheduler.submit(request(prompt(7 + i, 8), 50)));
    } catch (const Error& e) {
      refused = e.code();
    }
  }
  EXPECT_EQ(refused, ErrorCode::unavailable);
  for (auto& s : held) s->cancel();
}

}  // namespace dsv4::engine
