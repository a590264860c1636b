// `dsv4 render`: shows the exact prompt the engine would feed the model (issue 3 §5).
//   dsv4 render --model DIR messages.json [--tools tools.json] [--thinking] [--effort max]
// messages.json is an OpenAI `messages` array, or an object {"messages": [...], "tools": [...]}.
// Prints the prompt text, a blank line, then the ids as a JSON array (--text-only / --ids-only
// print one of them). The checkpoint variant (preview / 0731) is read from DIR (chat_format.h).
#include <fmt/format.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/command.h"
#include "core/error.h"
#include "tokenizer/chat_format.h"
#include "tokenizer/tokenizer.h"

namespace dsv4::cli {
namespace {

using tokenizer::ordered_json;

struct RenderOptions {
  std::string model_dir, tokenizer_file, messages_file, tools_file, effort, variant;
  bool thinking = false, keep_reasoning = false, control_tokens_in_text = false, text_only = false, ids_only = false;
};

ordered_json read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorCode::not_found, "{}: cannot open", path);
  std::stringstream text;
  text << in.rdbuf();
  ordered_json j = ordered_json::parse(text.str(), nullptr, false);
  if (j.is_discarded()) fail(ErrorCode::invalid_input, "{}: not valid JSON", path);
  return j;
}

int run_render(const RenderOptions& o) {
  if (o.model_dir.empty() && o.tokenizer_file.empty()) fail(ErrorCode::invalid_input, "give --model DIR or --tokenizer FILE");
  ordered_json input = read_json(o.messages_file), tools;
  ordered_json messages = input;
  if (input.is_object()) {
    messages = input.value("messages", ordered_json::array());
    tools = input.value("tools", ordered_json());
  }
  if (!o.tools_file.empty()) tools = read_json(o.tools_file);

  tokenizer::ChatOptions options;
  options.thinking = o.thinking;
  options.reasoning_effort = o.effort;
  options.drop_thinking = !o.keep_reasoning;
  options.control_tokens_in_text = o.control_tokens_in_text;
  if (o.variant == "0731")
    options.variant = tokenizer::ChatVariant::v4_0731;
  else if (o.variant == "preview")
    options.variant = tokenizer::ChatVariant::v4_preview;
  else if (!o.variant.empty())
    fail(ErrorCode::invalid_input, "--variant: got \"{}\", expected preview or 0731", o.variant);
  else if (!o.model_dir.empty())
    options.variant = tokenizer::detect_chat_variant(o.model_dir);

  tokenizer::RenderedPrompt prompt;
  try {
    prompt = tokenizer::render_prompt(tokenizer::messages_from_json(messages), tools, options);
  } catch (const Error& e) {
    throw e.within(o.messages_file);
  }
  if (!o.ids_only) std::fwrite(prompt.text.data(), 1, prompt.text.size(), stdout);
  if (o.text_only) return 0;
  auto tok = tokenizer::Tokenizer::load(o.tokenizer_file.empty() ? o.model_dir + "/tokenizer.json" : o.tokenizer_file);
  auto ids = prompt.encode(tok);
  fmt::print("{}[{}]\n", o.ids_only ? "" : "\n\n", fmt::join(ids, ", "));
  return 0;
}

const bool render_registered = register_command({
    "render", "Render chat messages into the V4 prompt text and ids",
    [](CLI::App& app) -> std::function<int()> {
      auto o = std::make_shared<RenderOptions>();
      app.add_option("messages", o->messages_file, "messages JSON (array, or {messages, tools})")->required();
      app.add_option("--model", o->model_dir, "model folder (tokenizer.json, encoding/ for the variant)");
      app.add_option("--tokenizer", o->tokenizer_file, "tokenizer.json, instead of the model's");
      app.add_option("--tools", o->tools_file, "OpenAI tools JSON array");
      app.add_flag("--thinking", o->thinking, "thinking mode (prompt ends with <think>)");
      app.add_option("--effort", o->effort, "reasoning effort: high or max (preview); low, high or max (0731)");
      app.add_option("--variant", o->variant, "preview or 0731 (default: detected from --model)");
      app.add_flag("--keep-reasoning", o->keep_reasoning, "keep reasoning of earlier turns (drop_thinking off)");
      app.add_flag("--control-tokens-in-text", o->control_tokens_in_text,
                   "parse control-token strings inside message text (the reference's behaviour)");
      app.add_flag("--text-only", o->text_only, "print only the prompt text");
      app.add_flag("--ids-only", o->ids_only, "print only the ids");
      return [o] { return run_render(*o); };
    }});

}  // namespace
}  // namespace dsv4::cli
