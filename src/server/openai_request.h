// OpenAI request bodies → validated requests (the /v1/chat/completions and /v1/completions
// contracts). Every check names the field; unknown and unsupported fields are refused rather than
// ignored, so a client never gets silently different behaviour than it asked for.
//
// Thinking follows DeepSeek's API: `thinking: {"type": "enabled" | "disabled"}` and
// `reasoning_effort` (none, minimal, low, medium, high, xhigh, max), mapped onto the checkpoint's
// effort table as vLLM and DeepSeek do (tokenizer-and-chat.md §3.7). Thinking is off unless one of
// them asks for it.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "tokenizer/chat_format.h"

namespace dsv4::server {

namespace tk = dsv4::tokenizer;
using ordered_json = tk::ordered_json;

// What both endpoints share: sampling, length, stop strings, logprobs, streaming.
struct GenerationOptions {
  engine::SamplingParams sampling{1.0f, 0, 1.0f, 0.0f, 0};  // OpenAI's defaults: temperature 1, top_p 1
  bool seeded = false;                  // `seed` given; else each request draws its own
  std::optional<int64_t> max_tokens;    // none: up to the context
  std::vector<std::string> stop;
  int64_t top_logprobs = -1;            // < 0: no logprobs
  bool stream = false;
  bool include_usage = false;           // stream_options.include_usage
};

struct ToolChoice {
  enum class Mode { automatic, none, required, named } mode = Mode::automatic;
  std::string name;  // named
};

struct ChatRequest {
  GenerationOptions options;
  std::vector<tk::Message> messages;
  ordered_json tools;  // null or the OpenAI tool list
  ToolChoice tool_choice;
  bool thinking = false;
  std::string reasoning_effort;  // in the checkpoint's table ("" = its default)
};

struct CompletionRequest {
  GenerationOptions options;
  std::optional<std::string> prompt_text;  // or token ids
  std::vector<int32_t> prompt_ids;
  bool tokens_as_ids = false;  // vLLM's return_tokens_as_token_ids: logprob tokens as "token_id:N"
};

// Malformed JSON and non-object bodies are 400s.
ordered_json parse_body(const std::string& text);

// `model_id` is the one model served: any other name is a 404 (model_not_found).
ChatRequest parse_chat_request(const ordered_json& body, const std::string& model_id, tk::ChatVariant variant);
CompletionRequest parse_completion_request(const ordered_json& body, const std::string& model_id);

}  // namespace dsv4::server
