#include "server/transcript.h"

#include <random>

namespace dsv4::server {

namespace {

std::string token_text(const tk::Tokenizer& tok, int32_t id, bool as_id) {
  if (as_id) return "token_id:" + std::to_string(id);
  return tok.decode(std::span<const int32_t>(&id, 1));
}

ordered_json token_bytes(const tk::Tokenizer& tok, int32_t id) {
  ordered_json bytes = ordered_json::array();
  for (unsigned char ch : tok.token_bytes(id)) bytes.push_back(int(ch));
  return bytes;
}

// Chat's logprobs entry for one token (OpenAI ChatCompletionTokenLogprob).
ordered_json chat_logprob(const tk::Tokenizer& tok, const engine::TokenEvent& e) {
  ordered_json top = ordered_json::array();
  for (const engine::TokenLogprob& t : e.logprobs.top)
    top.push_back({{"token", token_text(tok, t.id, false)}, {"logprob", t.logprob}, {"bytes", token_bytes(tok, t.id)}});
  return {{"token", token_text(tok, e.id, false)}, {"logprob", e.logprobs.chosen}, {"bytes", token_bytes(tok, e.id)},
          {"top_logprobs", top}};
}

std::string new_tool_call_id() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* hex = "0123456789abcdef";
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += hex[rng() % 16];
  return id;
}

class ChatTranscript : public Transcript {
 public:
  ChatTranscript(const tk::Tokenizer& tok, ChatTranscriptOptions o)
      : tok_(tok),
        options_(std::move(o)),
        decoder_(tok),
        parser_(tk::ParserOptions{options_.thinking}),
        stop_(options_.stop),
        think_end_(tok.token_to_id("</think>").value_or(-1)),
        in_reasoning_(options_.thinking) {}

  ordered_json opening() override {
    ordered_json delta = {{"role", "assistant"}, {"content", ""}};
    add(delta, parser_.feed(options_.forced_prefix));
    return {{"index", 0}, {"delta", delta}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
  }

  ordered_json on_token(const engine::TokenEvent& e) override {
    if (in_reasoning_) ++reasoning_tokens_;
    if (e.id == think_end_) in_reasoning_ = false;
    ordered_json delta = ordered_json::object();
    if (!stop_.matched()) add(delta, parser_.feed(decoder_.push(e.id)));
    ordered_json logprobs = nullptr;
    if (options_.logprobs) {
      logprobs_.push_back(chat_logprob(tok_, e));
      logprobs = {{"content", ordered_json::array({logprobs_.back()})}};
    }
    if (delta.empty() && logprobs.is_null()) return nullptr;
    return {{"index", 0}, {"delta", delta}, {"logprobs", logprobs}, {"finish_reason", nullptr}};
  }

  ordered_json on_finish(const engine::Finished& finished) override {
    ordered_json delta = ordered_json::object();
    if (!stop_.matched()) add(delta, parser_.feed(decoder_.finish()));
    std::vector<tk::ParserDelta> last;
    message_ = parser_.finish(&last);
    add(delta, last);
    if (!stop_.matched()) append_content(delta, stop_.flush());
    finish_reason_ = finish_reason(finished, !message_.tool_calls.empty());
    return {{"index", 0}, {"delta", delta}, {"logprobs", nullptr}, {"finish_reason", finish_reason_}};
  }

  ordered_json final_choice() const override {
    ordered_json message = {{"role", "assistant"}};
    message["content"] = content_.empty() && !message_.tool_calls.empty() ? ordered_json(nullptr) : ordered_json(content_);
    if (options_.thinking) message["reasoning_content"] = message_.reasoning_content;
    if (!message_.tool_calls.empty()) {
      ordered_json calls = ordered_json::array();
      for (size_t i = 0; i < message_.tool_calls.size(); ++i)
        calls.push_back({{"id", i < tool_call_ids_.size() ? tool_call_ids_[i] : new_tool_call_id()},
                         {"type", "function"},
                         {"function", {{"name", message_.tool_calls[i].name},
                                       {"arguments", message_.tool_calls[i].arguments}}}});
      message["tool_calls"] = calls;
    }
    ordered_json logprobs = options_.logprobs ? ordered_json{{"content", logprobs_}} : ordered_json(nullptr);
    return {{"index", 0}, {"message", message}, {"logprobs", logprobs}, {"finish_reason", finish_reason_}};
  }

  bool stopped() const override { return stop_.matched(); }

 private:
  void append_content(ordered_json& delta, const std::string& text) {
    if (text.empty()) return;
    content_ += text;
    delta["content"] = delta.value("content", "") + text;
  }

  // Merges parser deltas into one OpenAI delta (a tool call's opening and arguments share an entry).
  void add(ordered_json& delta, const std::vector<tk::ParserDelta>& deltas) {
    for (const tk::ParserDelta& d : deltas) {
      switch (d.kind) {
        case tk::ParserDelta::Kind::reasoning:
          delta["reasoning_content"] = delta.value("reasoning_content", "") + d.text;
          break;
        case tk::ParserDelta::Kind::content:
          append_content(delta, stop_.feed(d.text));
          break;
        case tk::ParserDelta::Kind::tool_call_begin:
          tool_call_ids_.push_back(new_tool_call_id());
          tool_call(delta, d.tool_index) = {{"index", d.tool_index}, {"id", tool_call_ids_.back()}, {"type", "function"},
                                            {"function", {{"name", d.text}, {"arguments", ""}}}};
          break;
        case tk::ParserDelta::Kind::tool_call_arguments: {
          ordered_json& call = tool_call(delta, d.tool_index);
          if (call.is_null()) call = {{"index", d.tool_index}, {"function", {{"arguments", ""}}}};
          call["function"]["arguments"] = call["function"]["arguments"].get<std::string>() + d.text;
          break;
        }
      }
    }
  }

  static ordered_json& tool_call(ordered_json& delta, int index) {
    if (!delta.contains("tool_calls")) delta["tool_calls"] = ordered_json::array();
    for (ordered_json& c : delta["tool_calls"])
      if (c["index"] == index) return c;
    delta["tool_calls"].push_back(nullptr);
    return delta["tool_calls"].back();
  }

  const tk::Tokenizer& tok_;
  ChatTranscriptOptions options_;
  tk::StreamDecoder decoder_;
  tk::OutputParser parser_;
  StopStrings stop_;
  int32_t think_end_;
  bool in_reasoning_;
  std::string content_;
  std::vector<std::string> tool_call_ids_;
  ordered_json logprobs_ = ordered_json::array();
  tk::ParsedMessage message_;
  std::string finish_reason_;
};

class CompletionTranscript : public Transcript {
 public:
  CompletionTranscript(const tk::Tokenizer& tok, std::vector<std::string> stop, bool logprobs, bool tokens_as_ids)
      : tok_(tok), decoder_(tok), stop_(std::move(stop)), logprobs_(logprobs), tokens_as_ids_(tokens_as_ids) {}

