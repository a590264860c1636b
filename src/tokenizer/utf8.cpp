#include "tokenizer/utf8.h"

namespace dsv4::tokenizer {

namespace {

// Allowed range of the second byte for a lead byte (Unicode Table 3-7); lo > hi means invalid.
struct LeadInfo {
  uint8_t length, lo, hi;
};

LeadInfo lead_info(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b < 0xC2) return {0, 1, 0};
  if (b < 0xE0) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};  // no surrogates
  if (b < 0xF0) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};  // no overlongs
  if (b < 0xF4) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};  // nothing past U+10FFFF
  return {0, 1, 0};
}

// How many bytes of the sequence at s[i] are well formed so far (up to its full length).
size_t well_formed_prefix(std::string_view s, size_t i, LeadInfo info) {
  size_t n = 1;
  while (n < info.length && i + n < s.size()) {
    uint8_t b = uint8_t(s[i + n]);
    bool ok = n == 1 ? (b >= info.lo && b <= info.hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) break;
    ++n;
  }
  return n;
}

}  // namespace

size_t valid_sequence_length(std::string_view s, size_t i) {
  LeadInfo info = lead_info(uint8_t(s[i]));
  if (info.length <= 1) return info.length;
  return well_formed_prefix(s, i, info) == info.length ? info.length : 0;
}

size_t invalid_subpart_length(std::string_view s, size_t i) {
  LeadInfo info = lead_info(uint8_t(s[i]));
  if (info.length == 0) return 1;
  return well_formed_prefix(s, i, info);
}

size_t incomplete_tail_length(std::string_view s) {
  // A proper prefix is at most 3 bytes long, so only the last 3 positions can start one; walk
  // back over continuation bytes to the lead byte.
  for (size_t back = 1; back <= 3 && back <= s.size(); ++back) {
    uint8_t b = uint8_t(s[s.size() - back]);
    if (b >= 0x80 && b <= 0xBF) continue;
    LeadInfo info = lead_info(b);
    bool proper_prefix = info.length > back && well_formed_prefix(s, s.size() - back, info) == back;
    return proper_prefix ? back : 0;
  }
  return 0;
}

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (uint8_t(s[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t n = valid_sequence_length(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string to_valid_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    size_t n = valid_sequence_length(s, i);
    if (n > 0) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out.append(kReplacementChar);
      i += invalid_subpart_length(s, i);
    }
  }
  return out;
}

uint32_t decode_code_point(std::string_view s, size_t& i) {
  uint8_t b0 = uint8_t(s[i]);
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  if (b0 < 0xE0) {
    uint32_t cp = (uint32_t(b0 & 0x1F) << 6) | (uint8_t(s[i + 1]) & 0x3F);
    i += 2;
    return cp;
  }
  if (b0 < 0xF0) {
    uint32_t cp = (uint32_t(b0 & 0x0F) << 12) | (uint32_t(uint8_t(s[i + 1]) & 0x3F) << 6) |
                  (uint8_t(s[i + 2]) & 0x3F);
    i += 3;
    return cp;
  }
  uint32_t cp = (uint32_t(b0 & 0x07) << 18) | (uint32_t(uint8_t(s[i + 1]) & 0x3F) << 12) |
                (uint32_t(uint8_t(s[i + 2]) & 0x3F) << 6) | (uint8_t(s[i + 3]) & 0x3F);
  i += 4;
  return cp;
}

void append_code_point(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

}  // namespace dsv4::tokenizer
