// The MTP block as the draft model (engine/draft.cpp), taking a draft back (SequenceState::undo)
// and speculative decoding (engine/decode.cpp): the block's logits against our torch port of it
// (tools/oracle/port.py; transformers has no MTP block), in both numerics; the same logits however
// the positions are grouped into steps; a rejected token taken back leaves no trace; and
// speculative decoding generates exactly what plain decoding does.
#include <gtest/gtest.h>

#include <cstring>

#include "engine/decode.h"
#include "engine/engine.h"
#include "fixtures.h"

namespace dsv4::engine {
namespace {

const char* kModel = "tiny-flash";  // CSA and HCA layers, and the MTP block

struct Fixture {
  std::unique_ptr<Model> model = Model::load(test::fixture_model(kModel));
  std::vector<int32_t> tokens = test::read_tokens(test::fixture_logits(kModel) + "/tokens.json");
  int64_t V = model->config().vocab_size;
};

// The block's logits at positions [0, sum(chunks)) from steps of the given sizes, each followed by
// a draft with the next step's first token.
std::vector<float> draft_logits(Engine& engine, const std::vector<int32_t>& tokens, const std::vector<int64_t>& chunks) {
  SequenceState seq = engine.new_sequence(true);
  std::vector<float> all;
  int64_t p = 0;
  for (int64_t n : chunks) {
    engine.forward(seq, std::span<const int32_t>(tokens).subspan(size_t(p), size_t(n)), false);
    p += n;
    const std::vector<float> part = engine.draft(seq, tokens[size_t(p)], LogitRows::all);
    EXPECT_EQ(int64_t(part.size()), n * engine.config().vocab_size);
    all.insert(all.end(), part.begin(), part.end());
  }
  return all;
}

TEST(Draft, MtpLogitsMatchThePort) {
  Fixture f;
  const std::vector<int64_t> chunks = {1, 37, 64, 100, 97};  // 299 positions: past two turns of the window
  for (Numerics numerics : {Numerics::plain, Numerics::deepseek}) {
    SCOPED_TRACE(to_string(numerics));
    const std::vector<float> ref = test::read_f32(test::fixture_logits(kModel) + "/mtp_" + to_string(numerics) + ".f32");
    ASSERT_EQ(int64_t(ref.size()), 299 * f.V);
    Engine engine(*f.model, make_cpu_backend(numerics));
    const std::vector<float> got = draft_logits(engine, f.tokens, chunks);
    const test::LogitsDiff d = test::compare_logits(got.data(), ref.data(), 299, f.V);
    RecordProperty(std::string(to_string(numerics)) + "_max_abs_diff", std::to_string(d.max_abs));
    RecordProperty(std::string(to_string(numerics)) + "_argmax_agreement", std::to_string(d.argmax_agree));
    if (numerics == Numerics::plain) {
      EXPECT_LE(d.max_abs, 1e-3) << "worst position " << d.worst_row;
    } else {
      EXPECT_LE(d.max_abs, 2e-2) << "worst position " << d.worst_row;
      EXPECT_GE(d.argmax_agree, 0.999);
    }
  }
}

TEST(Draft, LogitsDoNotDependOnSteps) {
  Fixture f;
  Engine engine(*f.model, make_cpu_backend(Numerics::deepseek));
  const std::vector<float> a = draft_logits(engine, f.tokens, {150, 50});
  const std::vector<float> b = draft_logits(engine, f.tokens, {1, 1, 2, 63, 64, 65, 1, 3});
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
}

// Drafts of several sequences in one pass (different positions, different numbers of waiting
// rows, logits of the last or of every row) equal each sequence's draft alone, bit for bit.
TEST(Draft, BatchedDraftsMatchEachAlone) {
  Fixture f;
  Engine engine(*f.model, make_cpu_backend(Numerics::deepseek));
  const std::span<const int32_t> tokens(f.tokens);
  const std::vector<std::pair<int64_t, int64_t>> runs = {{0, 1}, {40, 7}, {130, 20}};  // (first token, count)
  auto make = [&] {
    std::vector<SequenceState> seqs;
    for (const auto& [first, n] : runs) {
      seqs.push_back(engine.new_sequence(true));
      engine.forward(seqs.back(), tokens.subspan(size_t(first), size_t(n)), false);
    }
    return seqs;
  };
  std::vector<SequenceState> alone = make(), together = make();
  std::vector<Engine::DraftStep> steps;
  for (size_t i = 0; i < runs.size(); ++i)
    steps.push_back({&together[i], tokens[size_t(runs[i].first + runs[i].second)], i == 1 ? LogitRows::all : LogitRows::last});
  const std::vector<std::vector<float>> batched = engine.draft_batch(steps);
  for (size_t i = 0; i < runs.size(); ++i) {
    const std::vector<float> want = engine.draft(alone[i], steps[i].next, steps[i].logits);
    ASSERT_EQ(batched[i].size(), want.size()) << "sequence " << i;
    EXPECT_EQ(0, std::memcmp(batched[i].data(), want.data(), want.size() * sizeof(float))) << "sequence " << i;
  }
}

// A wrong token at position q, taken back, then the right one: the logits from there on are those
// of a sequence that never saw the wrong one. q covers ratio-4 windows completing (q ≡ 3 mod 4)
// or not, and a ratio-128 window completing (q = 255).
TEST(Draft, UndoLeavesNoTrace) {
  Fixture f;
  for (Numerics numerics : {Numerics::plain, Numerics::deepseek}) {
    Engine engine(*f.model, make_cpu_backend(numerics));
    for (int64_t q : {5, 7, 131, 255}) {
      SCOPED_TRACE(std::string(to_string(numerics)) + ", position " + std::to_string(q));
      const std::span<const int32_t> tokens(f.tokens);
      SequenceState clean = engine.new_sequence(true), detour = engine.new_sequence(true);
      engine.forward(clean, tokens.first(size_t(q)), false);
      engine.forward(detour, tokens.first(size_t(q)), false);
      const UndoPoint undo = detour.undo_point(q);
      const int32_t wrong = (tokens[size_t(q)] + 1) % int32_t(f.V);
      engine.forward(detour, std::span<const int32_t>(&wrong, 1), false);
      detour.undo(undo);
      EXPECT_EQ(detour.n_past, q);
      const std::vector<float> want = engine.forward(clean, tokens.subspan(size_t(q), 9), true);
      const std::vector<float> got = engine.forward(detour, tokens.subspan(size_t(q), 9), true);
      ASSERT_EQ(want.size(), got.size());
      EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)));
      const std::vector<float> want_draft = engine.draft(clean, tokens[size_t(q) + 9], LogitRows::all);
      const std::vector<float> got_draft = engine.draft(detour, tokens[size_t(q) + 9], LogitRows::all);
      ASSERT_EQ(want_draft.size(), got_draft.size());
      EXPECT_EQ(0, std::memcmp(want_draft.data(), got_draft.data(), want_draft.size() * sizeof(float)));
    }
  }
}

