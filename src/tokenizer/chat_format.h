// The DeepSeek V4 chat prompt (tokenizer-and-chat.md §3): OpenAI-style messages → prompt text
// and ids, byte-for-byte what the official Python encoder (encoding_dsv4.py) produces.
//
// Covered: system / user / assistant / tool / developer / latest_reminder messages; chat and
// thinking modes with reasoning effort (preview or -0731 prefixes, §3.7); tool schemas in the
// system block (§3.3); assistant tool calls in history as DSML (§3.4); tool results merged into
// user turns in call order (§3.5); earlier reasoning dropped unless tools are present (§3.6);
// internal `task` tokens and `wo_eos` prefill (§3.8).
//
// Control-token safety (§3.11): the renderer records which bytes it wrote itself. By default only
// those may become control tokens; text from messages (contents, reasoning, tool schemas and
// arguments, names) is tokenized as plain text even if it spells "<｜end▁of▁sentence｜>" or
// "</think>". ChatOptions::control_tokens_in_text = true restores the reference behaviour
// (tokenize the whole prompt with added-token matching). Both give the same ids for text that
// holds no control-token strings.
//
// Deliberate differences from the reference, where it crashes or emits junk: a null content
// renders as "" (the reference writes "None" in tool results / reminders or raises); tool
// content that is a JSON object renders as its JSON text; arguments given as an object are used
// as is (the reference double-wraps them, §3.4); OpenAI content-part arrays join their text parts
// with "" (the -0731 encoder's choice, §3.8); a developer message may be empty.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace dsv4::tokenizer {

using ordered_json = nlohmann::ordered_json;

// Which reasoning-effort table the checkpoint was trained with (§3.1, §3.7).
enum class ChatVariant {
  v4_preview,  // efforts "", "high", "max"; only "max" adds a prefix
  v4_0731,     // efforts "", "low", "high", "max"; "" means "low" (no prefix)
};

struct ToolCall {
  std::string id;
  std::string name;
  ordered_json arguments;  // a JSON text (OpenAI) or an already parsed object
};

struct Message {
  std::string role;  // system, user, assistant, tool, developer, latest_reminder
  ordered_json content;  // string, null, or an array of OpenAI content parts
  std::string reasoning_content;      // assistant; "reasoning" is accepted as a synonym on input
  std::vector<ToolCall> tool_calls;   // assistant
  std::string tool_call_id;           // tool
  ordered_json tools;                 // system/developer: OpenAI tool list, or null
  ordered_json response_format;       // system/developer, or null
  std::optional<std::string> task;    // internal quick-instruction task: action, query, …
  bool wo_eos = false;                // assistant prefill: no EOS, nothing appended after it

  static Message make(std::string role, std::string text) {
    Message m;
    m.role = std::move(role);
    m.content = std::move(text);
    return m;
  }
  static Message system(std::string text) { return make("system", std::move(text)); }
  static Message user(std::string text) { return make("user", std::move(text)); }
  static Message assistant(std::string text, std::string reasoning = {}) {
    Message m = make("assistant", std::move(text));
    m.reasoning_content = std::move(reasoning);
    return m;
  }
  static Message tool(std::string call_id, std::string text) {
    Message m = make("tool", std::move(text));
    m.tool_call_id = std::move(call_id);
    return m;
  }
};

// Parses an OpenAI `messages` array; errors name the field (messages[3].tool_calls[0]...).
std::vector<Message> messages_from_json(const ordered_json& messages);

struct ChatOptions {
  bool thinking = false;
  std::string reasoning_effort;  // "" = the variant's default; see ChatVariant
  ChatVariant variant = ChatVariant::v4_preview;
  bool drop_thinking = true;     // drop reasoning before the last user turn (never with tools)
  bool add_bos = true;
  bool control_tokens_in_text = false;  // reference behaviour; see the banner
};

struct RenderedPrompt {
  std::string text;
  std::vector<TextRange> control_ranges;  // bytes the renderer wrote itself, sorted, disjoint
  bool control_tokens_in_text = false;

  // The ids for the prompt under its control-token policy.
  std::vector<int32_t> encode(const Tokenizer& tokenizer) const;
};

// `tools` is the request-level OpenAI tool list (or null): it goes onto the first message when
// that is a system message, else into a new empty system message in front (as vLLM does).
RenderedPrompt render_prompt(std::vector<Message> messages, const ordered_json& tools,
                             const ChatOptions& options);

// The variant of a checkpoint folder, from its encoding/encoding_dsv4.py when present (the 0731
// encoder defines REASONING_EFFORT_PROMPTS), else config.json's name hints; default preview.
ChatVariant detect_chat_variant(const std::string& model_dir);

}  // namespace dsv4::tokenizer
