#include "tokenizer/added_tokens.h"

namespace dsv4::tokenizer {

void AddedTokenMatcher::Trie::insert(std::string_view s, int32_t id) {
  if (s.empty()) return;
  first_byte_[static_cast<unsigned char>(s[0])] = true;
  uint32_t node = 0;
  for (unsigned char b : s) {
    uint32_t child = 0;
    for (auto& [byte, index] : nodes_[node].children)
      if (byte == b) child = index;
    if (child == 0) {
      child = uint32_t(nodes_.size());
      nodes_[node].children.push_back({b, child});
      nodes_.emplace_back();
    }
    node = child;
  }
  nodes_[node].id = id;
}

size_t AddedTokenMatcher::Trie::longest_at(std::string_view text, size_t pos, size_t end,
                                           int32_t& id) const {
  size_t best = 0;
  uint32_t node = 0;
  for (size_t i = pos; i < end; ++i) {
    uint32_t child = 0;
    for (auto& [byte, index] : nodes_[node].children)
      if (byte == static_cast<unsigned char>(text[i])) child = index;
    if (child == 0) break;
    node = child;
    if (nodes_[node].id >= 0) best = i + 1 - pos, id = nodes_[node].id;
  }
  return best;
}

void AddedTokenMatcher::add(std::string_view content, int32_t id, bool normalized) {
  (normalized ? normalized_ : raw_).insert(content, id);
}

void AddedTokenMatcher::split_with(const Trie& trie, std::string_view text, uint32_t begin,
                                   uint32_t end, std::vector<Segment>& out) {
  uint32_t gap = begin;
  for (uint32_t i = begin; i < end;) {
    int32_t id = -1;
    size_t len = trie.may_start(static_cast<unsigned char>(text[i])) ? trie.longest_at(text, i, end, id) : 0;
    if (len == 0) {
      ++i;
      continue;
    }
    if (gap < i) out.push_back({gap, i, -1});
    out.push_back({i, uint32_t(i + len), id});
    i = gap = uint32_t(i + len);
  }
  if (gap < end) out.push_back({gap, end, -1});
}

void AddedTokenMatcher::split(std::string_view text, uint32_t begin, uint32_t end,
                              std::vector<Segment>& out) const {
  if (normalized_.empty()) return split_with(raw_, text, begin, end, out);
  thread_local std::vector<Segment> first;
  first.clear();
  split_with(raw_, text, begin, end, first);
  for (const Segment& s : first) {
    if (s.id >= 0)
      out.push_back(s);
    else
      split_with(normalized_, text, s.begin, s.end, out);
  }
}

}  // namespace dsv4::tokenizer
