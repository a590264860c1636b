// Hand-written equivalent of the three pre-tokenizer splits (tokenizer-and-chat.md §2.3).
//
// Text is decoded once into code points with a small flag set each. Step 1 isolates runs of
// \p{N} in chunks of 3; step 2 isolates runs of the CJK/kana ranges in what remains; step 3 (the
// word regex) runs on every piece from step 2. Step 3 is skipped on number chunks because it
// provably matches nothing there (every alternative needs a letter, mark, punctuation, symbol or
// space), so such a chunk stays one unmatched piece — the same output. Steps 2 and 3 see one piece
// at a time, which is why the look-ahead of `\s+(?!\S)` stops at a digit or CJK boundary.
#include "tokenizer/pretokenize.h"

#include <algorithm>

#include "tokenizer/unicode_table.h"
#include "tokenizer/utf8.h"

namespace dsv4::tokenizer {

namespace {

enum Flag : uint8_t {
  kLetter = 1,       // \p{L}
  kMark = 2,         // \p{M}
  kNumber = 4,       // \p{N}
  kPunctSym = 8,     // \p{P} or \p{S} (the regexes never tell them apart)
  kSpace = 16,       // \s
  kCrLf = 32,        // \r or \n
  kCjk = 64,         // [一-龥぀-ゟ゠-ヿ]
  kAsciiLetter = 128,
};

bool is_ascii_punct(uint32_t cp) {
  return (cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x40) || (cp >= 0x5B && cp <= 0x60) ||
         (cp >= 0x7B && cp <= 0x7E);
}

uint8_t flags_of(uint32_t cp) {
  uint8_t f = 0;
  switch (char_class(cp)) {
    case CharClass::letter: f = kLetter; break;
    case CharClass::mark: f = kMark; break;
    case CharClass::number: f = kNumber; break;
    case CharClass::punct:
    case CharClass::symbol: f = kPunctSym; break;
    case CharClass::space: f = kSpace; break;
    case CharClass::other: break;
  }
  if (cp == '\r' || cp == '\n') f |= kCrLf;
  if ((cp >= 0x4E00 && cp <= 0x9FA5) || (cp >= 0x3040 && cp <= 0x30FF)) f |= kCjk;
  if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z' && cp < 0x80) f |= kAsciiLetter;
  return f;
}

// ASCII flags are looked up often enough to deserve a table.
struct AsciiFlags {
  uint8_t flags[128];
  AsciiFlags() {
    for (uint32_t c = 0; c < 128; ++c) flags[c] = flags_of(c);
  }
};

class WordScanner {
 public:
  WordScanner(const std::vector<uint8_t>& flags, const std::vector<uint32_t>& cps,
              const std::vector<uint32_t>& offsets, std::vector<Piece>& out)
      : f_(flags), cp_(cps), off_(offsets), out_(out) {}

  // Step 3 on the code points [a, b): matches and the unmatched stretches between them.
  void split(size_t a, size_t b) {
    size_t gap = a, i = a;
    while (i < b) {
      size_t e = match_at(i, b);
      if (e == 0) {
        ++i;
        continue;
      }
      if (gap < i) emit(gap, i);
      emit(i, e);
      i = gap = e;
    }
    if (gap < b) emit(gap, b);
  }

 private:
  bool has(size_t i, uint8_t flag) const { return f_[i] & flag; }

  void emit(size_t a, size_t b) { out_.push_back({off_[a], off_[b]}); }

  // End of the match of the word regex starting exactly at i (alternatives in order), or 0.
  size_t match_at(size_t i, size_t b) const {
    // A: one ASCII punctuation char, then ASCII letters.
    if (cp_[i] < 0x80 && is_ascii_punct(cp_[i]) && i + 1 < b && has(i + 1, kAsciiLetter)) {
      size_t e = i + 2;
      while (e < b && has(e, kAsciiLetter)) ++e;
      return e;
    }
    // B: [^\r\n\p{L}\p{P}\p{S}]? then [\p{L}\p{M}]+.
    const uint8_t word = kLetter | kMark;
    bool may_prefix = !has(i, kLetter | kPunctSym | kCrLf);
    if ((may_prefix && i + 1 < b && has(i + 1, word)) || has(i, word)) {
      size_t e = i + 1;
      while (e < b && has(e, word)) ++e;
      return e;
    }
    // C: ' '? then [\p{P}\p{S}]+ then [\r\n]*.
    size_t s = (cp_[i] == ' ' && i + 1 < b && has(i + 1, kPunctSym)) ? i + 1 : i;
    if (has(s, kPunctSym)) {
      size_t e = s + 1;
      while (e < b && has(e, kPunctSym)) ++e;
      while (e < b && has(e, kCrLf)) ++e;
      return e;
    }
    if (!has(i, kSpace)) return 0;
    size_t run_end = i, last_crlf = 0;
    bool any_crlf = false;
    for (; run_end < b && has(run_end, kSpace); ++run_end)
      if (has(run_end, kCrLf)) any_crlf = true, last_crlf = run_end;
    if (any_crlf) return last_crlf + 1;         // D: \s*[\r\n]+ ends at the run's last CR/LF
    if (run_end == b) return run_end;           // E at the end of the piece: the whole run
    if (run_end - i >= 2) return run_end - 1;   // E: give the last space to the next word
    return i + 1;                               // F: a single space before a non-space
  }

  const std::vector<uint8_t>& f_;
  const std::vector<uint32_t>& cp_;
  const std::vector<uint32_t>& off_;
  std::vector<Piece>& out_;
};

}  // namespace

void pretokenize(std::string_view text, std::vector<Piece>& out) {
  static const AsciiFlags ascii;
  thread_local std::vector<uint8_t> flags;
  thread_local std::vector<uint32_t> cps, offsets;
  flags.clear();
  cps.clear();
  offsets.clear();
  for (size_t i = 0; i < text.size();) {
    offsets.push_back(uint32_t(i));
    uint32_t cp = decode_code_point(text, i);
    cps.push_back(cp);
    flags.push_back(cp < 128 ? ascii.flags[cp] : flags_of(cp));
  }
  offsets.push_back(uint32_t(text.size()));
  size_t n = cps.size();
  WordScanner words(flags, cps, offsets, out);

  size_t i = 0;
  while (i < n) {
    if (flags[i] & kNumber) {  // step 1: \p{N}{1,3}
      size_t end = i;
      while (end < n && (flags[end] & kNumber)) ++end;
      for (; i < end; i += 3) out.push_back({offsets[i], offsets[std::min(i + 3, end)]});
      i = end;
      continue;
    }
    size_t end = i;
    while (end < n && !(flags[end] & kNumber)) ++end;
    while (i < end) {  // step 2 isolates CJK runs; step 3 splits each resulting piece
      bool cjk = flags[i] & kCjk;
      size_t j = i + 1;
      while (j < end && bool(flags[j] & kCjk) == cjk) ++j;
      words.split(i, j);
      i = j;
    }
  }
}

}  // namespace dsv4::tokenizer
