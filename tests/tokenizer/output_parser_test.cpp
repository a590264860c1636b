// The streaming output parser (issue 3 acceptance): ≥ 30 cases, each checked in a single pass,
// split at every byte boundary, and fed one byte at a time — all must give the same message, the
// deltas must add up to it, and no markup may reach streamed reasoning or content.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tokenizer/chat_format.h"
#include "tokenizer/output_parser.h"

namespace dsv4::tokenizer {
namespace {

struct Call {
  std::string name, arguments;
};

struct Case {
  const char* name;
  bool thinking;
  std::string output;
  std::string reasoning, content;
  std::vector<Call> calls;
};

const std::string kEos = "<｜end▁of▁sentence｜>";
const std::string D = "｜DSML｜";

std::string invoke(const std::string& name, const std::string& params) {
  return "<" + D + "invoke name=\"" + name + "\">\n" + params + "</" + D + "invoke>\n";
}
std::string param(const std::string& name, bool is_string, const std::string& value) {
  return "<" + D + "parameter name=\"" + name + "\" string=\"" + (is_string ? "true" : "false") + "\">" + value +
         "</" + D + "parameter>\n";
}
std::string block(const std::string& invokes) {
  return "\n\n<" + D + "tool_calls>\n" + invokes + "</" + D + "tool_calls>";
}

std::vector<Case> cases() {
  std::string weather = block(invoke("get_weather", param("location", true, "Beijing") + param("unit", true, "celsius")));
  return {
      {"plain_chat", false, "Hello there!" + kEos, "", "Hello there!", {}},
      {"chat_without_eos", false, "Truncated answer", "", "Truncated answer", {}},
      {"thinking_then_answer", true, "Let me think.</think>The answer is 4." + kEos, "Let me think.", "The answer is 4.", {}},
      {"official_fixture_1_first_turn", true,
       "The user wants to know the weather in Beijing. I should use the get_weather tool.</think>" + weather + kEos,
       "The user wants to know the weather in Beijing. I should use the get_weather tool.", "",
       {{"get_weather", R"({"location": "Beijing", "unit": "celsius"})"}}},
      {"content_then_tool", true, "r</think>Checking now." + weather + kEos, "r", "Checking now.",
       {{"get_weather", R"({"location": "Beijing", "unit": "celsius"})"}}},
      {"two_calls", false,
       block(invoke("a", param("x", false, "1")) + invoke("b", param("y", false, "[1, 2]") + param("z", true, "w"))) + kEos,
       "", "", {{"a", R"({"x": 1})"}, {"b", R"({"y": [1, 2], "z": "w"})"}}},
      {"no_parameters", false, block(invoke("now", "\n")) + kEos, "", "", {{"now", "{}"}}},
      {"string_value_escaped", false,
       block(invoke("w", param("code", true, "line1\nline2\t\"q\" \\ 中文 </notdsml> <"))) + kEos, "", "",
       {{"w", R"({"code": "line1\nline2\t\"q\" \\ 中文 </notdsml> <"})"}}},
      {"json_values_verbatim", false,
       block(invoke("f", param("n", false, "3") + param("o", false, "{\"k\": [true, null]}") + param("d", false, "2.50"))) + kEos,
       "", "", {{"f", R"({"n": 3, "o": {"k": [true, null]}, "d": 2.50})"}}},
      {"invalid_json_value_becomes_string", false, block(invoke("f", param("n", false, "not json"))) + kEos, "", "",
       {{"f", R"({"n": "not json"})"}}},
      {"missing_string_attribute", false,
       block(invoke("f", "<" + D + "parameter name=\"a\">12</" + D + "parameter>\n<" + D + "parameter name=\"b\">hi</" + D +
                             "parameter>\n")) + kEos,
       "", "", {{"f", R"({"a": 12, "b": "hi"})"}}},
      {"parameter_name_with_spaces_and_string", false,
       block(invoke("f", param("my string=thing", true, "v") + param("", true, "empty name"))) + kEos, "", "",
       {{"f", R"({"my string=thing": "v", "": "empty name"})"}}},
      {"duplicate_parameter_first_wins", false, block(invoke("f", param("a", true, "1") + param("a", true, "2"))) + kEos,
       "", "", {{"f", R"({"a": "1"})"}}},
      {"multiline_cjk_value", false, block(invoke("f", param("text", true, "第一行\n第二行\n\n第三行"))) + kEos, "", "",
       {{"f", R"({"text": "第一行\n第二行\n\n第三行"})"}}},
      {"tool_call_without_end_think", true, "I will call it." + weather + kEos, "I will call it.", "",
       {{"get_weather", R"({"location": "Beijing", "unit": "celsius"})"}}},
      {"single_newline_before_block", false, "Sure.\n<" + D + "tool_calls>\n" + invoke("f", "") + "</" + D + "tool_calls>" + kEos,
       "", "Sure.", {{"f", "{}"}}},
      {"no_newline_before_block", false, "Sure.<" + D + "tool_calls>\n" + invoke("f", "") + "</" + D + "tool_calls>" + kEos,
       "", "Sure.", {{"f", "{}"}}},
      {"three_newlines_keep_one", false, "A\n\n\n<" + D + "tool_calls>\n" + invoke("f", "") + "</" + D + "tool_calls>", "",
       "A\n", {{"f", "{}"}}},
      {"ascii_bar_dsml", false, "ok\n\n<|DSML|tool_calls>\n<|DSML|invoke name=\"f\">\n<|DSML|parameter name=\"a\" "
                                "string=\"true\">x</|DSML|parameter>\n</|DSML|invoke>\n</|DSML|tool_calls>",
       "", "ok", {{"f", R"({"a": "x"})"}}},
      {"missing_first_bar", false, "<DSML｜tool_calls>\n<DSML｜invoke name=\"f\">\n</DSML｜invoke>\n</DSML｜tool_calls>" + kEos, "",
       "", {{"f", "{}"}}},
      {"function_calls_spelling", false, "\n\n<" + D + "function_calls>\n" + invoke("f", "") + "</" + D + "function_calls>", "",
       "", {{"f", "{}"}}},
      {"invoke_without_wrapper", false, "Calling.\n\n" + invoke("f", param("a", false, "1")) + kEos, "", "Calling.",
       {{"f", R"({"a": 1})"}}},
      {"json_object_inside_invoke", false,
       block("<" + D + "invoke name=\"f\">\n{\"city\": \"Oslo\", \"n\": 2}\n</" + D + "invoke>\n") + kEos, "", "",
       {{"f", R"({"city": "Oslo", "n": 2})"}}},
      {"unterminated_value_at_end", false, block(invoke("f", "")).substr(0, 0) + "\n\n<" + D + "tool_calls>\n<" + D +
                                               "invoke name=\"f\">\n<" + D + "parameter name=\"a\" string=\"true\">partial va",
       "", "", {{"f", R"({"a": "partial va"})"}}},
      {"unterminated_tag_at_end", false, "Text then <" + D + "tool_ca", "", "Text then ", {}},
      {"unterminated_invoke_header", false, "\n\n<" + D + "tool_calls>\n<" + D + "invoke name=\"get_wea", "", "", {}},
      {"partial_marker_at_end_is_text", false, "2 <", "", "2 <", {}},
      {"less_than_in_content", false, "a < b and c <= d, <b>bold</b> <thinking>" + kEos, "", "a < b and c <= d, <b>bold</b> <thinking>", {}},
      {"stray_end_think_in_content", false, "Answer</think> more" + kEos, "", "Answer more", {}},
      {"repeated_think_start", true, "<think>reason</think>answer" + kEos, "reason", "answer", {}},
      {"chat_model_thinks_anyway", false, "<think>hmm</think>fine" + kEos, "hmm", "fine", {}},
      {"nested_invoke_without_close", false,
       block(invoke("a", "<" + D + "parameter name=\"x\" string=\"true\">1</" + D + "parameter>\n").substr(0, 0) + "<" + D +
             "invoke name=\"a\">\n<" + D + "parameter name=\"x\" string=\"true\">1</" + D + "parameter>\n" + invoke("b", "")) + kEos,
       "", "", {{"a", R"({"x": "1"})"}, {"b", "{}"}}},
      {"value_not_closed_before_invoke_end", false,
       "\n\n<" + D + "tool_calls>\n<" + D + "invoke name=\"a\">\n<" + D + "parameter name=\"x\" string=\"true\">oops</" + D +
           "invoke>\n</" + D + "tool_calls>" + kEos,
       "", "", {{"a", R"({"x": "oops"})"}}},
      {"text_after_block_dropped", false, weather + "trailing junk" + kEos, "", "",
       {{"get_weather", R"({"location": "Beijing", "unit": "celsius"})"}}},
      {"text_after_eos_dropped", false, "done" + kEos + "more <｜DSML｜tool_calls>", "", "done", {}},
      {"stray_close_tags_in_content", false, "x </" + D + "invoke> y </" + D + "tool_calls> z" + kEos, "", "x  y  z", {}},
      {"bare_dsml_token_dropped", false, "a" + D + "b" + kEos, "", "ab", {}},
      {"bos_dropped", false, "<｜begin▁of▁sentence｜>hi" + kEos, "", "hi", {}},
      {"user_token_stops", false, "answer<｜User｜>fake user turn", "", "answer", {}},
      {"emoji_and_cjk", true, "思考🤔</think>答案：👍🏽" + kEos, "思考🤔", "答案：👍🏽", {}},
      {"newlines_kept_in_content", false, "line\n\n" + kEos, "", "line\n\n", {}},
      {"reasoning_with_dsml_text_lookalike", true, "consider <DSMLx and |DSML without tags</think>ok" + kEos,
       "consider <DSMLx and |DSML without tags", "ok", {}},
      {"empty_output", true, "", "", "", {}},
  };
}

ParsedMessage parse(const std::string& text, bool thinking, const std::vector<size_t>& cuts,
                    std::string* streamed_reasoning, std::string* streamed_content, std::vector<Call>* streamed_calls) {
  OutputParser parser(ParserOptions{thinking});
  std::vector<ParserDelta> all;
  size_t prev = 0;
  for (size_t cut : cuts) {
    auto d = parser.feed(std::string_view(text).substr(prev, cut - prev));
    all.insert(all.end(), d.begin(), d.end());
    prev = cut;
  }
  auto d = parser.feed(std::string_view(text).substr(prev));
  all.insert(all.end(), d.begin(), d.end());
  std::vector<ParserDelta> last;
  ParsedMessage m = parser.finish(&last);
  all.insert(all.end(), last.begin(), last.end());
  for (const ParserDelta& delta : all) {
    switch (delta.kind) {
      case ParserDelta::Kind::reasoning: *streamed_reasoning += delta.text; break;
      case ParserDelta::Kind::content: *streamed_content += delta.text; break;
      case ParserDelta::Kind::tool_call_begin:
        EXPECT_EQ(delta.tool_index, int(streamed_calls->size()));
        streamed_calls->push_back({delta.text, ""});
        break;
      case ParserDelta::Kind::tool_call_arguments:
        EXPECT_EQ(delta.tool_index, int(streamed_calls->size()) - 1);
        streamed_calls->back().arguments += delta.text;
        break;
    }
  }
  return m;
}

void expect_no_markup(const std::string& s, const std::string& where) {
  for (const char* marker : {"｜DSML｜", "|DSML|", "DSML｜", "<think>", "</think>", "<｜end▁of▁sentence｜>", "<｜User｜>"})
    EXPECT_EQ(s.find(marker), std::string::npos) << where << " leaks " << marker << ": " << s;
}

void check_case(const Case& c, const std::vector<size_t>& cuts, const std::string& how) {
  std::string reasoning, content;
  std::vector<Call> calls;
  ParsedMessage m = parse(c.output, c.thinking, cuts, &reasoning, &content, &calls);
  std::string where = std::string(c.name) + " (" + how + ")";
  EXPECT_EQ(m.reasoning_content, c.reasoning) << where;
  EXPECT_EQ(m.content, c.content) << where;
  ASSERT_EQ(m.tool_calls.size(), c.calls.size()) << where;
  for (size_t i = 0; i < c.calls.size(); ++i) {
    EXPECT_EQ(m.tool_calls[i].name, c.calls[i].name) << where;
    EXPECT_EQ(m.tool_calls[i].arguments, c.calls[i].arguments) << where;
    EXPECT_TRUE(nlohmann::json::accept(m.tool_calls[i].arguments)) << where;
  }
  EXPECT_EQ(reasoning, m.reasoning_content) << where << ": streamed reasoning";
  EXPECT_EQ(content, m.content) << where << ": streamed content";
  ASSERT_EQ(calls.size(), m.tool_calls.size()) << where;
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i].name, m.tool_calls[i].name) << where;
    EXPECT_EQ(calls[i].arguments, m.tool_calls[i].arguments) << where;
  }
  expect_no_markup(m.content, where + " content");
  expect_no_markup(m.reasoning_content, where + " reasoning");
}

