// The output state machine (tokenizer-and-chat.md §4.2, §4.4). Input accumulates in buffer_;
// each step consumes a prefix that can no longer change meaning and returns the new position,
// or the same position when it must see more input first ("final" = no more input will come,
// so a partial marker is just text).
#include "tokenizer/output_parser.h"

#include <nlohmann/json.hpp>

#include <array>

#include "tokenizer/python_json.h"
#include "tokenizer/utf8.h"

namespace dsv4::tokenizer {

namespace {

enum class Scan { none, partial, full };

Scan starts_with(std::string_view buf, size_t pos, std::string_view literal, bool final) {
  size_t available = buf.size() - pos;
  if (available >= literal.size()) return buf.compare(pos, literal.size(), literal) == 0 ? Scan::full : Scan::none;
  if (buf.compare(pos, available, literal.substr(0, available)) != 0) return Scan::none;
  return final ? Scan::none : Scan::partial;
}

constexpr std::string_view kThinkStart = "<think>";
constexpr std::string_view kThinkEnd = "</think>";
constexpr std::string_view kStopTokens[] = {"<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"};
// Whether a stop token starts at pos (partial: it may, once more text arrives); on full, `len` is
// its length.
Scan scan_stop(std::string_view buf, size_t pos, bool final, size_t& len) {
  for (std::string_view stop : kStopTokens) {
    Scan s = starts_with(buf, pos, stop, final);
    if (s != Scan::none) return len = stop.size(), s;
  }
  return Scan::none;
}
constexpr std::string_view kDroppedTokens[] = {"<｜begin▁of▁sentence｜>", "<｜▁pad▁｜>", "｜DSML｜"};
// Spellings of the DSML prefix seen in the wild (§4.4): the token, ASCII bars, first bar lost.
constexpr std::string_view kDsmlPrefixes[] = {"｜DSML｜", "|DSML|", "DSML｜"};

enum class TagName { tool_calls, invoke, parameter, unknown };  // unknown: a cut-off DSML tag
constexpr std::pair<std::string_view, TagName> kTagNames[] = {
    {"tool_calls", TagName::tool_calls}, {"function_calls", TagName::tool_calls},  // V3.2 spelling
    {"invoke", TagName::invoke}, {"parameter", TagName::parameter}};

struct Tag {
  bool closing = false;
  TagName name = TagName::tool_calls;
  std::string_view attrs;
  size_t end = 0;  // position after the tag
};

constexpr size_t kMaxTagLength = 4096;  // a longer "tag" is text: bounds what is held back

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Recognises a DSML tag at buf[pos] == '<'.
Scan scan_tag(std::string_view buf, size_t pos, bool final, Tag& tag) {
  size_t p = pos + 1, n = buf.size();
  auto wait = [&] { return final ? Scan::none : Scan::partial; };
  if (p == n) return wait();
  tag.closing = buf[p] == '/';
  if (tag.closing && ++p == n) return wait();
  bool partial = false, matched = false;
  for (std::string_view prefix : kDsmlPrefixes) {
    Scan s = starts_with(buf, p, prefix, final);
    if (s == Scan::full) {
      p += prefix.size();
      matched = true;
      break;
    }
    partial |= s == Scan::partial;
  }
  if (!matched) return partial ? Scan::partial : Scan::none;
  // The tag name must be followed by '>' or a space. Input that ends inside the name waits for
  // more; at the very end it is a cut-off tag (markup, dropped), whatever the chunking was.
  bool cut = false;
  for (auto& [word, name] : kTagNames) {
    size_t available = n - p;
    if (available <= word.size()) {
      if (buf.compare(p, available, word.substr(0, available)) == 0) cut = true;
      continue;
    }
    if (buf.compare(p, word.size(), word) == 0 && (buf[p + word.size()] == '>' || is_space(buf[p + word.size()]))) {
      p += word.size();
      tag.name = name;
      matched = true;
      break;
    }
  }
  if (!matched && cut) {
    if (!final) return Scan::partial;
    tag.name = TagName::unknown;
    tag.end = n;
    return Scan::full;
  }
  if (!matched) return Scan::none;
  size_t attrs_begin = p;
  bool in_quote = false;
  for (; p < n && p - pos < kMaxTagLength; ++p) {
    if (buf[p] == '"') in_quote = !in_quote;
    if (buf[p] == '>' && !in_quote) {
      tag.attrs = buf.substr(attrs_begin, p - attrs_begin);
      tag.end = p + 1;
      return Scan::full;
    }
    if (buf[p] == '<' && !in_quote) break;  // a new tag started: this one lost its '>'
  }
  if (p == n && p - pos < kMaxTagLength && !final) return Scan::partial;
  if (p == n && final) {  // cut off inside the attributes
    tag.name = TagName::unknown;
    tag.end = n;
    return Scan::full;
  }
  // Unterminated: accept the tag up to here when it needs no attributes, else it is text.
  if (tag.closing || tag.name == TagName::tool_calls) {
    tag.attrs = {};
    tag.end = attrs_begin;
    return Scan::full;
  }
  return Scan::none;
}

// Value of attribute `key` in ` name="x" string="true"`; found = false when absent.
std::string attribute(std::string_view attrs, std::string_view key, bool& found) {
  found = false;
  size_t p = 0;
  while (p < attrs.size()) {
    while (p < attrs.size() && is_space(attrs[p])) ++p;
    size_t key_begin = p;
    while (p < attrs.size() && attrs[p] != '=' && !is_space(attrs[p])) ++p;
    std::string_view k = attrs.substr(key_begin, p - key_begin);
    if (p >= attrs.size() || attrs[p] != '=' || p + 1 >= attrs.size() || attrs[p + 1] != '"') return {};
    size_t value_begin = p + 2, value_end = attrs.find('"', value_begin);
    if (value_end == std::string_view::npos) value_end = attrs.size();
    if (k == key) {
      found = true;
      return std::string(attrs.substr(value_begin, value_end - value_begin));
    }
    p = value_end + 1;
  }
  return {};
}

bool is_json(std::string_view text) {
  // nlohmann's lexer reads a NUL byte as the end of input, so "1\0junk" would pass otherwise.
  return text.find('\0') == std::string_view::npos && nlohmann::json::accept(text.begin(), text.end());
}

}  // namespace

OutputParser::OutputParser(ParserOptions options)
    : options_(options), state_(options.thinking ? State::reasoning : State::content) {}

void OutputParser::warn(std::string message) {
  for (const std::string& w : message_.warnings)
    if (w == message) return;
  message_.warnings.push_back(std::move(message));
}

void OutputParser::emit(ParserDelta::Kind kind, std::string_view text) {
  if (text.empty() && kind != ParserDelta::Kind::tool_call_begin) return;
  int index = int(message_.tool_calls.size()) - 1;
  switch (kind) {
    case ParserDelta::Kind::reasoning: message_.reasoning_content += text; index = -1; break;
    case ParserDelta::Kind::content: message_.content += text; index = -1; break;
    case ParserDelta::Kind::tool_call_begin: break;
    case ParserDelta::Kind::tool_call_arguments: message_.tool_calls.back().arguments += text; break;
  }
  if (!out_) return;
  if (!out_->empty() && kind != ParserDelta::Kind::tool_call_begin && out_->back().kind == kind &&
      out_->back().tool_index == index) {
    out_->back().text += text;  // one delta per kind and call within a feed
  } else {
    out_->push_back({kind, std::string(text), index});
  }
}

void OutputParser::emit_text(std::string_view text) {
  // Invalid UTF-8 becomes U+FFFD here; callers hold back a valid but unfinished tail, so the
  // replacement does not depend on how the input was chunked.
  emit(state_ == State::reasoning ? ParserDelta::Kind::reasoning : ParserDelta::Kind::content,
       is_valid_utf8(text) ? std::string(text) : to_valid_utf8(text));
}

void OutputParser::begin_call(std::string_view attrs) {
  bool found = false;
  std::string name = to_valid_utf8(attribute(attrs, "name", found));
  if (!found) warn("tool call without a name");
  message_.tool_calls.push_back({name, ""});
  emit(ParserDelta::Kind::tool_call_begin, name);
  call_params_ = 0;
  call_param_names_.clear();
  call_body_.clear();
  state_ = State::invoke;
}

void OutputParser::begin_parameter(std::string_view attrs) {
  bool has_name = false, has_type = false;
  std::string name = to_valid_utf8(attribute(attrs, "name", has_name));
  std::string type = attribute(attrs, "string", has_type);
  if (!has_name) warn("parameter without a name");
  state_ = State::value;
  value_raw_.clear();
  for (const std::string& seen : call_param_names_) {
    if (seen == name) {
      warn("duplicate parameter \"" + name + "\": the first value is kept");
      value_kind_ = ValueKind::skipped;
      return;
    }
  }
  call_param_names_.push_back(name);
  emit(ParserDelta::Kind::tool_call_arguments, (call_params_++ == 0 ? "{" : ", ") + python_json_string(name) + ": ");
  if (has_type && type == "true") {
    value_kind_ = ValueKind::string;
    emit(ParserDelta::Kind::tool_call_arguments, "\"");
  } else {
    if (!has_type || type != "false") warn("parameter without string=\"true|false\": JSON if it parses");
    value_kind_ = has_type && type == "false" ? ValueKind::json : ValueKind::guess;
  }
}

void OutputParser::end_value() {
  if (value_kind_ == ValueKind::string) {
    emit(ParserDelta::Kind::tool_call_arguments, "\"");
  } else if (value_kind_ != ValueKind::skipped) {
    if (is_json(value_raw_)) {
      emit(ParserDelta::Kind::tool_call_arguments, value_raw_);  // verbatim, as the reference
    } else {
      if (value_kind_ == ValueKind::json) warn("string=\"false\" value is not JSON: kept as a string");
      emit(ParserDelta::Kind::tool_call_arguments, python_json_string(to_valid_utf8(value_raw_)));
    }
  }
  value_raw_.clear();
  state_ = State::invoke;
}

void OutputParser::end_call() {
  if (state_ == State::value) end_value();
  if (call_params_ > 0) {
    emit(ParserDelta::Kind::tool_call_arguments, "}");
  } else {
    // "Format 2": the model wrote the arguments object straight into the invoke.
    std::string_view body = call_body_;
    while (!body.empty() && is_space(body.front())) body.remove_prefix(1);
    while (!body.empty() && is_space(body.back())) body.remove_suffix(1);
    bool object = !body.empty() && body.front() == '{' && is_json(body);
    if (!body.empty() && !object) warn("text inside an invoke that is neither parameters nor a JSON object");
    emit(ParserDelta::Kind::tool_call_arguments, object ? body : std::string_view("{}"));
  }
  call_body_.clear();
  state_ = State::block;
}

// At buf[pos] ('<' or the first byte of '｜'), in reasoning or content. Returns the new position;
// `waiting` is set when more input is needed to decide.
size_t OutputParser::on_text_marker(size_t pos, bool final, bool& waiting) {
  std::string_view buf = buffer_;
  bool partial = false;
  auto check = [&](std::string_view literal) {
    Scan s = starts_with(buf, pos, literal, final);
    partial |= s == Scan::partial;
    return s == Scan::full;
  };
  if (check(kThinkStart)) {
    bool nothing_yet = message_.content.find_first_not_of(" \t\r\n") == std::string::npos && message_.tool_calls.empty();
    if (state_ == State::content && nothing_yet) {
      state_ = State::reasoning;  // the model opened reasoning itself
    } else if (state_ == State::content || !message_.reasoning_content.empty()) {
      warn("stray <think> dropped");
    }
    return pos + kThinkStart.size();
  }
  if (check(kThinkEnd)) {
    if (state_ == State::reasoning)
      state_ = State::content;
    else
      warn("stray </think> in content dropped");
    return pos + kThinkEnd.size();
  }
  for (std::string_view stop : kStopTokens)
    if (check(stop)) return stop_at(pos + stop.size());
  for (std::string_view dropped : kDroppedTokens)
    if (check(dropped)) return warn("control token in text dropped"), pos + dropped.size();
  if (buf[pos] == '<') {
    Tag tag;
    Scan s = scan_tag(buf, pos, final, tag);
    if (s == Scan::full) {
      if (!tag.closing && (tag.name == TagName::tool_calls || tag.name == TagName::invoke)) {
        if (state_ == State::reasoning) warn("tool call inside reasoning: reasoning ended there");
        state_ = State::block;
        return tag.name == TagName::invoke ? pos : tag.end;  // an invoke is handled by the block
      }
      warn("stray DSML tag dropped");
      return tag.end;
    }
    partial |= s == Scan::partial;
  }
  if (partial) {
    waiting = true;
    return pos;
  }
  return pos;  // not a marker
}

size_t OutputParser::step_text(size_t pos, bool final) {
  std::string_view buf = buffer_;
  size_t k = pos;
  while (k < buf.size() && buf[k] != '<' && buf[k] != '\n' && buf[k] != '\xEF') ++k;
  if (k > pos) {
    size_t end = k;
    if (k == buf.size() && !final) end -= incomplete_tail_length(buf.substr(pos, k - pos));
    emit_text(buf.substr(pos, end - pos));
    return end;
  }
  if (buf[pos] == '\n') {
    // Newlines may be the separator before a tool block ("\n\n<｜DSML｜tool_calls>"): hold them.
    size_t m = pos;
    while (m < buf.size() && buf[m] == '\n') ++m;
    if (m == buf.size() && !final) return pos;
    Tag tag;
    Scan s = m < buf.size() && buf[m] == '<' ? scan_tag(buf, m, final, tag) : Scan::none;
    if (s == Scan::partial) return pos;
    size_t separator = 0;
    if (s == Scan::full && !tag.closing && (tag.name == TagName::tool_calls || tag.name == TagName::invoke)) separator = std::min<size_t>(2, m - pos);
    emit_text(buf.substr(pos, m - pos - separator));
    return m;
  }
  bool waiting = false;
  State before = state_;
  size_t next = on_text_marker(pos, final, waiting);
  if (waiting || state_ != before) return next;
  if (next == pos) {  // an ordinary '<' or '｜'
    size_t len = buf[pos] == '<' ? 1 : valid_sequence_length(buf, pos);
    if (len == 0) {
      if (!final && incomplete_tail_length(buf.substr(pos)) == buf.size() - pos) return pos;  // unfinished
      len = invalid_subpart_length(buf, pos);
    }
    emit_text(buf.substr(pos, len));
    return pos + len;
  }
  return next;
}

size_t OutputParser::stop_at(size_t end) {
  message_.ended_by_stop_token = true;
  state_ = State::stopped;
  return end;
}

size_t OutputParser::step_block(size_t pos, bool final) {
  std::string_view buf = buffer_;
  if (is_space(buf[pos])) return pos + 1;
  size_t stop_len = 0;
  const Scan stop = scan_stop(buf, pos, final, stop_len);
  if (stop == Scan::partial) return pos;
  if (stop == Scan::full) return stop_at(pos + stop_len);
  if (buf[pos] == '<') {
    Tag tag;
    Scan s = scan_tag(buf, pos, final, tag);
    if (s == Scan::partial) return pos;
    if (s == Scan::full) {
      if (tag.name == TagName::invoke && !tag.closing) {
        if (state_ == State::after) warn("second tool-call block");
        begin_call(tag.attrs);
      } else if (tag.name == TagName::tool_calls) {
        state_ = tag.closing ? State::after : State::block;
      } else {
        warn("misplaced DSML tag dropped");
      }
      return tag.end;
    }
  }
  warn(state_ == State::after ? "text after the tool calls dropped" : "text between tool calls dropped");
  return pos + 1;
}

size_t OutputParser::step_invoke(size_t pos, bool final) {
  std::string_view buf = buffer_;
  size_t stop_len = 0;
  const Scan stop = scan_stop(buf, pos, final, stop_len);
  if (stop == Scan::partial) return pos;
  if (stop == Scan::full) {
    warn("tool call cut off by a stop token");
    end_call();
    return stop_at(pos + stop_len);
  }
  if (buf[pos] == '<') {
    Tag tag;
    Scan s = scan_tag(buf, pos, final, tag);
    if (s == Scan::partial) return pos;
    if (s == Scan::full) {
      if (tag.name == TagName::parameter && !tag.closing) {
        begin_parameter(tag.attrs);
      } else if (tag.name == TagName::parameter) {
        warn("stray </parameter> dropped");
      } else {
        if (!tag.closing || tag.name == TagName::tool_calls) warn("invoke not closed");
        end_call();
        if (tag.name == TagName::invoke && !tag.closing) return pos;  // the block opens the next call
        if (tag.name == TagName::tool_calls) state_ = tag.closing ? State::after : State::block;
      }
      return tag.end;
    }
  }
  if (call_params_ == 0) call_body_ += buf[pos];
  else if (!is_space(buf[pos])) warn("text between parameters dropped");
  return pos + 1;
}

size_t OutputParser::step_value(size_t pos, bool final) {
  std::string_view buf = buffer_;
  size_t k = buf.find('<', pos);
  if (k == std::string_view::npos) k = buf.size();
  if (k > pos) {
    size_t end = k;
    if (k == buf.size() && !final) end -= incomplete_tail_length(buf.substr(pos, k - pos));
    std::string_view text = buf.substr(pos, end - pos);
    if (value_kind_ == ValueKind::string) {
      std::string escaped;
      append_python_json_string_body(escaped, is_valid_utf8(text) ? std::string(text) : to_valid_utf8(text));
      emit(ParserDelta::Kind::tool_call_arguments, escaped);
    } else if (value_kind_ != ValueKind::skipped) {
      value_raw_ += text;
    }
    return end;
  }
  // At '<': the end of the value is any DSML tag (normally </｜DSML｜parameter>) or a stop token.
  size_t stop_len = 0;
  const Scan stop = scan_stop(buf, pos, final, stop_len);
  if (stop == Scan::partial) return pos;
  if (stop == Scan::full) return end_value(), pos;  // the invoke state ends the call and stops
  Tag tag;
  Scan s = scan_tag(buf, pos, final, tag);
  if (s == Scan::partial) return pos;
  if (s == Scan::full) {
    end_value();
    if (tag.name == TagName::parameter && tag.closing) return tag.end;
    warn("parameter value not closed");
    return pos;  // the invoke state handles the tag
  }
  if (value_kind_ == ValueKind::string) emit(ParserDelta::Kind::tool_call_arguments, "<");
  else if (value_kind_ != ValueKind::skipped) value_raw_ += '<';
  return pos + 1;
}

size_t OutputParser::step(size_t pos, bool final) {
  switch (state_) {
    case State::reasoning:
    case State::content: return step_text(pos, final);
    case State::block:
    case State::after: return step_block(pos, final);
    case State::invoke: return step_invoke(pos, final);
    case State::value: return step_value(pos, final);
    case State::stopped:
      if (buffer_.find_first_not_of(" \t\r\n", pos) != std::string::npos) warn("text after the stop token dropped");
      return buffer_.size();
  }
  return buffer_.size();
}

void OutputParser::run(bool final) {
  size_t pos = 0;
  while (pos < buffer_.size()) {
    State before = state_;
    size_t next = step(pos, final);
    // No progress and no state change means the step waits for more input (never when final).
    if (next == pos && state_ == before) break;
    pos = next;
  }
  buffer_.erase(0, pos);
}

std::vector<ParserDelta> OutputParser::feed(std::string_view text) {
  std::vector<ParserDelta> deltas;
  if (finished_) return deltas;
  buffer_ += text;
  out_ = &deltas;
  run(false);
  out_ = nullptr;
  return deltas;
}

ParsedMessage OutputParser::finish(std::vector<ParserDelta>* last) {
  std::vector<ParserDelta> deltas;
  if (!finished_) {
    out_ = &deltas;
    run(true);
    if (!buffer_.empty()) {  // cannot happen with final steps; keep the invariant visible
      warn("unparsed output dropped");
      buffer_.clear();
    }
    if (state_ == State::value || state_ == State::invoke) {
      warn("output ended inside a tool call");
      end_call();
    }
    out_ = nullptr;
    finished_ = true;
  }
  if (last) *last = std::move(deltas);
  return message_;
}

}  // namespace dsv4::tokenizer
