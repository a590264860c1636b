#include "engine/prefix_cache.h"

#include <algorithm>

namespace dsv4::engine {

void PrefixCache::insert(std::span<const int32_t> tokens, const SequenceState& seq) {
  for (auto it = entries_.begin(); it != entries_.end(); ++it)
    if (std::ranges::equal(it->tokens, tokens)) {
      entries_.splice(entries_.begin(), entries_, it);
      return;
    }
  StateSnapshot snapshot = seq.snapshot();
  if (snapshot.bytes() > budget_bytes_) return;
  while (!entries_.empty() && bytes_ + snapshot.bytes() > budget_bytes_) {
    bytes_ -= entries_.back().snapshot.bytes();
    entries_.pop_back();
  }
  bytes_ += snapshot.bytes();
  entries_.push_front({std::vector<int32_t>(tokens.begin(), tokens.end()), std::move(snapshot)});
}

int64_t PrefixCache::restore_longest_prefix(std::span<const int32_t> prompt, SequenceState& seq) {
  auto best = entries_.end();
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    const size_t n = it->tokens.size();
    if (n < prompt.size() && (best == entries_.end() || n > best->tokens.size()) &&
        std::equal(it->tokens.begin(), it->tokens.end(), prompt.begin()))
      best = it;
  }
  if (best == entries_.end()) return 0;
  seq.restore(best->snapshot);
  entries_.splice(entries_.begin(), entries_, best);
  return seq.n_past;
}

void PrefixCache::clear() {
  entries_.clear();
  bytes_ = 0;
}

}  // namespace dsv4::engine
