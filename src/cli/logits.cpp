// dsv4 logits: logits for every position of a token list, as raw little-endian float32
// [n_tokens, vocab] — the format of the oracle's reference files.
#include <fmt/format.h>

#include <fstream>

#include "cli/common.h"
#include "core/error.h"
#include "engine/engine.h"

namespace dsv4::cli {
namespace {

struct LogitsOptions {
  std::string model = default_model_dir();
  std::string input, output;
  std::string numerics = "deepseek";
  int64_t chunk = 0;
};

int run_logits(const LogitsOptions& o) {
  const std::vector<int32_t> tokens = read_tokens_json(o.input);
  auto model = engine::Model::load(o.model);
  engine::Engine eng(*model, make_cpu_backend(parse_numerics(o.numerics)));
  engine::SequenceState seq = eng.new_sequence();
  const std::vector<float> logits = eng.prefill(seq, tokens, o.chunk, true);
  std::ofstream f(o.output, std::ios::binary);
  if (!f) fail(ErrorCode::invalid_input, "{}: cannot write", o.output);
  f.write(reinterpret_cast<const char*>(logits.data()), std::streamsize(logits.size() * sizeof(float)));
  if (!f) fail(ErrorCode::invalid_input, "{}: write failed", o.output);
  fmt::print(stderr, "{}: {} x {} float32\n", o.output, tokens.size(), model->config().vocab_size);
  return 0;
}

const bool registered = register_command({"logits", "Write the logits of every position of a token list",
    [](CLI::App& app) -> std::function<int()> {
      auto o = std::make_shared<LogitsOptions>();
      app.add_option("--model", o->model, "checkpoint folder")->capture_default_str();
      app.add_option("--input", o->input, "JSON file {\"tokens\": [...]}")->required();
      app.add_option("--output", o->output, "raw float32 [n_tokens, vocab]")->required();
      app.add_option("--numerics", o->numerics, "deepseek | plain")->capture_default_str();
      app.add_option("--chunk", o->chunk, "prefill chunk size (0 = one pass)")->capture_default_str();
      return [o] { return run_logits(*o); };
    }});

}  // namespace
}  // namespace dsv4::cli
