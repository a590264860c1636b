// The engine against the oracle (tools/oracle/): `plain` numerics against transformers'
// DeepseekV4ForCausalLM in float32, `deepseek` numerics against our torch port of the official
// numerics. Prompts are prefixes of each fixture's token list (logits are causal, so the
// reference rows of the full list apply); every prefix is a fresh sequence and one pass.
#include <gtest/gtest.h>

#include <filesystem>

#include "engine/engine.h"
#include "fixtures.h"

namespace dsv4::engine {

struct OracleCase {
  std::string model;
  int64_t prompt;  // prefix length
  Numerics numerics;
};

// Prompts of 1000 tokens and more are marked `_long`: the sanitizer pass of scripts/test skips them.
std::string case_name(const testing::TestParamInfo<OracleCase>& info) {
  std::string m = info.param.model;
  for (char& ch : m)
    if (ch == '-') ch = '_';
  return m + "_" + std::to_string(info.param.prompt) + "_" + to_string(info.param.numerics) +
         (info.param.prompt >= 1000 ? "_long" : "");
}

void PrintTo(const OracleCase& c, std::ostream* os) {
  *os << c.model << ", " << c.prompt << " tokens, " << to_string(c.numerics);
}

class Oracle : public testing::TestWithParam<OracleCase> {};

TEST_P(Oracle, LogitsMatchTheReference) {
  const OracleCase& c = GetParam();
  const std::string ref_dir = test::fixture_logits(c.model);
  const std::vector<int32_t> all_tokens = test::read_tokens(ref_dir + "/tokens.json");
  ASSERT_LE(c.prompt, int64_t(all_tokens.size()));
  const std::vector<float> ref = test::read_f32(ref_dir + "/" + to_string(c.numerics) + ".f32");

  auto model = Model::load(test::fixture_model(c.model));
  const int64_t V = model->config().vocab_size;
  ASSERT_EQ(int64_t(ref.size()), int64_t(all_tokens.size()) * V);
  Engine engine(*model, make_cpu_backend(c.numerics));
  SequenceState seq = engine.new_sequence();
  const std::vector<int32_t> prompt(all_tokens.begin(), all_tokens.begin() + c.prompt);
  const std::vector<float> logits = engine.forward(seq, prompt, true);

  const test::LogitsDiff d = test::compare_logits(logits.data(), ref.data(), c.prompt, V);
  RecordProperty("max_abs_diff", std::to_string(d.max_abs));
  RecordProperty("argmax_agreement", std::to_string(d.argmax_agree));
  if (c.numerics == Numerics::plain) {
    EXPECT_LE(d.max_abs, 1e-3) << "worst position " << d.worst_row;
  } else {
    EXPECT_LE(d.max_abs, 2e-2) << "worst position " << d.worst_row;
    EXPECT_GE(d.argmax_agree, 0.999);
  }
}

std::vector<OracleCase> oracle_cases() {
  std::vector<OracleCase> cases;
  for (const char* model : {"tiny-flash", "tiny-pro", "tiny-swa"}) {
    if (!std::filesystem::exists(test::fixture_logits(model) + "/tokens.json")) continue;
    const int64_t n = int64_t(test::read_tokens(test::fixture_logits(model) + "/tokens.json").size());
    for (Numerics numerics : {Numerics::plain, Numerics::deepseek})
      for (int64_t prompt : {int64_t(1), int64_t(7), int64_t(129), int64_t(1000), n})
        if (prompt <= n) cases.push_back({model, prompt, numerics});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Oracle, testing::ValuesIn(oracle_cases()), case_name);

}  // namespace dsv4::engine
