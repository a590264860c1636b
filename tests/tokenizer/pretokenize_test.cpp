// The hand-written pre-tokenizer against the literal regexes run by PCRE2 (pretokenize.h).
//
// PCRE2 10.42 classifies by Unicode 14 while the scanner uses Unicode 16 (HF's version), so code
// points whose class differs between the two are found first and left out of the random strings;
// the full-Unicode agreement with HF itself is checked by tools/tokenizer/compare_with_hf.py --sweep.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "tokenizer/pretokenize.h"
#include "tokenizer/utf8.h"

namespace dsv4::tokenizer {
namespace {

std::vector<std::string> split(std::string_view text, bool regex) {
  std::vector<Piece> pieces;
  regex ? pretokenize_with_regex(text, pieces) : pretokenize(text, pieces);
  std::vector<std::string> out;
  for (Piece p : pieces) out.emplace_back(text.substr(p.begin, p.end - p.begin));
  return out;
}

std::string utf8(uint32_t cp) {
  std::string s;
  append_code_point(s, cp);
  return s;
}

TEST(Pretokenize, DocumentedExamples) {
  using V = std::vector<std::string>;
  EXPECT_EQ(split("1 + 1", false), (V{"1", " +", " ", "1"}));
  EXPECT_EQ(split("1234567890", false), (V{"123", "456", "789", "0"}));
  EXPECT_EQ(split("    int", false), (V{"   ", " int"}));
  EXPECT_EQ(split("x \u0085\u0085 y", false), (V{"x", " \u0085\u0085", " y"}));
  EXPECT_EQ(split("):\n\nfoo", false), (V{"):\n\n", "foo"}));
  EXPECT_EQ(split("你好world", false), (V{"你好", "world"}));

  EXPECT_EQ(split("", false), V{});
}

TEST(Pretokenize, EqualsRegexOnRandomStrings) {
  // Candidate characters: every class, the CJK ranges, and samples across the whole code space.
  std::vector<uint32_t> candidates = {' ', '\t', '\n', '\r', 0x0B, 0x0C, 0x85, 0xA0, 0x2028, 0x3000,
                                      0x200D, 0xFEFF, 0x0301, 0x0663, 0xBD, 0x2167, 0x3007, 0x30FB,
                                      0x30FC, 0x3099, 0x4E00, 0x9FA5, 0x9FA6, 0x3400, 0xFF10, 0xFF5C,
                                      0x1F600, 0x1F3FD, 0xE000, 0x378, 0x00, 0x7F, 0x9F};
  for (uint32_t c = 0x20; c < 0x7F; ++c) candidates.push_back(c);
  std::mt19937 rng(7);
  for (int i = 0; i < 3000; ++i) {
    uint32_t cp = rng() % 0x110000;
    if (cp < 0xD800 || cp > 0xDFFF) candidates.push_back(cp);
  }
  for (int i = 0; i < 1500; ++i) candidates.push_back(0x80 + rng() % 0x3000);  // dense BMP scripts
  std::vector<uint32_t> pool;
  size_t drift = 0;
  for (uint32_t cp : candidates) {
    bool same = true;
    for (const char* ctx : {"a%b", " %.", "%", "%%x", "\n% 1", "%\u0301 "}) {
      std::string s;
      for (const char* p = ctx; *p; ++p) s += *p == '%' ? utf8(cp) : std::string(1, *p);
      if (split(s, false) != split(s, true)) same = false;
    }
    same ? pool.push_back(cp) : void(++drift);
  }
  EXPECT_LT(drift, candidates.size() / 20) << "too many Unicode 14 vs 16 differences to be version drift";

  size_t compared = 0;
  for (int round = 0; round < 20000; ++round) {
    std::string s;
    int n = 1 + rng() % 12;
    for (int k = 0; k < n; ++k) {
      uint32_t cp = pool[rng() % pool.size()];
      int repeat = rng() % 4 == 0 ? 1 + rng() % 3 : 1;
      for (int r = 0; r < repeat; ++r) s += utf8(cp);
    }
    auto fast = split(s, false), slow = split(s, true);
    ASSERT_EQ(fast, slow) << "input bytes: " << testing::PrintToString(s);
    ++compared;
  }
  EXPECT_EQ(compared, 20000u);
}

}  // namespace
}  // namespace dsv4::tokenizer
