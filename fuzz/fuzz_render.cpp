// Any JSON as a messages array (or {messages, tools}): rendering either succeeds or throws
// dsv4::Error — never anything else; with the tokenizer, the prompt's ids decode back to it.
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "fuzz_support.h"
#include "tokenizer/chat_format.h"

using namespace dsv4;
using namespace dsv4::tokenizer;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  uint8_t flags = data[0];
  ordered_json input = ordered_json::parse(data + 1, data + size, nullptr, false);
  if (input.is_discarded()) return 0;
  ordered_json messages = input, tools;
  if (input.is_object()) {
    messages = input.contains("messages") ? input["messages"] : ordered_json::array();
    tools = input.contains("tools") ? input["tools"] : ordered_json();
  }
  ChatOptions options;
  options.thinking = flags & 1;
  options.drop_thinking = !(flags & 2);
  options.variant = flags & 4 ? ChatVariant::v4_0731 : ChatVariant::v4_preview;
  options.control_tokens_in_text = flags & 8;
  static const char* efforts[] = {"", "low", "high", "max"};
  options.reasoning_effort = efforts[(flags >> 4) & 3];
  try {
    RenderedPrompt prompt = render_prompt(messages_from_json(messages), tools, options);
    size_t last = 0;
    for (const TextRange& r : prompt.control_ranges) {
      if (r.begin < last || r.end <= r.begin || r.end > prompt.text.size()) fuzz::broken("control ranges sorted, inside");
      last = r.end;
    }
    if (const Tokenizer* tok = fuzz::v4_tokenizer())
      if (tok->decode(prompt.encode(*tok)) != prompt.text) fuzz::broken("prompt ids decode to the prompt");
  } catch (const Error&) {
    // invalid input is reported, not crashed on
  }
  return 0;
}
