// UTF-8 helpers shared by the tokenizer, the stream decoder and the output parser.
//
// Invalid input is handled with the "maximal subpart" rule of Unicode §3.9 (U+FFFD for each
// maximal prefix of a would-be sequence, or for each stray byte) — the rule of Rust's
// String::from_utf8_lossy (what HF `tokenizers` uses when decoding) and of Python's
// bytes.decode("utf-8", "replace").
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dsv4::tokenizer {

inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// Length of the valid UTF-8 sequence starting at s[i], or 0 when s[i] does not start one
// (bad lead byte, bad continuation, overlong, surrogate, past U+10FFFF, or cut off by the end).
size_t valid_sequence_length(std::string_view s, size_t i);

// Length of the maximal subpart at s[i] that an invalid position covers (≥ 1), i.e. how many
// bytes one U+FFFD replaces. Only meaningful where valid_sequence_length(s, i) == 0.
size_t invalid_subpart_length(std::string_view s, size_t i);

// Number of bytes at the end of s that are a proper prefix of a valid sequence (0–3): bytes a
// stream must hold back because the next chunk may complete them.
size_t incomplete_tail_length(std::string_view s);

bool is_valid_utf8(std::string_view s);

// s with every invalid subpart replaced by U+FFFD.
std::string to_valid_utf8(std::string_view s);

// Decodes the valid sequence at s[i] (the caller knows it is valid) and advances i.
uint32_t decode_code_point(std::string_view s, size_t& i);

void append_code_point(std::string& out, uint32_t cp);

}  // namespace dsv4::tokenizer
