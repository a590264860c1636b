// Unicode character classes for the V4 pre-tokenizer (tokenizer-and-chat.md §2.2–2.3).
//
// One class per code point: the general-category major class (L, M, N, P, S) or "space"
// (Oniguruma's \s: TAB..CR, NEL, Zs, Zl, Zp), else "other". The data is generated from
// Unicode 16.0 — the version HF `tokenizers` 0.23 (Oniguruma) uses — by
// tools/tokenizer/gen_unicode_table.py; a flat 1.1 MiB lookup table is built on first use.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dsv4::tokenizer {

enum class CharClass : uint8_t { other, letter, mark, number, punct, symbol, space };

extern const uint32_t kCharClassRuns[];  // (first code point << 3) | class, ascending
extern const size_t kCharClassRunCount;

// The class of a code point; code points past U+10FFFF are "other".
CharClass char_class(uint32_t cp);

}  // namespace dsv4::tokenizer
