// dsv4 generate: prefill a prompt of token ids, then decode, reporting prefill and decode speed.
// With --prompt-cache FILE, the prompt's state is kept on disk and a later prompt that extends it
// prefills only its new tokens.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <optional>

#include "cli/common.h"
#include "core/error.h"
#include "engine/decode.h"
#include "engine/device.h"
#include "engine/engine.h"
#include "engine/memory_plan.h"
#include "engine/sampler.h"
#include "engine/state_file.h"

namespace dsv4::cli {
namespace {

struct GenerateOptions {
  std::string model = default_model_dir();
  std::string prompt_ids;
  std::string numerics = "deepseek";
  std::string state_layout;  // empty: the numerics' default
  std::string device = "cpu";
  int64_t max_tokens = 16;
  int64_t chunk = 0;  // 0: chosen by the memory plan
  engine::SamplingParams sampling;
  bool quiet = false;
  std::string prompt_cache;
  bool speculative = false;
};

// Restores `file` into `seq` when the tokens it covers are a strict prefix of `prompt` (at least
// one prompt token must still run: its logits give the first sampled token) and returns how many
// tokens that reuses; nothing when the file is absent or not a prefix. A file for another model,
// numerics or state layout, or a damaged one, is an error.
std::optional<int64_t> restore_prompt_cache(const std::filesystem::path& file,
                                            const engine::StateFingerprint& fingerprint,
                                            std::span<const int32_t> prompt, engine::SequenceState& seq,
                                            Backend& backend) {
  if (!std::filesystem::exists(file)) {
    fmt::print(stderr, "prompt cache {}: not there yet, will be written\n", file.string());
    return std::nullopt;
  }
  const engine::PrefixRestore r = engine::restore_prefix(file, fingerprint, prompt, seq, backend);
  if (!r.restored) {
    fmt::print(stderr,
               "prompt cache {}: its {} tokens are not a prefix of this prompt's {}; not used, will be overwritten\n",
               file.string(), r.file_tokens, prompt.size());
    return std::nullopt;
  }
  return r.file_tokens;
}

using Prefill = std::function<std::vector<float>(std::span<const int32_t> tokens)>;

// Prefills `prompt` through the prompt cache `file`: resumes from it when it holds a prefix, and
// saves the state one token before the prompt's end, so that the same prompt again can resume
// there and still run its last token. Returns the last token's logits; `reused` is set to the
// prompt tokens taken from the file.
std::vector<float> prefill_with_prompt_cache(const std::filesystem::path& file,
                                             const engine::StateFingerprint& fingerprint,
                                             std::span<const int32_t> prompt, engine::SequenceState& seq,
                                             Backend& backend, const Prefill& prefill, int64_t& reused) {
  const size_t n_saved = prompt.size() - 1;
  const std::optional<int64_t> restored = restore_prompt_cache(file, fingerprint, prompt, seq, backend);
  reused = restored.value_or(0);
  fmt::print(stderr, "prompt cache {}: reused {} of {} prompt tokens\n", file.string(), reused, prompt.size());
  prefill(prompt.subspan(size_t(reused), n_saved - size_t(reused)));
  if (restored != int64_t(n_saved)) {  // else the file already holds exactly this state
    const engine::StateSnapshot snapshot = seq.snapshot();
    engine::save_state(file, fingerprint, prompt.first(n_saved), snapshot, backend);
    fmt::print(stderr, "prompt cache {}: saved the state after {} tokens ({:.1f} MB)\n", file.string(), n_saved,
               double(snapshot.bytes()) / 1e6);
  }
  return prefill(prompt.last(1));
}

int run_generate(const GenerateOptions& o) {
  const std::vector<int32_t> prompt = parse_token_list(o.prompt_ids);
  auto model = engine::Model::load(o.model);
  const auto& c = model->config();
  fmt::print(stderr, "{}: {} layers, hidden {}, vocab {}, numerics {}\n", o.model, c.n_layers, c.hidden_size,
             c.vocab_size, o.numerics);
  const int64_t context = int64_t(prompt.size()) + o.max_tokens;
  const Numerics numerics = parse_numerics(o.numerics);
  const StateLayout layout = state_layout_option(o.state_layout, numerics);
  std::unique_ptr<Backend> backend = engine::make_backend(o.device, numerics);
  const size_t device_free = backend->device_memory_free();  // 0: host memory, not planned
  const int64_t chunk =
      o.chunk > 0 ? o.chunk : engine::choose_chunk(c, layout, device_free, 1, context, default_chunk(o.device));
  const engine::MemoryPlan plan =
      engine::plan_memory(c, model->checkpoint().total_bytes(), chunk, layout, o.speculative);
  fmt::print(stderr, "{}", plan.describe(context));
  engine::require_fits(plan, device_free, backend->name(), 1, context);
  engine::Engine eng(*model, std::move(backend), layout);
  engine::SequenceState seq = eng.new_sequence(o.speculative);
  engine::Sampler sampler(o.sampling);

  double prefill_s = 0;
  const Prefill prefill = [&](std::span<const int32_t> tokens) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<float> logits = eng.prefill(seq, tokens, chunk, false, [&](int64_t done, int64_t total) {
      if (total > chunk) fmt::print(stderr, "\rprefill {}/{} tokens", done, total);
      if (total > chunk && done == total) fmt::print(stderr, "\n");
    });
    prefill_s += seconds_since(t0);
    return logits;
  };
  int64_t reused = 0;
  std::vector<float> logits =
      o.prompt_cache.empty()
          ? prefill(prompt)
          : prefill_with_prompt_cache(o.prompt_cache,
                                      engine::state_fingerprint(c, model->weights(), numerics, eng.state_layout()), prompt,
                                      seq, eng.backend(), prefill, reused);

