// The DeepSeek V3/V4 pre-tokenizer: splits a stretch of text (with no added tokens in it) into
// the pieces that BPE then encodes one by one (tokenizer-and-chat.md §2.2–2.3).
//
// tokenizer.json declares three regex splits (behaviour "Isolated", each applied to every piece
// of the previous one). `pretokenize` is a hand-written scanner equal to them, written out in
// the §2.3 form, with Unicode 16 classes (unicode_table.h) because that is what HF's Oniguruma
// uses. `pretokenize_with_regex` runs the literal regexes with PCRE2 (UTF + UCP + JIT): it is the
// oracle the tests and the fuzzer compare the scanner against, valid wherever PCRE2's Unicode 14
// tables agree with Unicode 16.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace dsv4::tokenizer {

// Byte range [begin, end) of a piece within the text that was split.
struct Piece {
  uint32_t begin, end;
};

// The three patterns as they appear in tokenizer.json (after JSON unescaping). The loader checks
// the file against these, since the scanner implements exactly them.
inline constexpr std::string_view kSplitPatternNumbers = "\\p{N}{1,3}";
inline constexpr std::string_view kSplitPatternCjk = "[一-龥぀-ゟ゠-ヿ]+";
inline constexpr std::string_view kSplitPatternWords =
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
    " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";

// Splits valid UTF-8 `text` into pieces, appended to `out` in order; together they cover text.
void pretokenize(std::string_view text, std::vector<Piece>& out);

// The same split computed with the three regexes through PCRE2. Slow; for tests and fuzzing.
void pretokenize_with_regex(std::string_view text, std::vector<Piece>& out);

}  // namespace dsv4::tokenizer
