#include "tokenizer/bpe.h"

#include <limits>
#include <queue>

namespace dsv4::tokenizer {

namespace {

// Pieces up to this many bytes use the simple rescan (fast for words); longer ones (long runs of
// spaces or letters) use a heap so that the cost stays O(n log n).
constexpr size_t kShortPiece = 48;
constexpr uint32_t kNoMerge = std::numeric_limits<uint32_t>::max();

uint64_t mix(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdULL;
  k ^= k >> 33;
  return k;
}

}  // namespace

void BpeMerges::grow() {
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(old.empty() ? 1024 : old.size() * 2, Slot{});
  mask_ = slots_.size() - 1;
  for (const Slot& s : old) {
    if (s.key == kEmpty) continue;
    uint64_t h = mix(s.key) & mask_;
    while (slots_[h].key != kEmpty) h = (h + 1) & mask_;
    slots_[h] = s;
  }
}

bool BpeMerges::add(int32_t left, int32_t right, int32_t merged) {
  if ((n_merges_ + 1) * 2 > slots_.size()) grow();  // keep the load factor ≤ 1/2
  uint64_t k = key(left, right);
  uint64_t h = mix(k) & mask_;
  while (slots_[h].key != kEmpty) {
    if (slots_[h].key == k) return false;
    h = (h + 1) & mask_;
  }
  slots_[h] = Slot{k, uint32_t(n_merges_), merged};
  ++n_merges_;
  return true;
}

const BpeMerges::Slot* BpeMerges::find(int32_t left, int32_t right) const {
  if (slots_.empty()) return nullptr;
  uint64_t k = key(left, right);
  uint64_t h = mix(k) & mask_;
  while (true) {
    const Slot& s = slots_[h];
    if (s.key == k) return &s;
    if (s.key == kEmpty) return nullptr;
    h = (h + 1) & mask_;
  }
}

void BpeMerges::encode(std::string_view piece, std::vector<int32_t>& out) const {
  thread_local std::vector<int32_t> symbols;
  symbols.clear();
  for (unsigned char b : piece) symbols.push_back(byte_ids_[b]);
  if (symbols.size() > 1) {
    if (symbols.size() <= kShortPiece)
      encode_short(symbols);
    else
      encode_long(symbols);
  }
  out.insert(out.end(), symbols.begin(), symbols.end());
}

void BpeMerges::encode_short(std::vector<int32_t>& symbols) const {
  // ranks[k] = rank of the pair (symbols[k], symbols[k+1]); updated only around each merge.
  uint32_t ranks[kShortPiece];
  int32_t merged[kShortPiece];
  size_t n = symbols.size();
  for (size_t k = 0; k + 1 < n; ++k) {
    const Slot* s = find(symbols[k], symbols[k + 1]);
    ranks[k] = s ? s->rank : kNoMerge;
    merged[k] = s ? s->merged : -1;
  }
  auto refresh = [&](size_t k) {
    const Slot* s = find(symbols[k], symbols[k + 1]);
    ranks[k] = s ? s->rank : kNoMerge;
    merged[k] = s ? s->merged : -1;
  };
  while (n > 1) {
    size_t best = 0;
    for (size_t k = 1; k + 1 < n; ++k)
      if (ranks[k] < ranks[best]) best = k;  // strict: the leftmost of equal ranks wins
    if (ranks[best] == kNoMerge) break;
    symbols[best] = merged[best];
    for (size_t k = best + 1; k + 1 < n; ++k) symbols[k] = symbols[k + 1];
    for (size_t k = best + 1; k + 2 < n; ++k) ranks[k] = ranks[k + 1], merged[k] = merged[k + 1];
    --n;
    if (best > 0) refresh(best - 1);
    if (best + 1 < n) refresh(best);
  }
  symbols.resize(n);
}

void BpeMerges::encode_long(std::vector<int32_t>& symbols) const {
  // Linked list of symbols plus a min-heap of candidate merges ordered by (rank, position).
  // A popped candidate is stale if either symbol changed since it was pushed.
  size_t n = symbols.size();
  std::vector<int32_t> prev(n), next(n);
  for (size_t k = 0; k < n; ++k) prev[k] = int32_t(k) - 1, next[k] = k + 1 < n ? int32_t(k + 1) : -1;
  struct Candidate {
    uint32_t rank;
    int32_t pos;
    int32_t left, right;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto push = [&](int32_t pos) {
    if (pos < 0 || next[pos] < 0) return;
    int32_t nx = next[pos];
    if (const Slot* s = find(symbols[pos], symbols[nx]))
      heap.push({s->rank, pos, symbols[pos], symbols[nx]});
  };
  for (size_t k = 0; k + 1 < n; ++k) push(int32_t(k));
  std::vector<bool> alive(n, true);
  while (!heap.empty()) {
    Candidate c = heap.top();
    heap.pop();
    int32_t nx = next[c.pos];
    if (!alive[c.pos] || nx < 0 || symbols[c.pos] != c.left || symbols[nx] != c.right) continue;
    symbols[c.pos] = find(c.left, c.right)->merged;
    alive[nx] = false;
    next[c.pos] = next[nx];
    if (next[nx] >= 0) prev[next[nx]] = c.pos;
    push(prev[c.pos]);
    push(c.pos);
  }
  size_t w = 0;
  for (int32_t k = 0; k >= 0; k = next[k]) symbols[w++] = symbols[k];
  symbols.resize(w);
}

}  // namespace dsv4::tokenizer