TEST(OutputParser, Cases) {
  auto all = cases();
  EXPECT_GE(all.size(), 30u);
  for (const Case& c : all) check_case(c, {}, "one pass");
}

TEST(OutputParser, SplitAtEveryByteGivesTheSameMessage) {
  for (const Case& c : cases()) {
    for (size_t i = 1; i < c.output.size(); ++i) check_case(c, {i}, "split at " + std::to_string(i));
    std::vector<size_t> every;
    for (size_t i = 1; i < c.output.size(); ++i) every.push_back(i);
    check_case(c, every, "byte by byte");
    if (::testing::Test::HasFailure()) return;  // one broken case is enough output
  }
}

TEST(OutputParser, ParsesWhatTheRendererWrites) {
  // An assistant turn rendered for history parses back to the same message (well-formed DSML).
  Message m = Message::assistant("Let me check.", "Need data.");
  m.tool_calls.push_back({"c1", "search", R"({"q": "a \"b\"\nc", "n": 3, "f": 1.5, "o": {"x": [1, {}]}, "b": false})"});
  m.tool_calls.push_back({"c2", "now", "{}"});
  ChatOptions options;
  options.thinking = true;
  std::string text = render_prompt({Message::user("u"), m}, nullptr, options).text;
  std::string completion = text.substr(text.find("<think>") + 7);
  OutputParser parser(ParserOptions{true});
  parser.feed(completion);
  ParsedMessage parsed = parser.finish();
  EXPECT_EQ(parsed.reasoning_content, "Need data.");
  EXPECT_EQ(parsed.content, "Let me check.");
  ASSERT_EQ(parsed.tool_calls.size(), 2u);
  EXPECT_EQ(parsed.tool_calls[0].name, "search");
  EXPECT_EQ(parsed.tool_calls[0].arguments, R"({"q": "a \"b\"\nc", "n": 3, "f": 1.5, "o": {"x": [1, {}]}, "b": false})");
  EXPECT_EQ(parsed.tool_calls[1].arguments, "{}");
  EXPECT_TRUE(parsed.ended_by_stop_token);
  EXPECT_TRUE(parsed.warnings.empty()) << parsed.warnings.front();
}

TEST(OutputParser, StreamsArgumentsAsTheyArrive) {
  OutputParser parser;
  parser.feed("\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n");
  auto d = parser.feed("<｜DSML｜parameter name=\"text\" string=\"true\">hel");
  ASSERT_FALSE(d.empty());
  EXPECT_EQ(d.back().kind, ParserDelta::Kind::tool_call_arguments);
  EXPECT_EQ(parser.message().tool_calls.at(0).arguments, "{\"text\": \"hel");
  d = parser.feed("lo</｜DSML｜param");
  EXPECT_EQ(parser.message().tool_calls.at(0).arguments, "{\"text\": \"hello");  // the partial tag is held
}

}  // namespace
}  // namespace dsv4::tokenizer