  ordered_json on_token(const engine::TokenEvent& e) override {
    const std::string piece = stop_.matched() ? "" : stop_.feed(decoder_.push(e.id));
    ordered_json lp = nullptr;
    if (logprobs_) {
      ordered_json top = ordered_json::object();
      for (const engine::TokenLogprob& t : e.logprobs.top) top[token_text(tok_, t.id, tokens_as_ids_)] = t.logprob;
      lp = {{"tokens", {token_text(tok_, e.id, tokens_as_ids_)}},
            {"token_logprobs", {e.logprobs.chosen}},
            {"top_logprobs", {top}},
            {"text_offset", {int64_t(text_.size())}}};
      for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
        all_logprobs_[key].push_back(lp[key][0]);
    }
    text_ += piece;
    if (piece.empty() && lp.is_null()) return nullptr;
    return {{"index", 0}, {"text", piece}, {"logprobs", lp}, {"finish_reason", nullptr}};
  }

  ordered_json on_finish(const engine::Finished& finished) override {
    std::string rest = stop_.matched() ? "" : stop_.feed(decoder_.finish());
    rest += stop_.flush();
    text_ += rest;
    finish_reason_ = finish_reason(finished, false);
    return {{"index", 0}, {"text", rest}, {"logprobs", nullptr}, {"finish_reason", finish_reason_}};
  }

  ordered_json final_choice() const override {
    return {{"index", 0}, {"text", text_}, {"logprobs", logprobs_ ? all_logprobs_ : ordered_json(nullptr)},
            {"finish_reason", finish_reason_}};
  }

  bool stopped() const override { return stop_.matched(); }

 private:
  const tk::Tokenizer& tok_;
  tk::StreamDecoder decoder_;
  StopStrings stop_;
  bool logprobs_, tokens_as_ids_;
  std::string text_;
  ordered_json all_logprobs_ = {{"tokens", ordered_json::array()}, {"token_logprobs", ordered_json::array()},
                                {"top_logprobs", ordered_json::array()}, {"text_offset", ordered_json::array()}};
  std::string finish_reason_;
};

}  // namespace

std::string Transcript::finish_reason(const engine::Finished& finished, bool tool_calls) const {
  if (stopped()) return "stop";
  if (finished.reason == engine::FinishReason::length) return "length";
  return tool_calls ? "tool_calls" : "stop";
}

ordered_json Transcript::usage(const engine::Finished& f) const {
  return {{"prompt_tokens", f.prompt_tokens},
          {"completion_tokens", f.completion_tokens},
          {"total_tokens", f.prompt_tokens + f.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", f.cached_tokens}}},
          {"completion_tokens_details", {{"reasoning_tokens", reasoning_tokens_}}}};
}

std::unique_ptr<Transcript> make_chat_transcript(const tk::Tokenizer& tokenizer, ChatTranscriptOptions options) {
  return std::make_unique<ChatTranscript>(tokenizer, std::move(options));
}

std::unique_ptr<Transcript> make_completion_transcript(const tk::Tokenizer& tokenizer, std::vector<std::string> stop,
                                                       bool logprobs, bool tokens_as_ids) {
  return std::make_unique<CompletionTranscript>(tokenizer, std::move(stop), logprobs, tokens_as_ids);
}

}  // namespace dsv4::server