  engine::DecodeOptions decoding;
  decoding.max_tokens = o.max_tokens;
  decoding.eos = int32_t(c.eos_token_id);
  decoding.speculative = o.speculative;
  engine::DecodeStats stats;
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int32_t> out = engine::decode(
      eng, seq, std::move(logits), sampler, decoding,
      [&, first = true](int32_t token) mutable {
        if (!o.quiet) fmt::print("{}{}", first ? "" : " ", token), std::fflush(stdout);
        first = false;
      },
      &stats);
  const double decode_s = seconds_since(t0);
  if (!o.quiet) fmt::print("\n"), std::fflush(stdout);
  const double decode_steps = double(std::max<size_t>(out.size(), 1) - 1);
  const int64_t n_prefilled = int64_t(prompt.size()) - reused;
  fmt::print(stderr, "prefill: {} tokens in {:.3f} s ({:.1f} tok/s)\n", n_prefilled, prefill_s,
             double(n_prefilled) / prefill_s);
  fmt::print(stderr, "decode:  {} tokens in {:.3f} s ({:.1f} tok/s)\n", out.size(), decode_s,
             decode_steps > 0 ? decode_steps / decode_s : 0.0);
  if (o.speculative)
    fmt::print(stderr, "speculative: {} steps, {} of {} drafts accepted ({:.1f}%), {:.2f} tokens per step\n",
               stats.steps, stats.accepted, stats.drafted,
               stats.drafted ? 100.0 * double(stats.accepted) / double(stats.drafted) : 0.0,
               stats.steps ? decode_steps / double(stats.steps) : 0.0);
  return 0;
}

const bool generate_registered = register_command({"generate", "Generate tokens from a prompt of token ids",
    [](CLI::App& app) -> std::function<int()> {
      auto o = std::make_shared<GenerateOptions>();
      app.add_option("--model", o->model, "checkpoint folder")->capture_default_str();
      app.add_option("--prompt-ids", o->prompt_ids, "prompt token ids, e.g. \"0, 17, 42\"")->required();
      app.add_option("--max-tokens", o->max_tokens, "tokens to generate")->capture_default_str();
      app.add_option("--temperature", o->sampling.temperature, "0 = greedy")->capture_default_str();
      app.add_option("--top-p", o->sampling.top_p)->capture_default_str();
      app.add_option("--top-k", o->sampling.top_k, "0 = no limit")->capture_default_str();
      app.add_option("--seed", o->sampling.seed)->capture_default_str();
      app.add_option("--numerics", o->numerics, "deepseek | plain | deepseek-tc (GPU: FP8 tensor-core prefill products)")->capture_default_str();
      app.add_option("--state-layout", o->state_layout, kStateLayoutHelp);
      app.add_option("--device", o->device, "cpu | cuda")->capture_default_str();
      app.add_option("--chunk", o->chunk, chunk_help());
      app.add_flag("--quiet", o->quiet, "print only the timing");
      app.add_flag("--speculative", o->speculative,
                   "speculative decoding with the checkpoint's MTP block as the draft: the same tokens in fewer steps");
      app.add_option("--prompt-cache", o->prompt_cache,
                     "state file: resume from it when it holds a prefix of the prompt, then save the prompt's state to it");
      return [o] { return run_generate(*o); };
    }});

}  // namespace
}  // namespace dsv4::cli
