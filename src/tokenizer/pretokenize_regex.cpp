// The pre-tokenizer computed literally: the three Split regexes of tokenizer.json through PCRE2
// (UTF + UCP, JIT-compiled). Used as the oracle for the hand-written scanner (pretokenize.cpp).
//
// "Isolated" splitting: every match is a piece and every unmatched stretch between matches is a
// piece. Each regex sees one piece of the previous step as its whole subject, so look-ahead never
// crosses a piece boundary — the same as HF `tokenizers`, which splits piece by piece.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <memory>
#include <string>

#include "core/error.h"
#include "tokenizer/pretokenize.h"

namespace dsv4::tokenizer {

namespace {

class Regex {
 public:
  explicit Regex(std::string_view pattern) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                          PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
    if (!code_) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof message);
      fail(ErrorCode::internal, "pre-tokenizer regex: {} at offset {}",
           reinterpret_cast<const char*>(message), offset);
    }
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if JIT fails
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Isolated split of text[piece] appended to out.
  void split(std::string_view text, Piece piece, std::vector<Piece>& out) const {
    std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match(
        pcre2_match_data_create_from_pattern(code_, nullptr), pcre2_match_data_free);
    auto subject = reinterpret_cast<PCRE2_SPTR>(text.data() + piece.begin);
    size_t length = piece.end - piece.begin, pos = 0, gap = 0;
    while (pos < length) {
      int rc = pcre2_match(code_, subject, length, pos, PCRE2_NO_UTF_CHECK, match.get(), nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) fail(ErrorCode::internal, "pre-tokenizer regex: match error {}", rc);
      PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.get());
      size_t begin = ovector[0], end = ovector[1];
      if (end == begin) fail(ErrorCode::internal, "pre-tokenizer regex: empty match");
      if (gap < begin) out.push_back({uint32_t(piece.begin + gap), uint32_t(piece.begin + begin)});
      out.push_back({uint32_t(piece.begin + begin), uint32_t(piece.begin + end)});
      pos = gap = end;
    }
    if (gap < length) out.push_back({uint32_t(piece.begin + gap), piece.end});
  }

 private:
  pcre2_code* code_ = nullptr;
};

}  // namespace

void pretokenize_with_regex(std::string_view text, std::vector<Piece>& out) {
  static const Regex steps[] = {Regex(kSplitPatternNumbers), Regex(kSplitPatternCjk),
                                Regex(kSplitPatternWords)};
  std::vector<Piece> pieces{{0, uint32_t(text.size())}}, next;
  if (text.empty()) return;
  for (const Regex& step : steps) {
    next.clear();
    for (Piece p : pieces) step.split(text, p, next);
    pieces.swap(next);
  }
  out.insert(out.end(), pieces.begin(), pieces.end());
}

}  // namespace dsv4::tokenizer
