// A request's generated tokens → what OpenAI clients read: one streamed choice per token, the
// closing choice with finish_reason, the whole choice of a non-streaming response, and usage.
//
// ChatTranscript runs the tokens through the streaming decoder and the output parser
// (reasoning_content, content, tool_calls; markup never reaches content) and applies stop strings
// to content. CompletionTranscript streams the decoded text as is.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "engine/scheduler.h"
#include "server/openai_request.h"
#include "server/stop_strings.h"
#include "tokenizer/output_parser.h"
#include "tokenizer/tokenizer.h"

namespace dsv4::server {

class Transcript {
 public:
  virtual ~Transcript() = default;
  // The first streamed choice (the assistant role, and anything the prompt forced), or null.
  virtual ordered_json opening() { return nullptr; }
  // The streamed choice for one generated token, or null when nothing is final yet.
  virtual ordered_json on_token(const engine::TokenEvent& event) = 0;
  // Releases what was held back; returns the closing streamed choice (with finish_reason).
  virtual ordered_json on_finish(const engine::Finished& finished) = 0;
  // The whole choice of a non-streaming response, after on_finish.
  virtual ordered_json final_choice() const = 0;
  // A stop string matched: the caller cancels the request; finish_reason is "stop".
  virtual bool stopped() const = 0;
  ordered_json usage(const engine::Finished& finished) const;

 protected:
  std::string finish_reason(const engine::Finished& finished, bool tool_calls) const;
  int64_t reasoning_tokens_ = 0;
};

// How the chat prompt ends shapes the parse: thinking starts in reasoning; a forced tool-call
// opener (tool_choice required or named) is parsed as if generated.
struct ChatTranscriptOptions {
  bool thinking = false;
  std::string forced_prefix;
  std::vector<std::string> stop;
  bool logprobs = false;
};

std::unique_ptr<Transcript> make_chat_transcript(const tk::Tokenizer& tokenizer, ChatTranscriptOptions options);
std::unique_ptr<Transcript> make_completion_transcript(const tk::Tokenizer& tokenizer, std::vector<std::string> stop,
                                                       bool logprobs, bool tokens_as_ids);

}  // namespace dsv4::server
