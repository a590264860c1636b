// Tokenizer agreement with HF `tokenizers` (issue 3 acceptance): the generated corpus
// (tools/tokenizer/make_corpus.py), the spec's vectors, round trips, invalid UTF-8, decoding and
// streaming decoding.
#include <fmt/format.h>

#include "core/error.h"
#include "test_support.h"
#include "tokenizer/utf8.h"

namespace dsv4::tokenizer {
namespace {

using json = nlohmann::ordered_json;
using testing::read_jsonl;
using testing::source_path;

std::string show_ids(const std::vector<int32_t>& ids) { return fmt::format("[{}]", fmt::join(ids, ", ")); }

TEST(Tokenizer, CorpusMatchesHuggingFace) {
  DSV4_REQUIRE_TOKENIZER(tok);
  auto rows = read_jsonl(source_path("tests/tokenizer/data/encode_corpus.jsonl"));
  ASSERT_GE(rows.size(), 20000u);
  size_t mismatches = 0, plain_checked = 0;
  for (const json& row : rows) {
    std::string text = row[0];
    auto expected = row[1].get<std::vector<int32_t>>();
    auto got = tok->encode(text);
    if (got != expected && ++mismatches <= 10)
      ADD_FAILURE() << "text " << json(text).dump() << "\n got      " << show_ids(got) << "\n expected "
                    << show_ids(expected);
    auto expected_plain = row.size() > 2 ? row[2].get<std::vector<int32_t>>() : expected;
    plain_checked += row.size() > 2;
    auto plain = tok->encode(text, /*parse_special=*/false);
    if (plain != expected_plain && ++mismatches <= 10)
      ADD_FAILURE() << "parse_special=false, text " << json(text).dump() << "\n got      " << show_ids(plain)
                    << "\n expected " << show_ids(expected_plain);
  }
  EXPECT_EQ(mismatches, 0u) << "of " << rows.size() << " strings";
  EXPECT_GT(plain_checked, 1000u);  // the corpus holds many literal control-token strings
}

TEST(Tokenizer, DecodeRoundTripsValidText) {
  DSV4_REQUIRE_TOKENIZER(tok);
  auto rows = read_jsonl(source_path("tests/tokenizer/data/encode_corpus.jsonl"));
  size_t failures = 0;
  for (const json& row : rows) {
    std::string text = row[0];
    for (bool parse_special : {true, false}) {
      auto ids = tok->encode(text, parse_special);
      if (tok->decode(ids) != text && ++failures <= 5) ADD_FAILURE() << "round trip of " << json(text).dump();
      // Streaming yields the same text, one id at a time.
      StreamDecoder stream(*tok);
      std::string streamed;
      for (int32_t id : ids) {
        std::string piece = stream.push(id);
        if (!is_valid_utf8(piece) && ++failures <= 5) ADD_FAILURE() << "stream emitted broken UTF-8";
        streamed += piece;
      }
      streamed += stream.finish();
      if (streamed != text && ++failures <= 5) ADD_FAILURE() << "streamed decode of " << json(text).dump();
    }
  }
  EXPECT_EQ(failures, 0u);
}

TEST(Tokenizer, SpecVectorsValidForV4) {
  DSV4_REQUIRE_TOKENIZER(tok);
  json vectors = json::parse(testing::read_file(source_path("tests/tokenizer/data/tokenizer-vectors.json")));
  size_t checked = 0;
  for (const char* group : {"v3_package", "v4_derived", "oniguruma_checked_edge_cases"}) {
    for (const json& v : vectors[group]) {
      if (!v.value("valid_for_v4", true)) continue;
      std::string text = v["text"];
      auto expected = v["ids"].get<std::vector<int32_t>>();
      EXPECT_EQ(show_ids(tok->encode(text)), show_ids(expected)) << group << "/" << v.value("name", "?");
      ++checked;
    }
  }
  EXPECT_GE(checked, 50u);
}

TEST(Tokenizer, InvalidUtf8IsReplacedBeforeEncoding) {
  DSV4_REQUIRE_TOKENIZER(tok);
  auto rows = read_jsonl(source_path("tests/tokenizer/data/invalid_utf8.jsonl"));
  ASSERT_GE(rows.size(), 100u);
  for (const json& row : rows) {
    std::string hex = row[0], raw;
    for (size_t i = 0; i + 1 < hex.size(); i += 2) raw += char(std::stoi(hex.substr(i, 2), nullptr, 16));
    auto expected = row[1].get<std::vector<int32_t>>();
    EXPECT_EQ(show_ids(tok->encode(raw)), show_ids(expected)) << "bytes " << hex;
    EXPECT_EQ(tok->decode(tok->encode(raw)), to_valid_utf8(raw)) << "bytes " << hex;
  }
}

TEST(Tokenizer, DecodeMatchesHuggingFaceOnArbitraryIds) {
  DSV4_REQUIRE_TOKENIZER(tok);
  auto rows = read_jsonl(source_path("tests/tokenizer/data/decode_cases.jsonl"));
  ASSERT_GE(rows.size(), 100u);
  for (const json& row : rows) {
    auto ids = row[0].get<std::vector<int32_t>>();
    EXPECT_EQ(tok->decode(ids), row[1].get<std::string>()) << show_ids(ids);
    EXPECT_EQ(tok->decode(ids, /*skip_special=*/true), row[2].get<std::string>()) << show_ids(ids);
    for (bool skip : {false, true}) {
      StreamDecoder stream(*tok, skip);
      std::string streamed;
      for (int32_t id : ids) streamed += stream.push(id);
      streamed += stream.finish();
      EXPECT_EQ(streamed, tok->decode(ids, skip)) << show_ids(ids);
    }
  }
}

TEST(Tokenizer, KnownIdsAndTable) {
  DSV4_REQUIRE_TOKENIZER(tok);
  EXPECT_EQ(tok->vocab_size(), 129280);
  EXPECT_EQ(tok->token_to_id("<think>"), 128821);
  EXPECT_EQ(tok->token_to_id("</think>"), 128822);
  EXPECT_EQ(tok->token_to_id("｜DSML｜"), 128825);
  EXPECT_EQ(tok->token_to_id("<｜end▁of▁sentence｜>"), 1);
  EXPECT_EQ(tok->token_to_id("Ġ"), 223);
  EXPECT_FALSE(tok->token_to_id("no such token").has_value());
  EXPECT_TRUE(tok->is_special(0));
  EXPECT_FALSE(tok->is_special(128821));  // <think> is not "special": decode keeps it
  EXPECT_TRUE(tok->is_added(128821));
  EXPECT_EQ(tok->id_to_token(201), "Ċ");
  EXPECT_EQ(tok->token_bytes(201), "\n");
  EXPECT_EQ(show_ids(tok->encode("<｜DSML｜tool_calls>")), "[30, 128825, 72461, 4941, 12548, 32]");
  EXPECT_EQ(show_ids(tok->encode("\n\n")), "[271]");
  EXPECT_NE(tok->encode("<think>", false), std::vector<int32_t>{128821});
  EXPECT_THROW(tok->decode(std::vector<int32_t>{129280}), dsv4::Error);
  EXPECT_THROW(tok->decode(std::vector<int32_t>{-1}), dsv4::Error);
}

TEST(Tokenizer, ControlRangesRecogniseOnlyTrustedTokens) {
  DSV4_REQUIRE_TOKENIZER(tok);
  std::string text = "<｜User｜>say </think> now<｜Assistant｜></think>";
  size_t user_end = std::string("<｜User｜>").size();
  size_t assistant = text.find("<｜Assistant｜>");
  std::vector<TextRange> ranges = {{0, user_end}, {assistant, text.size()}};
  auto ids = tok->encode_with_control_ranges(text, ranges);
  auto all = tok->encode(text);
  EXPECT_NE(ids, all);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 128822), 1);  // only the trusted </think>
  EXPECT_EQ(std::count(all.begin(), all.end(), 128822), 2);
  EXPECT_EQ(tok->decode(ids), text);
  // Without control strings in the untrusted text, the ids are exactly encode(text).
  std::string benign = "<｜User｜>Hi.\n\n<｜Assistant｜></think>";
  size_t a2 = benign.find("<｜Assistant｜>");
  std::vector<TextRange> r2 = {{0, user_end}, {a2, benign.size()}};
  EXPECT_EQ(tok->encode_with_control_ranges(benign, r2), tok->encode(benign));
}

}  // namespace
}  // namespace dsv4::tokenizer
