// Request parsing and stop strings: the server-side rules that the openai-client tests
// (server_test.py) only see from outside.
#include <gtest/gtest.h>

#include "server/api_error.h"
#include "server/openai_request.h"
#include "server/stop_strings.h"

namespace dsv4::server {

namespace {

ordered_json chat_body(ordered_json extra = ordered_json::object()) {
  ordered_json body = {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  if (extra.is_object()) body.update(extra);
  return body;
}

int status_of(const ordered_json& body) {
  try {
    parse_chat_request(body, "m", tk::ChatVariant::v4_preview);
  } catch (const ApiError& e) {
    return e.status();
  }
  return 200;
}

}  // namespace

TEST(StopStrings, HoldsBackAPossibleStartAndCutsAtTheMatch) {
  StopStrings s({"END", "xyz"});
  EXPECT_EQ(s.feed("abc E"), "abc ");  // "E" may begin END
  EXPECT_EQ(s.feed("N"), "");
  EXPECT_EQ(s.feed("D and more"), "");
  EXPECT_TRUE(s.matched());
  EXPECT_EQ(s.flush(), "");
  StopStrings t({"END"});
  EXPECT_EQ(t.feed("EN"), "");
  EXPECT_EQ(t.feed("d"), "ENd");  // not a stop after all
  EXPECT_EQ(t.feed("E"), "");
  EXPECT_EQ(t.flush(), "E");
  EXPECT_FALSE(t.matched());
}

TEST(OpenAiRequest, ThinkingFollowsDeepSeeksApi) {
  auto parse = [](ordered_json extra, tk::ChatVariant v = tk::ChatVariant::v4_preview) {
    return parse_chat_request(chat_body(extra), "m", v);
  };
  EXPECT_FALSE(parse({}).thinking);
  EXPECT_TRUE(parse({{"thinking", {{"type", "enabled"}}}}).thinking);
  const ChatRequest high = parse({{"reasoning_effort", "high"}});
  EXPECT_TRUE(high.thinking);
  EXPECT_EQ(high.reasoning_effort, "high");
  EXPECT_EQ(parse({{"reasoning_effort", "xhigh"}}).reasoning_effort, "max");
  EXPECT_EQ(parse({{"reasoning_effort", "low"}}).reasoning_effort, "high");  // preview: no low
  EXPECT_EQ(parse({{"reasoning_effort", "low"}}, tk::ChatVariant::v4_0731).reasoning_effort, "low");
  EXPECT_FALSE(parse({{"reasoning_effort", "none"}}).thinking);
  EXPECT_FALSE(parse({{"reasoning_effort", "high"}, {"thinking", {{"type", "disabled"}}}}).thinking);
}

TEST(OpenAiRequest, RefusesWhatItCannotHonour) {
  EXPECT_EQ(status_of(chat_body()), 200);
  EXPECT_EQ(status_of(chat_body({{"model", "other"}})), 404);
  EXPECT_EQ(status_of(chat_body({{"temperature", "hot"}})), 400);
  EXPECT_EQ(status_of(chat_body({{"top_logprobs", 3}})), 400);  // without logprobs
  EXPECT_EQ(status_of(chat_body({{"stop", {"a", "b", "c", "d", "e"}}})), 400);
  EXPECT_EQ(status_of(chat_body({{"tool_choice", "required"}})), 400);  // without tools
  EXPECT_EQ(status_of(chat_body({{"presence_penalty", 0.5}})), 400);
  EXPECT_EQ(status_of(chat_body({{"presence_penalty", 0}})), 200);
  EXPECT_EQ(status_of(chat_body({{"reasoning_effort", "extreme"}})), 400);
  EXPECT_EQ(status_of(chat_body({{"unknown_field", 1}})), 400);
  EXPECT_EQ(status_of(chat_body({{"max_tokens", 0}})), 400);
  EXPECT_EQ(status_of(chat_body({{"messages", "hi"}})), 400);
}

}  // namespace dsv4::server
