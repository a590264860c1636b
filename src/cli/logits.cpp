// dsv4 logits: logits for every position of a token list, as raw little-endian float32
// [n_tokens, vocab] — the format of the oracle's reference files.
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "core/error.h"
#include "engine/device.h"
#include "engine/engine.h"

namespace dsv4::cli {
namespace {

struct LogitsOptions {
  std::string model = default_model_dir();
  std::string input, output;
  std::string numerics = "deepseek";
  std::string state_layout;  // empty: the numerics' default
  std::string device = "cpu";
  int64_t chunk = 0;
  std::string dump;  // folder for named intermediates (manifest.json + <name>.f32)
};

// Writes every traced intermediate as DIR/<name>.f32 and lists the shapes in DIR/manifest.json,
// the layout of the oracle's dumps (tools/dump_diff.py compares two such folders).
engine::Tracer dump_tracer(const std::string& dir, std::shared_ptr<nlohmann::json> manifest) {
  std::filesystem::create_directories(dir);
  return [dir, manifest](const std::string& name, const std::vector<int64_t>& shape, const float* data) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::ofstream f(dir + "/" + name + ".f32", std::ios::binary);
    f.write(reinterpret_cast<const char*>(data), std::streamsize(n * sizeof(float)));
    (*manifest)[name] = shape;
    std::ofstream(dir + "/manifest.json") << manifest->dump(1);
  };
}

int run_logits(const LogitsOptions& o) {
  const std::vector<int32_t> tokens = read_tokens_json(o.input);
  auto model = engine::Model::load(o.model);
  const Numerics numerics = parse_numerics(o.numerics);
  engine::Engine eng(*model, engine::make_backend(o.device, numerics), state_layout_option(o.state_layout, numerics));
  engine::SequenceState seq = eng.new_sequence();
  std::vector<float> logits;
  if (o.dump.empty()) {
    logits = eng.prefill(seq, tokens, o.chunk, true);
  } else {
    const engine::Tracer tracer = dump_tracer(o.dump, std::make_shared<nlohmann::json>(nlohmann::json::object()));
    logits = eng.forward(seq, tokens, true, &tracer);
  }
  std::ofstream f(o.output, std::ios::binary);
  if (!f) fail(ErrorCode::invalid_input, "{}: cannot write", o.output);
  f.write(reinterpret_cast<const char*>(logits.data()), std::streamsize(logits.size() * sizeof(float)));
  if (!f) fail(ErrorCode::invalid_input, "{}: write failed", o.output);
  fmt::print(stderr, "{}: {} x {} float32\n", o.output, tokens.size(), model->config().vocab_size);
  return 0;
}

const bool logits_registered = register_command({"logits", "Write the logits of every position of a token list",
    [](CLI::App& app) -> std::function<int()> {
      auto o = std::make_shared<LogitsOptions>();
      app.add_option("--model", o->model, "checkpoint folder")->capture_default_str();
      app.add_option("--input", o->input, "JSON file {\"tokens\": [...]}")->required();
      app.add_option("--output", o->output, "raw float32 [n_tokens, vocab]")->required();
      app.add_option("--numerics", o->numerics, "deepseek | plain | deepseek-tc (GPU: FP8 tensor-core prefill products)")->capture_default_str();
      app.add_option("--state-layout", o->state_layout, kStateLayoutHelp);
      app.add_option("--device", o->device, "cpu | cuda")->capture_default_str();
      app.add_option("--chunk", o->chunk, "prefill chunk size (0 = one pass)")->capture_default_str();
      app.add_option("--dump", o->dump, "write named intermediates to this folder (one pass)");
      return [o] { return run_logits(*o); };
    }});

}  // namespace
}  // namespace dsv4::cli
