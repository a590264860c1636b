// Prefix reuse (continuous batching's memory of past prompts): snapshots of sequence state keyed
// by the exact tokens that produced them, bounded by a byte budget with least-recently-used
// eviction. A new prompt resumes from the longest kept prefix of it instead of prefilling from 0.
//
// Chat makes this pay: the next turn's prompt extends the previous prompt (and, without
// thinking, the previous answer), so a snapshot at the end of each prompt and of each answer is
// where the next turn resumes. Snapshots every few hundred prompt tokens catch shared system
// prompts and long documents.
#pragma once

#include <cstdint>
#include <list>
#include <span>
#include <vector>

#include "engine/state.h"

namespace dsv4::engine {

class PrefixCache {
 public:
  explicit PrefixCache(size_t budget_bytes) : budget_bytes_(budget_bytes) {}

  // Keeps `seq`'s state, reached by running exactly `tokens` (tokens.size() == seq.n_past).
  // An entry with the same tokens is only marked as used; the oldest entries make room.
  void insert(std::span<const int32_t> tokens, const SequenceState& seq);

  // Restores into `seq` the longest kept strict prefix of `prompt` (at least one prompt token is
  // left to run, to get logits) and returns its length; 0 when none is kept (seq untouched).
  int64_t restore_longest_prefix(std::span<const int32_t> prompt, SequenceState& seq);

  size_t bytes() const { return bytes_; }
  size_t entries() const { return entries_.size(); }
  void clear();

 private:
  struct Entry {
    std::vector<int32_t> tokens;
    StateSnapshot snapshot;
  };
  size_t budget_bytes_;
  size_t bytes_ = 0;
  std::list<Entry> entries_;  // most recently used first
};

}  // namespace dsv4::engine
