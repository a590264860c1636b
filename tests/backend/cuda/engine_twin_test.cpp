// The engine end to end on the CUDA backend: logits on the committed fixtures against the oracle
// references (the thresholds of tests/engine/oracle_test.cpp) and against the CPU engine (ideally
// bit for bit), chunked prefill / decode on the GPU against one pass, state files moved
// between the GPU and the CPU, the MTP block's drafts and speculative decoding, and decode steps
// run as CUDA graphs against the same steps launched kernel by kernel.
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "engine/decode.h"
#include "engine/engine.h"
#include "engine/state_file.h"
#include "../../engine/fixtures.h"
#include "twin.h"

namespace dsv4::test {

using engine::Engine;
using engine::Model;
using engine::SequenceState;

struct EngineCase {
  std::string model;
  int64_t prompt;  // prefix length; the CPU comparison runs only at ≤ 129 tokens (time)
  Numerics numerics;
};

std::string engine_case_name(const testing::TestParamInfo<EngineCase>& info) {
  std::string m = info.param.model;
  for (char& ch : m)
    if (ch == '-') ch = '_';
  return m + "_" + std::to_string(info.param.prompt) + "_" + to_string(info.param.numerics) +
         (info.param.prompt >= 1000 ? "_long" : "");
}

void PrintTo(const EngineCase& c, std::ostream* os) {
  *os << c.model << ", " << c.prompt << " tokens, " << to_string(c.numerics);
}

class CudaEngine : public testing::TestWithParam<EngineCase> {};

TEST_P(CudaEngine, LogitsMatchTheReferenceAndTheCpu) {
  DSV4_REQUIRE_GPU();
  const EngineCase& c = GetParam();
  const std::string ref_dir = fixture_logits(c.model);
  const std::vector<int32_t> all_tokens = read_tokens(ref_dir + "/tokens.json");
  ASSERT_LE(c.prompt, int64_t(all_tokens.size()));
  const std::vector<float> ref = read_f32(ref_dir + "/" + to_string(c.numerics) + ".f32");
  auto model = Model::load(fixture_model(c.model));
  const int64_t V = model->config().vocab_size;
  const std::vector<int32_t> prompt(all_tokens.begin(), all_tokens.begin() + c.prompt);

  Engine gpu(*model, make_cuda_backend(c.numerics));
  SequenceState seq = gpu.new_sequence();
  const std::vector<float> logits = gpu.forward(seq, prompt, true);
  ASSERT_EQ(int64_t(logits.size()), c.prompt * V);

  const LogitsDiff d = compare_logits(logits.data(), ref.data(), c.prompt, V);
  const std::vector<float> ref_prefix(ref.begin(), ref.begin() + c.prompt * V);
  std::printf("[ e2e      ] %s %lld tokens %s vs reference: max|d| %.3g, argmax %.4f, bit-identical %lld/%lld\n",
              c.model.c_str(), (long long)c.prompt, to_string(c.numerics), d.max_abs, d.argmax_agree,
              (long long)identical(logits, ref_prefix), (long long)logits.size());
  if (c.numerics == Numerics::plain) {
    EXPECT_LE(d.max_abs, 1e-3) << "worst position " << d.worst_row;
  } else {
    EXPECT_LE(d.max_abs, 2e-2) << "worst position " << d.worst_row;
    EXPECT_GE(d.argmax_agree, 0.999);
  }

  if (c.prompt > 129) return;
  Engine cpu(*model, make_cpu_backend(c.numerics));
  SequenceState cpu_seq = cpu.new_sequence();
  const std::vector<float> cpu_logits = cpu.forward(cpu_seq, prompt, true);
  const LogitsDiff dc = compare_logits(logits.data(), cpu_logits.data(), c.prompt, V);
  const int64_t same = identical(logits, cpu_logits);
  std::printf("[ e2e      ] %s %lld tokens %s vs CPU engine: max|d| %.3g, bit-identical %lld/%lld\n", c.model.c_str(),
              (long long)c.prompt, to_string(c.numerics), dc.max_abs, (long long)same, (long long)logits.size());
  EXPECT_EQ(same, int64_t(logits.size())) << "GPU and CPU logits differ: max|Δ| " << dc.max_abs;
}

std::vector<EngineCase> engine_cases() {
  std::vector<EngineCase> cases;
  for (const std::string model : {"tiny-flash", "tiny-pro", "tiny-swa"}) {
    if (!std::filesystem::exists(fixture_logits(model) + "/tokens.json")) continue;
    const int64_t n = int64_t(read_tokens(fixture_logits(model) + "/tokens.json").size());
    for (Numerics numerics : {Numerics::plain, Numerics::deepseek})
      for (int64_t prompt : {int64_t(1), int64_t(7), int64_t(129), n})
        if (prompt <= n) cases.push_back({model, prompt, numerics});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaEngine, testing::ValuesIn(engine_cases()), engine_case_name);

// The GPU's state ops (ring, carries, row stores) make chunking invisible: any chunk size and
// token-by-token decode give the one-pass logits bit for bit.
TEST(CudaEngineState, ChunkedPrefillAndDecodeMatchOnePass) {
  DSV4_REQUIRE_GPU();
  auto model = Model::load(fixture_model("tiny-flash"));
  const std::vector<int32_t> all = read_tokens(fixture_logits("tiny-flash") + "/tokens.json");
  const int64_t n = 600, V = model->config().vocab_size;
  const std::vector<int32_t> tokens(all.begin(), all.begin() + n);
  for (Numerics numerics : {Numerics::deepseek, Numerics::plain}) {
    Engine gpu(*model, make_cuda_backend(numerics));
    SequenceState one = gpu.new_sequence();
    const std::vector<float> one_shot = gpu.forward(one, tokens, true);
    for (int64_t chunk : {1, 7, 128, 300}) {
      SequenceState seq = gpu.new_sequence();
      const std::vector<float> chunked = gpu.prefill(seq, tokens, chunk, true);
      ASSERT_EQ(chunked.size(), one_shot.size());
      const LogitsDiff d = compare_logits(chunked.data(), one_shot.data(), n, V);
      EXPECT_EQ(identical(chunked, one_shot), int64_t(one_shot.size()))
          << to_string(numerics) << " chunk " << chunk << ": max|Δ| " << d.max_abs;
    }
    {
      SequenceState seq = gpu.new_sequence();
      gpu.forward(seq, std::span<const int32_t>(tokens.data(), 100), false);
      seq.reset();
      const std::vector<float> again = gpu.forward(seq, tokens, true);
      EXPECT_EQ(identical(again, one_shot), int64_t(one_shot.size())) << to_string(numerics) << " after reset";
    }
  }
}

// Decode steps run as CUDA graphs (captured, an executable graph updated to each, launched) give
// the logits of the same steps launched kernel by kernel, bit for bit: one sequence alone, then
// with a second one batched beside it, over 300 positions (compressors completing windows of 4
// and 128, the ring wrapping, the indexer past its top-k). Every step runs as graphs, one per
// sublayer and one for the head, and a few executable graphs serve them all (updated, not made
// afresh).
TEST(CudaEngineState, DecodeStepsAsCudaGraphsMatchEagerSteps) {
  DSV4_REQUIRE_GPU();
  auto model = Model::load(fixture_model("tiny-flash"));
  const std::vector<int32_t> all = read_tokens(fixture_logits("tiny-flash") + "/tokens.json");
  const int64_t n = 300, second_from = 260;
  ASSERT_GE(int64_t(all.size()), n);
  auto decode = [&](Numerics numerics, bool graphs, Backend::CaptureStats& stats) {
    setenv("DSV4_CUDA_GRAPHS", graphs ? "1" : "0", 1);
    Engine gpu(*model, make_cuda_backend(numerics));
    unsetenv("DSV4_CUDA_GRAPHS");
    SequenceState a = gpu.new_sequence(), b = gpu.new_sequence();
    std::vector<float> out;
    for (int64_t p = 0; p < n; ++p) {
      std::vector<engine::Step> steps = {{&a, std::span<const int32_t>(&all[size_t(p)], 1)}};
      if (p >= second_from) steps.push_back({&b, std::span<const int32_t>(&all[size_t(p - second_from)], 1)});
      for (const std::vector<float>& logits : gpu.forward_batch(steps)) out.insert(out.end(), logits.begin(), logits.end());
    }
    stats = gpu.backend().capture_stats();
    return out;
  };
  for (Numerics numerics : {Numerics::deepseek, Numerics::plain}) {
    Backend::CaptureStats eager_stats, graph_stats;
    const std::vector<float> eager = decode(numerics, false, eager_stats);
    const std::vector<float> graphs = decode(numerics, true, graph_stats);
    std::printf("[ graphs   ] tiny-flash %s: %lld steps as %lld graphs, %lld executable graphs made\n",
                to_string(numerics), (long long)graph_stats.steps, (long long)graph_stats.launched,
                (long long)graph_stats.instantiated);
    ASSERT_EQ(graphs.size(), eager.size());
    EXPECT_EQ(identical(graphs, eager), int64_t(eager.size())) << to_string(numerics);
    EXPECT_EQ(eager_stats.steps, 0);
    EXPECT_EQ(eager_stats.launched, 0);
    EXPECT_EQ(graph_stats.steps, n);
    EXPECT_EQ(graph_stats.launched, n * (2 * model->config().n_layers + 1));
    EXPECT_LT(4 * graph_stats.instantiated, graph_stats.launched);
  }
}

// A state saved from the GPU (to_host) and loaded back onto the GPU (from_host) or onto the CPU
// continues bit-identically to the GPU sequence that never stopped.
TEST(CudaEngineState, StateFileMovesBetweenTheGpuAndTheCpu) {
  DSV4_REQUIRE_GPU();
  auto model = Model::load(fixture_model("tiny-flash"));
  const std::vector<int32_t> all = read_tokens(fixture_logits("tiny-flash") + "/tokens.json");
  const int64_t at = 262, rest = 150;  // inside a ratio-4 and a ratio-128 window, past the ring
  const std::span<const int32_t> prefix(all.data(), size_t(at)), next(all.data() + at, size_t(rest));
  const std::filesystem::path path = std::filesystem::path(testing::TempDir()) / "cuda_state_file_test.bin";
  const engine::StateFingerprint fingerprint =
      engine::state_fingerprint(model->config(), model->weights(), Numerics::deepseek, StateLayout::compact);

  Engine gpu(*model, make_cuda_backend(Numerics::deepseek));
  SequenceState original = gpu.new_sequence();
  gpu.forward(original, prefix, false);
  engine::save_state(path, fingerprint, prefix, original.snapshot(), gpu.backend());
  const std::vector<float> want = gpu.forward(original, next, true);

  Engine cpu(*model, make_cpu_backend(Numerics::deepseek));
  for (Engine* eng : {&gpu, &cpu}) {
    SequenceState resumed = eng->new_sequence();
    resumed.restore(engine::load_state(path, fingerprint, eng->backend()).snapshot);
    const std::vector<float> got = eng->forward(resumed, next, true);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(identical(got, want), int64_t(want.size())) << "loaded on " << eng->backend().name();
  }
  std::filesystem::remove(path);
}

// The MTP block's draft logits on the GPU equal the CPU's (positions in uneven steps, 299 of them
// past two turns of its window), and speculative decoding on the GPU generates what plain decoding
// on the GPU and on the CPU do, with scripted drafts right every other time.
TEST(CudaEngineState, DraftsAndSpeculativeDecodingMatchTheCpu) {
  DSV4_REQUIRE_GPU();
  auto model = Model::load(fixture_model("tiny-flash"));
  const std::vector<int32_t> all = read_tokens(fixture_logits("tiny-flash") + "/tokens.json");
  const int64_t V = model->config().vocab_size;
  auto drafts = [&](Engine& eng) {
    SequenceState seq = eng.new_sequence(true);
    std::vector<float> out;
    int64_t p = 0;
    for (int64_t n : {1, 37, 64, 100, 97}) {
      eng.forward(seq, std::span<const int32_t>(all).subspan(size_t(p), size_t(n)), false);
      p += n;
      const std::vector<float> part = eng.draft(seq, all[size_t(p)], engine::LogitRows::all);
      out.insert(out.end(), part.begin(), part.end());
    }
    return out;
  };
  for (Numerics numerics : {Numerics::deepseek, Numerics::plain}) {
    Engine gpu(*model, make_cuda_backend(numerics)), cpu(*model, make_cpu_backend(numerics));
    const std::vector<float> g = drafts(gpu), c = drafts(cpu);
    ASSERT_EQ(g.size(), size_t(299 * V));
    std::printf("[ e2e      ] tiny-flash MTP drafts %s vs CPU engine: bit-identical %lld/%lld\n", to_string(numerics),
                (long long)identical(g, c), (long long)g.size());
    EXPECT_EQ(identical(g, c), int64_t(g.size())) << to_string(numerics);
  }

  const std::vector<int32_t> prompt(all.begin(), all.begin() + 120);
  engine::SamplingParams sampling;
  sampling.temperature = 0.8f;
  sampling.seed = 7;
  int64_t emitted = 0, guesses = 0;
  std::vector<int32_t> plain;
  auto run = [&](Engine& eng, bool speculative) {
    SequenceState seq = eng.new_sequence(speculative);
    std::vector<float> logits = eng.prefill(seq, prompt, 50, false);
    engine::Sampler sampler(sampling);
    engine::DecodeOptions o;
    o.max_tokens = 40;
    o.speculative = speculative;
    if (!plain.empty())
      o.choose_draft = [&](std::span<const float>) {
        const int32_t right = plain[size_t(emitted)];
        return guesses++ % 2 == 0 ? right : (right + 1) % int32_t(V);
      };
    emitted = 0;
    return engine::decode(eng, seq, std::move(logits), sampler, o, [&](int32_t) { ++emitted; });
  };
  Engine gpu(*model, make_cuda_backend(Numerics::deepseek)), cpu(*model, make_cpu_backend(Numerics::deepseek));
  plain = run(cpu, false);
  EXPECT_EQ(run(gpu, false), plain);
  EXPECT_EQ(run(gpu, true), plain);
}

}  // namespace dsv4::test
