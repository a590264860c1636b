// dsv4 synth: writes a checkpoint with random weights in the official format (model/synthetic.h):
// V4-Flash or V4-Pro shapes for benchmarks, or the full-vocabulary tiny demo model.
#include <fmt/format.h>

#include <fstream>
#include <sstream>

#include "cli/common.h"
#include "core/error.h"
#include "model/synthetic.h"

namespace dsv4::cli {
namespace {

struct SynthOptions {
  std::string preset, config, out;
  int64_t layers = 0;
  uint64_t seed = 1;
  int shards = 1;
};

int run_synth(const SynthOptions& o) {
  std::string text;
  if (!o.config.empty()) {
    std::ifstream f(o.config);
    if (!f) fail(ErrorCode::not_found, "{}: cannot open", o.config);
    std::stringstream ss;
    ss << f.rdbuf();
    text = ss.str();
  } else {
    text = model::preset_config(o.preset.empty() ? "tiny-chat" : o.preset);
  }
  if (o.layers > 0) text = model::with_layers(text, o.layers);
  model::write_synthetic_checkpoint(text, o.seed, o.out, o.shards);
  fmt::print(stderr, "{}: synthetic checkpoint (random weights, seed {})\n", o.out, o.seed);
  return 0;
}

const bool synth_registered = register_command({"synth", "Write a checkpoint with random weights (benchmarks, demo model)",
    [](CLI::App& app) -> std::function<int()> {
      auto o = std::make_shared<SynthOptions>();
      app.add_option("--preset", o->preset, "v4-flash | v4-pro | tiny-chat (default)");
      app.add_option("--config", o->config, "a config.json to use instead of a preset");
      app.add_option("--out", o->out, "folder to write")->required();
      app.add_option("--layers", o->layers, "keep only the first N layers");
      app.add_option("--seed", o->seed)->capture_default_str();
      app.add_option("--shards", o->shards, "number of safetensors files")->capture_default_str();
      return [o] { return run_synth(*o); };
    }});

}  // namespace
}  // namespace dsv4::cli
