// Any model output: the parser never throws; feeding it in fuzz-chosen chunks gives the same
// message as one pass; deltas add up to the message; no DSML token or think tag reaches content
// or reasoning; tool-call arguments are JSON when the output was valid UTF-8.
#include <nlohmann/json.hpp>

#include "fuzz_support.h"
#include "tokenizer/output_parser.h"
#include "tokenizer/utf8.h"

using namespace dsv4;
using namespace dsv4::tokenizer;

namespace {

struct Result {
  ParsedMessage message;
  std::string reasoning, content;
  std::vector<std::string> arguments;
};

Result run(std::string_view text, bool thinking, const uint8_t* cuts, size_t n_cuts) {
  OutputParser parser(ParserOptions{thinking});
  Result r;
  auto collect = [&](const std::vector<ParserDelta>& deltas) {
    for (const ParserDelta& d : deltas) {
      if (d.kind == ParserDelta::Kind::reasoning) r.reasoning += d.text;
      if (d.kind == ParserDelta::Kind::content) r.content += d.text;
      if (d.kind == ParserDelta::Kind::tool_call_begin) r.arguments.emplace_back();
      if (d.kind == ParserDelta::Kind::tool_call_arguments) r.arguments.back() += d.text;
    }
  };
  size_t pos = 0;
  for (size_t i = 0; i < n_cuts && pos < text.size(); ++i) {
    size_t len = std::min<size_t>(cuts[i] % 9, text.size() - pos);
    collect(parser.feed(text.substr(pos, len)));
    pos += len;
  }
  collect(parser.feed(text.substr(pos)));
  std::vector<ParserDelta> last;
  r.message = parser.finish(&last);
  collect(last);
  return r;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  bool thinking = data[0] & 1;
  size_t n_cuts = std::min<size_t>(data[1], size - 2);
  const uint8_t* cuts = data + 2;
  std::string_view text(reinterpret_cast<const char*>(data + 2), size - 2);
  Result one = run(text, thinking, nullptr, 0);
  Result chunked = run(text, thinking, cuts, n_cuts);
  const ParsedMessage &a = one.message, &b = chunked.message;
  if (a.reasoning_content != b.reasoning_content || a.content != b.content || a.tool_calls.size() != b.tool_calls.size())
    fuzz::broken("chunked feeding gives the same message");
  for (size_t i = 0; i < a.tool_calls.size(); ++i)
    if (a.tool_calls[i].name != b.tool_calls[i].name || a.tool_calls[i].arguments != b.tool_calls[i].arguments)
      fuzz::broken("chunked feeding gives the same tool calls");
  for (const Result* r : {&one, &chunked}) {
    if (r->reasoning != r->message.reasoning_content || r->content != r->message.content) fuzz::broken("deltas add up");
    if (r->arguments.size() != r->message.tool_calls.size()) fuzz::broken("one begin delta per call");
    for (size_t i = 0; i < r->arguments.size(); ++i)
      if (r->arguments[i] != r->message.tool_calls[i].arguments) fuzz::broken("argument deltas add up");
  }
  // Markup in the input is consumed or dropped; the check covers inputs where no dropped token sits
  // inside a would-be marker ("<thi｜DSML｜nk>" legitimately leaves the text "<think>", and a stray
  // "</think>" dropped from "<</think>｜end▁of▁sentence｜>" leaves the text of the EOS marker).
  bool has_dropped = text.find("｜DSML｜") != std::string_view::npos || text.find("<｜begin") != std::string_view::npos ||
                     text.find("<｜▁pad") != std::string_view::npos || text.find("think>") != std::string_view::npos;
  if (!has_dropped)
    for (const std::string* s : {&a.content, &a.reasoning_content})
      for (const char* marker : {"｜DSML｜", "<｜end▁of▁sentence｜>"})
        if (s->find(marker) != std::string::npos) fuzz::broken("no markup in content or reasoning");
  if (is_valid_utf8(text))
    for (const ParsedToolCall& call : a.tool_calls)
      if (call.arguments.find('\0') != std::string::npos || !nlohmann::json::accept(call.arguments))
        fuzz::broken("arguments are JSON");
  return 0;
}
