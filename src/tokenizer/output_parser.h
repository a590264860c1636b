// Streaming parser of model output (decoded text) into an OpenAI assistant message:
// reasoning_content, content and tool_calls (tokenizer-and-chat.md §4).
//
// A state machine fed arbitrary chunks (one byte or the whole output at once give the same final
// message). It holds back anything that may still become markup — a partial tag, the newlines
// before a tool-call block, an unfinished UTF-8 character — so no markup ever reaches streamed
// reasoning or content. Well-formed output parses exactly like the official (strict) parser:
// reasoning up to </think>, content up to "\n\n<｜DSML｜tool_calls", arguments as
// "{" + ", ".join(json(K) + ": " + V) + "}" with Python spacing.
//
// Malformed output never throws; it is tolerated and noted in ParsedMessage::warnings (§4.4):
// a tool block without </think> ends reasoning; zero or one newline before the block; DSML with
// "|DSML|" or "DSML｜" spellings, "function_calls" for "tool_calls", an invoke straight in the
// text; a JSON object instead of parameters; string="false" values that are not JSON become
// strings; a missing string attribute means "JSON if it parses"; a duplicate parameter keeps the
// first; unterminated tags and values are closed at finish(); stray <think>/</think>, BOS, and
// unknown DSML tags are dropped; EOS, <｜User｜> or <｜Assistant｜> end the message.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace dsv4::tokenizer {

struct ParserOptions {
  bool thinking = false;  // the prompt ended with <think>: output starts in reasoning
};

struct ParsedToolCall {
  std::string name;
  std::string arguments;  // JSON text (an object), as OpenAI's function.arguments
};

struct ParsedMessage {
  std::string reasoning_content;
  std::string content;
  std::vector<ParsedToolCall> tool_calls;
  bool ended_by_stop_token = false;  // EOS (or a role token) was seen
  std::vector<std::string> warnings;  // tolerated malformations, for logs
};

// One streamed piece. For tool_call_begin, `text` is the function name; for
// tool_call_arguments, a fragment of the arguments JSON (fragments concatenate to the final text).
struct ParserDelta {
  enum class Kind { reasoning, content, tool_call_begin, tool_call_arguments };
  Kind kind;
  std::string text;
  int tool_index = -1;
};

class OutputParser {
 public:
  explicit OutputParser(ParserOptions options = {});

  // Consumes a chunk of decoded output; returns what became final.
  std::vector<ParserDelta> feed(std::string_view text);
  // Ends the stream: releases held text, closes an unfinished tool call. `last` receives the
  // final deltas. Calling feed() afterwards is an error that is ignored (nothing is parsed).
  ParsedMessage finish(std::vector<ParserDelta>* last = nullptr);
  const ParsedMessage& message() const { return message_; }

 private:
  enum class State { reasoning, content, block, invoke, value, after, stopped };
  size_t step(size_t pos, bool final);
  size_t step_text(size_t pos, bool final);
  size_t stop_at(size_t end);  // a stop token ends the message at `end`
  size_t step_block(size_t pos, bool final);
  size_t step_invoke(size_t pos, bool final);
  size_t step_value(size_t pos, bool final);
  size_t on_text_marker(size_t pos, bool final, bool& waiting);
  void emit(ParserDelta::Kind kind, std::string_view text);
  void emit_text(std::string_view text);
  void begin_call(std::string_view attrs);
  void begin_parameter(std::string_view attrs);
  void end_value();
  void end_call();
  void warn(std::string message);
  void run(bool final);

  ParserOptions options_;
  State state_;
  std::string buffer_;  // input not consumed yet
  ParsedMessage message_;
  std::vector<ParserDelta>* out_ = nullptr;
  bool finished_ = false;
  // The open tool call.
  int call_params_ = 0;
  std::vector<std::string> call_param_names_;
  std::string call_body_;  // non-parameter text inside the invoke (a JSON object, in "format 2")
  // The open parameter value.
  enum class ValueKind { string, json, guess, skipped } value_kind_ = ValueKind::string;
  std::string value_raw_;  // json/guess values are checked when complete
};

}  // namespace dsv4::tokenizer
