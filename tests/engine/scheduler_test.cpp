// The continuous-batching scheduler on tiny-flash: requests running together (with queueing and
// admission mid-flight) produce the same greedy tokens as each run alone; cancellation frees the
// sequence; a full queue refuses; a repeated prompt resumes from the prefix cache; sequences
// preempted to disk resume bit-identically.
#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

#include "core/error.h"
#include "core/formats.h"
#include "engine/scheduler.h"
#include "fixtures.h"

namespace dsv4::engine {

namespace {

struct Result {
  std::vector<int32_t> tokens;
  std::vector<float> chosen_logprobs;  // with top_logprobs ≥ 0
  Finished finished;
};

Result collect(RequestStream& stream) {
  Result r;
  while (true) {
    RequestStream::Update u = stream.wait(std::chrono::milliseconds(100));
    for (const TokenEvent& e : u.tokens) r.tokens.push_back(e.id), r.chosen_logprobs.push_back(e.logprobs.chosen);
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

// One sequence slot, three requests: without preemption they run one after the other; with it,
// each is parked to a state file after 3 steps whenever another waits, and they take turns. Every
// token and its log-probability come out the same (the logits are bit-identical), the files are
// gone afterwards, and a client that leaves while parked is finished.
TEST_F(SchedulerTest, PreemptedSequencesResumeBitIdentically) {
  const std::vector<std::vector<int32_t>> prompts = {prompt(6, 30), prompt(7, 9), prompt(8, 17)};
  const std::filesystem::path swap = std::filesystem::path(testing::TempDir()) / "dsv4_scheduler_swap";
  std::filesystem::remove_all(swap);
  auto run = [&](int64_t preempt_after_steps) {
    SchedulerOptions o;
    o.max_seqs = 1;
    o.preempt_after_steps = preempt_after_steps;
    o.swap_dir = swap.string();
    Scheduler scheduler(*engine_, plan_, o);
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (const auto& p : prompts) {
      GenerationRequest r = request(p, 12);
      r.top_logprobs = 0;
      streams.push_back(scheduler.submit(std::move(r)));
    }
    std::vector<Result> results;
    for (auto& s : streams) results.push_back(collect(*s));
    scheduler.drain(std::chrono::milliseconds(10000));
    EXPECT_EQ(scheduler.stats().parked, 0);
    return std::pair{results, scheduler.stats().preemptions};
  };
  const auto [plain, none] = run(0);
  const auto [turns, preemptions] = run(3);
  EXPECT_EQ(none, 0);
  EXPECT_GE(preemptions, 2);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(turns[i].tokens, plain[i].tokens) << "request " << i;
    EXPECT_EQ(turns[i].tokens, alone(prompts[i], 12)) << "request " << i;
    ASSERT_EQ(turns[i].chosen_logprobs.size(), plain[i].chosen_logprobs.size());
    for (size_t j = 0; j < plain[i].chosen_logprobs.size(); ++j)
      EXPECT_EQ(f32_bits(turns[i].chosen_logprobs[j]), f32_bits(plain[i].chosen_logprobs[j])) << i << ", " << j;
    EXPECT_EQ(turns[i].finished.reason, plain[i].finished.reason);
  }
  EXPECT_TRUE(std::filesystem::is_empty(swap)) << "parked state files left in " << swap;

  {  // A client that leaves while its sequence is parked.
    SchedulerOptions o;
    o.max_seqs = 1;
    o.preempt_after_steps = 2;
    o.swap_dir = swap.string();
    Scheduler scheduler(*engine_, plan_, o);
    std::shared_ptr<RequestStream> first = scheduler.submit(request(prompt(9, 12), 100000));
    for (size_t n = 0; n < 3;) n += first->wait(std::chrono::milliseconds(100)).tokens.size();
    std::shared_ptr<RequestStream> second = scheduler.submit(request(prompt(10, 12), 100000));
    while (scheduler.stats().parked == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    first->cancel();
    second->cancel();
    EXPECT_EQ(collect(*first).finished.reason, FinishReason::cancelled);
    EXPECT_EQ(collect(*second).finished.reason, FinishReason::cancelled);
    scheduler.drain(std::chrono::milliseconds(10000));
    EXPECT_EQ(scheduler.stats().running, 0);
  }
  EXPECT_TRUE(std::filesystem::is_empty(swap)) << "parked state files left in " << swap;
  std::filesystem::remove_all(swap);
}

// Speculative decoding in the scheduler generates what it does without: requests running
// together (greedy, sampled, with logprobs), one resuming from the prefix cache, and with sequences
// preempted to disk (a resumed sequence drafts again after one plain step). The block's own drafts
// are almost never right with random weights, so the drafts are scripted: right every other time.
TEST_F(SchedulerTest, SpeculativeDecodingGeneratesWhatPlainDecodingDoes) {
  const std::vector<std::vector<int32_t>> prompts = {prompt(11, 70), prompt(12, 9), prompt(13, 33), prompt(11, 70)};
  const std::filesystem::path swap = std::filesystem::path(testing::TempDir()) / "dsv4_scheduler_spec_swap";
  auto run = [&](bool speculative, int64_t preempt_after_steps, const std::vector<Result>* plain,
                 SchedulerStats* stats) {
    SchedulerOptions o;
    o.max_seqs = 2;
    o.prefill_chunk = 24;
    o.snapshot_interval = 16;
    o.preempt_after_steps = preempt_after_steps;
    o.swap_dir = swap.string();
    o.speculative = speculative;
    int64_t guesses = 0;  // the engine thread's alone
    if (plain)
      o.choose_draft = [&](std::span<const int32_t> fed, std::span<const float>) {
        for (size_t i = 0; i < prompts.size(); ++i) {
          const std::vector<int32_t>& p = prompts[i];
          const std::vector<int32_t>& out = (*plain)[i].tokens;
          if (fed.size() < p.size() || !std::equal(p.begin(), p.end(), fed.begin())) continue;
          const size_t at = fed.size() - p.size();  // the draft guesses output number `at`
          if (at < out.size() && std::equal(out.begin(), out.begin() + at, fed.begin() + p.size()))
            return guesses++ % 2 == 0 ? out[at] : (out[at] + 1) % 200;
        }
        return int32_t(0);
      };
    Scheduler scheduler(*engine_, plan_, o);
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (size_t i = 0; i < prompts.size(); ++i) {
      GenerationRequest r = request(prompts[i], 14);
      r.top_logprobs = 0;
      r.sampling.temperature = i % 2 ? 0.9f : 0.0f;
      r.sampling.seed = 100 + i;
      streams.push_back(scheduler.submit(std::move(r)));
    }
    std::vector<Result> results;
    for (auto& s : streams) results.push_back(collect(*s));
    scheduler.drain(std::chrono::milliseconds(10000));
    if (stats) *stats = scheduler.stats();
    return results;
  };
  const std::vector<Result> plain = run(false, 0, nullptr, nullptr);
  for (int64_t preempt : {0, 3}) {
    SCOPED_TRACE("preempt after " + std::to_string(preempt) + " steps");
    SchedulerStats stats;
    const std::vector<Result> spec = run(true, preempt, &plain, &stats);
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(spec[i].tokens, plain[i].tokens) << "request " << i;
      ASSERT_EQ(spec[i].chosen_logprobs.size(), plain[i].chosen_logprobs.size());
      for (size_t j = 0; j < plain[i].chosen_logprobs.size(); ++j)
        EXPECT_EQ(f32_bits(spec[i].chosen_logprobs[j]), f32_bits(plain[i].chosen_logprobs[j])) << i << ", " << j;
      EXPECT_EQ(spec[i].finished.reason, plain[i].finished.reason);
    }
    EXPECT_GT(stats.accepted, 5);
    EXPECT_GT(stats.drafted - stats.accepted, 5);
    EXPECT_EQ(stats.preemptions > 0, preempt > 0);
  }
  std::filesystem::remove_all(swap);
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
