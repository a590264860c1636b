// The added-token split (tokenizer-and-chat.md §2.2 step 1): control-token strings inside text
// become their ids before any pre-tokenization, and BPE runs separately on the text between them.
//
// HF's AddedVocabulary matches leftmost-longest in two passes: first the tokens flagged
// `normalized: false` on the raw text, then the `normalized: true` ones on each remaining gap
// (after the normalizer, which V4 does not have). The two passes are kept because they can
// disagree with a single pass when a token of one kind overlaps a token of the other.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dsv4::tokenizer {

// A stretch of text [begin, end) when id < 0, else one added token spanning [begin, end).
struct Segment {
  uint32_t begin, end;
  int32_t id;
};

class AddedTokenMatcher {
 public:
  void add(std::string_view content, int32_t id, bool normalized);
  bool empty() const { return raw_.empty() && normalized_.empty(); }

  // Splits text[begin, end) into segments appended to out, in order, covering the range.
  void split(std::string_view text, uint32_t begin, uint32_t end, std::vector<Segment>& out) const;

 private:
  // A byte trie; children are kept in a flat vector per node (few tokens share long prefixes).
  class Trie {
   public:
    Trie() : nodes_(1) {}
    void insert(std::string_view s, int32_t id);
    bool empty() const { return nodes_.size() == 1; }
    // Longest token starting at text[pos] and ending ≤ end: its length and id, or length 0.
    size_t longest_at(std::string_view text, size_t pos, size_t end, int32_t& id) const;
    bool may_start(unsigned char b) const { return first_byte_[b]; }

   private:
    struct Node {
      std::vector<std::pair<unsigned char, uint32_t>> children;
      int32_t id = -1;
    };
    std::vector<Node> nodes_;
    bool first_byte_[256] = {};
  };

  static void split_with(const Trie& trie, std::string_view text, uint32_t begin, uint32_t end,
                         std::vector<Segment>& out);

  Trie raw_, normalized_;
};

}  // namespace dsv4::tokenizer
