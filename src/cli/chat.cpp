// dsv4 chat: an interactive terminal chat. Each turn renders the whole conversation in the V4
// prompt format, feeds the engine only what it has not seen (the sequence state is reused while
// the rendered conversation extends what was processed), samples until EOS, and streams the
// reply through the output parser (reasoning dimmed, then content).
#include <fmt/format.h>
#include <unistd.h>

#include <iostream>

#include "cli/common.h"
#include "core/error.h"
#include "engine/device.h"
#include "engine/engine.h"
#include "engine/decode.h"
#include "engine/sampler.h"
#include "tokenizer/chat_format.h"
#include "tokenizer/output_parser.h"
#include "tokenizer/tokenizer.h"

namespace dsv4::cli {
namespace {

namespace tk = dsv4::tokenizer;

struct ChatCliOptions {
  std::string model = default_chat_model_dir();
  std::string tokenizer;
  std::string system;
  std::string numerics = "deepseek";
  std::string device = "cpu";
  bool thinking = false;
  std::string effort;
  int64_t max_tokens = 256;
  engine::SamplingParams sampling{0.6f, 0, 0.95f, 0};
  bool speculative = false;
};

int run_chat(const ChatCliOptions& o) {
  auto model = engine::Model::load(o.model);
  const tk::Tokenizer tok = tk::Tokenizer::load(find_tokenizer(o.model, o.tokenizer));
  const auto& c = model->config();
  if (tok.vocab_size() > c.vocab_size)
    fail(ErrorCode::invalid_input, "{}: vocabulary of {} tokens, the tokenizer has {}: not a chat model", o.model,
         c.vocab_size, tok.vocab_size());
  engine::Engine eng(*model, engine::make_backend(o.device, parse_numerics(o.numerics)));
  engine::SequenceState seq = eng.new_sequence(o.speculative);
  engine::Sampler sampler(o.sampling);
  const bool tty = isatty(STDOUT_FILENO);
  const char* dim = tty ? "\033[2m" : "";
  const char* plain = tty ? "\033[0m" : "";

  tk::ChatOptions chat;
  chat.thinking = o.thinking;
  chat.reasoning_effort = o.effort;
  chat.variant = tk::detect_chat_variant(o.model);
  std::vector<tk::Message> messages;
  if (!o.system.empty()) messages.push_back(tk::Message::system(o.system));
  std::vector<int32_t> processed;  // exactly the ids the sequence state holds

  fmt::print(stderr, "dsv4 chat: {} ({} layers, vocab {}). /reset clears, /exit or Ctrl-D quits.\n", o.model,
             c.n_layers, c.vocab_size);
  std::string line;
  while (true) {
    fmt::print("> ");
    std::fflush(stdout);
    if (!std::getline(std::cin, line)) break;
    if (line == "/exit") break;
    if (line == "/reset") {
      messages.resize(o.system.empty() ? 0 : 1);
      continue;
    }
    if (line.empty()) continue;
    messages.push_back(tk::Message::user(line));
    const std::vector<int32_t> ids = tk::render_prompt(messages, tk::ordered_json(), chat).encode(tok);
    if (processed.size() > ids.size() || !std::equal(processed.begin(), processed.end(), ids.begin())) {
      seq.reset();
      processed.clear();
    }
    const std::span<const int32_t> fresh(ids.data() + processed.size(), ids.size() - processed.size());
    std::vector<float> logits = eng.prefill(seq, fresh, 512, false);
    processed = ids;

    tk::StreamDecoder decoder(tok);
    tk::OutputParser parser(tk::ParserOptions{o.thinking});
    auto show = [&](const std::vector<tk::ParserDelta>& deltas) {
      for (const tk::ParserDelta& d : deltas) {
        if (d.kind == tk::ParserDelta::Kind::reasoning) fmt::print("{}{}{}", dim, d.text, plain);
        if (d.kind == tk::ParserDelta::Kind::content) fmt::print("{}", d.text);
      }
      std::fflush(stdout);
    };
    engine::DecodeOptions decoding;
    decoding.max_tokens = o.max_tokens;
    decoding.eos = int32_t(c.eos_token_id);
    decoding.speculative = o.speculative;
    const std::vector<int32_t> reply_ids = engine::decode(
        eng, seq, std::move(logits), sampler, decoding,
        [&](int32_t token) { show(parser.feed(decoder.push(token))); });
    if (!reply_ids.empty())  // the sequence ran all but the last
      processed.insert(processed.end(), reply_ids.begin(), reply_ids.end() - 1);
    show(parser.feed(decoder.finish()));
    std::vector<tk::ParserDelta> last;
    const tk::ParsedMessage reply = parser.finish(&last);
    show(last);
    fmt::print("\n");
    messages.push_back(tk::Message::assistant(reply.content, reply.reasoning_content));
  }
  fmt::print("\n");
  return 0;
}

const bool chat_registered = register_command({"chat", "Chat in the terminal (V4 prompt format, streaming)",
    [](CLI::App& app) -> std::function<int()> {
      auto o = std::make_shared<ChatCliOptions>();
      app.add_option("--model", o->model, "checkpoint folder (default: the demo model, random weights)")
          ->capture_default_str();
      app.add_option("--tokenizer", o->tokenizer, "tokenizer.json (default: MODEL/tokenizer.json)");
      app.add_option("--system", o->system, "system prompt");
      app.add_flag("--thinking", o->thinking, "thinking mode");
      app.add_option("--effort", o->effort, "reasoning effort (thinking mode)");
      app.add_option("--max-tokens", o->max_tokens, "tokens per reply")->capture_default_str();
      app.add_option("--temperature", o->sampling.temperature)->capture_default_str();
      app.add_option("--top-p", o->sampling.top_p)->capture_default_str();
      app.add_option("--top-k", o->sampling.top_k)->capture_default_str();
      app.add_option("--seed", o->sampling.seed)->capture_default_str();
      app.add_option("--numerics", o->numerics, "deepseek | plain | deepseek-tc (GPU: FP8 tensor-core prefill products)")->capture_default_str();
      app.add_option("--device", o->device, "cpu | cuda")->capture_default_str();
      app.add_flag("--speculative", o->speculative, "speculative decoding with the MTP block's drafts (as generate)");
      return [o] { return run_chat(*o); };
    }});

}  // namespace
}  // namespace dsv4::cli
