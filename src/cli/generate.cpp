// dsv4 generate: prefill a prompt of token ids, then decode, reporting prefill and decode speed.
#include <fmt/format.h>

#include <chrono>

#include "cli/common.h"
#include "engine/device.h"
#include "engine/engine.h"
#include "engine/memory_plan.h"
#include "engine/sampler.h"

namespace dsv4::cli {
namespace {

struct GenerateOptions {
  std::string model = default_model_dir();
  std::string prompt_ids;
  std::string numerics = "deepseek";
  std::string state_layout;  // empty: the numerics' default
  std::string device = "cpu";
  int64_t max_tokens = 16;
  int64_t chunk = 512;
  engine::SamplingParams sampling;
  bool quiet = false;
};

int run_generate(const GenerateOptions& o) {
  const std::vector<int32_t> prompt = parse_token_list(o.prompt_ids);
  auto model = engine::Model::load(o.model);
  const auto& c = model->config();
  fmt::print(stderr, "{}: {} layers, hidden {}, vocab {}, numerics {}\n", o.model, c.n_layers, c.hidden_size,
             c.vocab_size, o.numerics);
  const int64_t context = int64_t(prompt.size()) + o.max_tokens;
  const Numerics numerics = parse_numerics(o.numerics);
  const StateLayout layout = state_layout_option(o.state_layout, numerics);
  const engine::MemoryPlan plan = engine::plan_memory(c, model->checkpoint().total_bytes(), o.chunk, layout);
  fmt::print(stderr, "{}", plan.describe(context));
  std::unique_ptr<Backend> backend = engine::make_backend(o.device, numerics);
  engine::require_fits(plan, backend->device_memory_free(), backend->name(), 1, context);
  engine::Engine eng(*model, std::move(backend), layout);
  engine::SequenceState seq = eng.new_sequence();
  engine::Sampler sampler(o.sampling);

  auto t0 = std::chrono::steady_clock::now();
  std::vector<float> logits = eng.prefill(seq, prompt, o.chunk, false, [&](int64_t done, int64_t total) {
    if (total > o.chunk) fmt::print(stderr, "\rprefill {}/{} tokens", done, total);
    if (total > o.chunk && done == total) fmt::print(stderr, "\n");
  });
  const double prefill_s = seconds_since(t0);

  std::vector<int32_t> out;
  t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < o.max_tokens; ++i) {
    const int32_t next = sampler.sample(logits);
    out.push_back(next);
    if (!o.quiet) fmt::print("{}{}", i ? " " : "", next), std::fflush(stdout);
    if (next == c.eos_token_id || i + 1 == o.max_tokens) break;
    logits = eng.forward(seq, std::span<const int32_t>(&out.back(), 1), false);
  }
  const double decode_s = seconds_since(t0);
  if (!o.quiet) fmt::print("\n"), std::fflush(stdout);
  const double decode_steps = double(std::max<size_t>(out.size(), 1) - 1);
  fmt::print(stderr, "prefill: {} tokens in {:.3f} s ({:.1f} tok/s)\n", prompt.size(), prefill_s,
             double(prompt.size()) / prefill_s);
  fmt::print(stderr, "decode:  {} tokens in {:.3f} s ({:.1f} tok/s)\n", out.size(), decode_s,
             decode_steps > 0 ? decode_steps / decode_s : 0.0);
  return 0;
}

const bool registered = register_command({"generate", "Generate tokens from a prompt of token ids",
    [](CLI::App& app) -> std::function<int()> {
      auto o = std::make_shared<GenerateOptions>();
      app.add_option("--model", o->model, "checkpoint folder")->capture_default_str();
      app.add_option("--prompt-ids", o->prompt_ids, "prompt token ids, e.g. \"0, 17, 42\"")->required();
      app.add_option("--max-tokens", o->max_tokens, "tokens to generate")->capture_default_str();
      app.add_option("--temperature", o->sampling.temperature, "0 = greedy")->capture_default_str();
      app.add_option("--top-p", o->sampling.top_p)->capture_default_str();
      app.add_option("--top-k", o->sampling.top_k, "0 = no limit")->capture_default_str();
      app.add_option("--seed", o->sampling.seed)->capture_default_str();
      app.add_option("--numerics", o->numerics, "deepseek | plain")->capture_default_str();
      app.add_option("--state-layout", o->state_layout, kStateLayoutHelp);
      app.add_option("--device", o->device, "cpu | cuda")->capture_default_str();
      app.add_option("--chunk", o->chunk, "prefill chunk size in tokens")->capture_default_str();
      app.add_flag("--quiet", o->quiet, "print only the timing");
      return [o] { return run_generate(*o); };
    }});

}  // namespace
}  // namespace dsv4::cli
