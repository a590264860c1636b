// Byte-level BPE (tokenizer-and-chat.md §2.4): turns one pre-tokenized piece into ids.
//
// The piece's UTF-8 bytes start as 256 single-byte symbols (GPT-2's byte→unicode alphabet, all
// in the vocab), then the adjacent pair with the lowest merge rank is merged, leftmost first,
// until no pair has a merge — HF's order. Merges are keyed by (left id, right id), so a step is
// one hash lookup; no strings are built.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

namespace dsv4::tokenizer {

class BpeMerges {
 public:
  BpeMerges() = default;
  // Byte b encodes to byte_ids[b] before any merge.
  void set_byte_ids(const std::array<int32_t, 256>& byte_ids) { byte_ids_ = byte_ids; }
  // Adds the merge of the next rank (call in file order). Returns false for a duplicate pair.
  bool add(int32_t left, int32_t right, int32_t merged);
  size_t size() const { return n_merges_; }

  // Appends the ids of `piece` (raw bytes) to out.
  void encode(std::string_view piece, std::vector<int32_t>& out) const;

 private:
  struct Slot {
    uint64_t key = kEmpty;
    uint32_t rank = 0;
    int32_t merged = -1;
  };
  static constexpr uint64_t kEmpty = ~uint64_t(0);
  static uint64_t key(int32_t left, int32_t right) {
    return (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
  }
  const Slot* find(int32_t left, int32_t right) const;
  void grow();
  void encode_short(std::vector<int32_t>& symbols) const;
  void encode_long(std::vector<int32_t>& symbols) const;

  std::array<int32_t, 256> byte_ids_{};
  std::vector<Slot> slots_;
  uint64_t mask_ = 0;
  size_t n_merges_ = 0;
};

}  // namespace dsv4::tokenizer