// Speculative decoding against plain decoding, greedy and sampled. Random weights make the block's
// own drafts almost always wrong, so a scripted draft is also used: the right token (from the plain
// run) at some steps, a wrong one at others, so both paths run many times.
TEST(Draft, SpeculativeDecodingGeneratesWhatPlainDecodingDoes) {
  Fixture f;
  Engine engine(*f.model, make_cpu_backend(Numerics::deepseek));
  const std::vector<int32_t> prompt(f.tokens.begin(), f.tokens.begin() + 120);  // crosses the window while decoding
  for (float temperature : {0.0f, 0.8f}) {
    SCOPED_TRACE("temperature " + std::to_string(temperature));
    SamplingParams sampling;
    sampling.temperature = temperature;
    sampling.seed = 7;
    // on_token counts what is emitted: a draft made then guesses output number `emitted`.
    int64_t emitted = 0;
    auto run = [&](bool speculative, const std::function<int32_t(std::span<const float>)>& choose,
                   DecodeStats* stats) {
      SequenceState seq = engine.new_sequence(speculative);
      std::vector<float> logits = engine.prefill(seq, prompt, 50, false);
      Sampler sampler(sampling);
      DecodeOptions o;
      o.max_tokens = 40;
      o.speculative = speculative;
      o.choose_draft = choose;
      emitted = 0;
      const std::vector<int32_t> out = decode(engine, seq, std::move(logits), sampler, o, [&](int32_t) { ++emitted; }, stats);
      EXPECT_EQ(seq.n_past, int64_t(prompt.size() + out.size()) - 1) << "the sequence holds all but the last token";
      return out;
    };
    const std::vector<int32_t> plain = run(false, {}, nullptr);
    ASSERT_EQ(plain.size(), 40u);
    DecodeStats own;
    EXPECT_EQ(run(true, {}, &own), plain);
    EXPECT_GT(own.drafted, 0);
    // Right on every other guess, wrong on the others.
    DecodeStats scripted;
    int64_t guesses = 0;
    const std::vector<int32_t> spec = run(
        true,
        [&](std::span<const float>) {
          const int32_t right = plain[size_t(emitted)];
          return guesses++ % 2 == 0 ? right : (right + 1) % int32_t(f.V);
        },
        &scripted);
    EXPECT_EQ(spec, plain);
    EXPECT_GT(scripted.accepted, 5);
    EXPECT_GT(scripted.drafted - scripted.accepted, 5);
    EXPECT_LT(scripted.steps, 39);  // plain decoding takes 39 steps after the prefill
  }
}

}  // namespace
}  // namespace dsv4::engine
