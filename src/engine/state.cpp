#include "engine/state.h"

#include <algorithm>

#include "core/error.h"

namespace dsv4::engine {

float* RowStore::grow_to(int64_t rows) {
  const int64_t stride = format_.stride, capacity = int64_t(buffer_.size()) / stride;
  if (rows > capacity) {
    const int64_t grown = std::max({2 * capacity, rows, int64_t(16)});
    Buffer bigger(*backend_, size_t(grown * stride));
    if (n_ > 0) backend_->copy(bigger.get(), buffer_.get(), size_t(n_ * stride));
    buffer_ = std::move(bigger);
  }
  return buffer_.get() + n_ * stride;
}

void RowStore::append(const float* rows, int64_t n) {
  if (n == 0) return;
  backend_->pack_rows(format_, rows, n, grow_to(n_ + n));
  n_ += n;
}

void RowStore::append_stored(const float* stored, int64_t n) {
  if (n == 0) return;
  backend_->copy(grow_to(n_ + n), stored, size_t(n * format_.stride));
  n_ += n;
}

void RowStore::repeat_to(int64_t n) {
  DSV4_CHECK(n_ > 0 || n == 0, "repeat_to: no rows to repeat");
  grow_to(n);
  while (n_ < n) {
    const int64_t k = std::min(n_, n - n_);  // copies [0, k) after the rows: never overlapping
    backend_->copy(buffer_.get() + n_ * format_.stride, buffer_.get(), size_t(k * format_.stride));
    n_ += k;
  }
}

static CompressorState make_compressor_state(Backend& b, const model::CompressorWeights& cw) {
  const size_t n = size_t(cw.carry_rows() * cw.width());
  return {Buffer(b, n), Buffer(b, n)};
}

// f(weights, carry, emitted rows) for each compressor of a layer: the main one, then the indexer's.
template <class Layer, class F>
static void for_each_compressor(const model::LayerWeights& lw, Layer& ls, F f) {
  if (lw.attn.compressor) f(*lw.attn.compressor, ls.compressor, ls.compressed);
  if (lw.attn.indexer) f(lw.attn.indexer->compressor, ls.index_compressor, ls.index_keys);
}

// An overlapping compressor's carry holds two windows (carry_rows() = 2 · ratio): when position q
// completes the current one, it moves to the first `ratio` rows (cpu/compressor.cpp).
static bool moves_window(const model::CompressorWeights& cw, int64_t q) {
  return cw.carry_rows() == 2 * cw.ratio && (q + 1) % cw.ratio == 0;
}

SequenceState::SequenceState(Backend& backend, const model::ModelConfig& c, const model::Weights& weights,
                             StateLayout layout, bool drafts)
    : backend_(backend), weights_(weights), layout_(layout) {
  if (layout == StateLayout::compact && !quantizes(backend.numerics()))
    fail(ErrorCode::invalid_input,
         "the compact state layout holds the deepseek numerics' FP8/FP4 rows exactly; with {} numerics use the f32 "
         "layout", to_string(backend.numerics()));
  const RowFormat row = RowFormat::attention(layout, int32_t(c.head_dim), int32_t(c.nope_head_dim()));
  const RowFormat key = RowFormat::index_key(layout, int32_t(c.index_head_dim));
  for (const model::LayerWeights& lw : weights.layers) {
    LayerState ls;
    ls.ring = Buffer(backend, size_t(c.sliding_window * c.head_dim));
    if (lw.attn.compressor) {
      ls.compressed = RowStore(backend, row);
      ls.compressor = make_compressor_state(backend, *lw.attn.compressor);
    }
    if (lw.attn.indexer) {
      ls.index_keys = RowStore(backend, key);
      ls.index_compressor = make_compressor_state(backend, lw.attn.indexer->compressor);
    }
    layers.push_back(std::move(ls));
  }
  if (drafts) {
    if (weights.mtp.empty()) fail(ErrorCode::invalid_input, "drafting needs the checkpoint's MTP block; it has none");
    draft = std::make_unique<DraftState>();
    draft->hidden = RowStore(backend, RowFormat::plain(int32_t(c.hc_mult * c.hidden_size)));
    for (size_t m = 0; m < weights.mtp.size(); ++m) {
      LayerState ls;
      ls.ring = Buffer(backend, size_t(c.sliding_window * c.head_dim));
      draft->layers.push_back(std::move(ls));
    }
  }
  reset();
}

LayerState& SequenceState::layer(int64_t il) {
  if (il < int64_t(layers.size())) return layers[size_t(il)];
  DSV4_CHECK(draft && il - int64_t(layers.size()) < int64_t(draft->layers.size()), "layer {}: no such state", il);
  return draft->layers[size_t(il) - layers.size()];
}

void SequenceState::reset() {
  n_past = 0;
  for (size_t il = 0; il < layers.size(); ++il)
    for_each_compressor(weights_.layers[il], layers[il],
                        [&](const model::CompressorWeights& cw, CompressorState& carry, RowStore& rows) {
                          rows.clear();
                          backend_.compressor_reset(cw, carry.carry());
                        });
  if (draft) draft->n_past = 0, draft->clear_pending();
}

void SequenceState::reserve(int64_t n_tokens) {
  for (size_t il = 0; il < layers.size(); ++il)
    for_each_compressor(weights_.layers[il], layers[il],
                        [&](const model::CompressorWeights& cw, CompressorState&, RowStore& rows) {
                          rows.reserve(n_tokens / cw.ratio);
                        });
}

UndoPoint SequenceState::undo_point(int64_t position) const {
  UndoPoint point;
  point.position = position;
  for (size_t il = 0; il < layers.size(); ++il)
    for_each_compressor(weights_.layers[il], layers[il],
                        [&](const model::CompressorWeights& cw, const CompressorState& carry, const RowStore&) {
                          if (!moves_window(cw, position)) return;
                          const size_t n = size_t(cw.ratio * cw.width());  // the previous window's rows
                          Buffer saved(backend_, 2 * n);
                          backend_.copy(saved.get(), carry.a.get(), n);
                          backend_.copy(saved.get() + n, carry.s.get(), n);
                          point.previous_windows.push_back(std::move(saved));
                        });
  return point;
}

void SequenceState::undo(const UndoPoint& point) {
  DSV4_CHECK(n_past == point.position + 1, "undo: the sequence is at position {}, the undo point is for {}", n_past,
             point.position);
  n_past = point.position;
  size_t next_saved = 0;
  for (size_t il = 0; il < layers.size(); ++il)
    for_each_compressor(weights_.layers[il], layers[il],
                        [&](const model::CompressorWeights& cw, CompressorState& carry, RowStore& rows) {
                          rows.truncate(n_past / cw.ratio);
                          if (!moves_window(cw, point.position)) return;
                          const size_t n = size_t(cw.ratio * cw.width());  // the previous window's rows
                          const Buffer& saved = point.previous_windows[next_saved++];
                          backend_.copy(carry.a.get(), saved.get(), n);
                          backend_.copy(carry.s.get(), saved.get() + n, n);
                        });
  if (draft) {
    DSV4_CHECK(draft->n_past <= n_past, "undo: the MTP block already ran position {}", n_past);
    if (draft->n_past + draft->pending() > n_past) draft->tokens.pop_back(), draft->hidden.truncate(draft->pending());
  }
}

namespace {

Buffer clone(Backend& b, const float* src, size_t n) {
  Buffer copy(b, n);
  if (n > 0) b.copy(copy.get(), src, n);
  return copy;
}

Buffer clone(Backend& b, const Buffer& src) { return clone(b, src.get(), src.size()); }

// A snapshot may come from a file (state_file.h), so everything restore() relies on is checked
// against this sequence before anything is copied: a refused snapshot leaves the sequence as it was.
void check_fits(const StateSnapshot& snap, const std::vector<LayerState>& layers, const model::Weights& weights) {
  if (snap.layers.size() != layers.size())
    fail(ErrorCode::invalid_input, "snapshot of {} layers, the sequence has {}", snap.layers.size(), layers.size());
  if (snap.n_past < 0) fail(ErrorCode::invalid_input, "snapshot at position {}", snap.n_past);
  auto expect_floats = [](size_t il, const char* what, size_t got, size_t want) {
    if (got != want)
      fail(ErrorCode::invalid_input, "snapshot layer {}: {} of {} floats, the sequence needs {}", il, what, got, want);
  };
  // One compressed row (and indexer key) per `ratio` tokens completed (§4.2).
  auto expect_rows = [&](size_t il, const char* what, int64_t got, const model::CompressorWeights* cw) {
    const int64_t want = cw ? snap.n_past / cw->ratio : 0;
    if (got != want)
      fail(ErrorCode::invalid_input, "snapshot layer {}: {} {} at position {}, the sequence expects {}", il, got, what,
           snap.n_past, want);
  };
  for (size_t il = 0; il < layers.size(); ++il) {
    const LayerState& ls = layers[il];
    const LayerSnapshot& l = snap.layers[il];
    const model::AttentionWeights& attn = weights.layers[il].attn;
    expect_floats(il, "ring", l.ring.size(), ls.ring.size());
    expect_rows(il, "compressed rows", l.n_compressed, attn.compressor ? &*attn.compressor : nullptr);
    expect_floats(il, "compressed rows", l.compressed.size(), size_t(l.n_compressed * ls.compressed.format().stride));
    expect_rows(il, "indexer keys", l.n_index_keys, attn.indexer ? &attn.indexer->compressor : nullptr);
    expect_floats(il, "indexer keys", l.index_keys.size(), size_t(l.n_index_keys * ls.index_keys.format().stride));
    expect_floats(il, "compressor carry a", l.compressor_a.size(), ls.compressor.a.size());
    expect_floats(il, "compressor carry s", l.compressor_s.size(), ls.compressor.s.size());
    expect_floats(il, "indexer compressor carry a", l.index_compressor_a.size(), ls.index_compressor.a.size());
    expect_floats(il, "indexer compressor carry s", l.index_compressor_s.size(), ls.index_compressor.s.size());
  }
}

// The MTP block's part of a snapshot against the drafting sequence's DraftState, checked as above.
void check_draft_fits(const DraftSnapshot& d, const DraftState& draft, int64_t n_past) {
  if (d.rings.size() != draft.layers.size())
    fail(ErrorCode::invalid_input, "snapshot of {} MTP blocks, the sequence has {}", d.rings.size(), draft.layers.size());
  for (size_t i = 0; i < d.rings.size(); ++i)
    if (d.rings[i].size() != draft.layers[i].ring.size())
      fail(ErrorCode::invalid_input, "snapshot MTP block {}: ring of {} floats, the sequence needs {}", i,
           d.rings[i].size(), draft.layers[i].ring.size());
  if (d.n_past < 0 || d.n_past + int64_t(d.tokens.size()) != n_past)
    fail(ErrorCode::invalid_input, "snapshot MTP block at position {} with {} waiting, the state is at {}", d.n_past,
         d.tokens.size(), n_past);
  const size_t want = d.tokens.size() * size_t(draft.hidden.format().stride);
  if (d.hidden.size() != want)
    fail(ErrorCode::invalid_input, "snapshot MTP block: {} floats of waiting rows, the sequence needs {}",
         d.hidden.size(), want);
}

}  // namespace

void SequenceState::repeat_to(int64_t n_tokens) {
  DSV4_CHECK(n_tokens >= n_past, "repeat_to: {} tokens is less than the {} held", n_tokens, n_past);
  for (size_t il = 0; il < layers.size(); ++il)
    for_each_compressor(weights_.layers[il], layers[il],
                        [&](const model::CompressorWeights& cw, CompressorState&, RowStore& rows) {
                          rows.repeat_to(n_tokens / cw.ratio);
                        });
  n_past = n_tokens;
  if (draft) draft->n_past = n_past, draft->clear_pending();
}

size_t LayerSnapshot::bytes() const {
  size_t n = 0;
  for (const Buffer* b : {&ring, &compressed, &index_keys, &compressor_a, &compressor_s, &index_compressor_a,
                          &index_compressor_s})
    n += b->size() * sizeof(float);
  return n;
}

size_t DraftSnapshot::bytes() const {
  size_t n = hidden.size() * sizeof(float) + tokens.size() * sizeof(int32_t);
  for (const Buffer& ring : rings) n += ring.size() * sizeof(float);
  return n;
}

size_t StateSnapshot::bytes() const {
  size_t n = draft ? draft->bytes() : 0;
  for (const LayerSnapshot& l : layers) n += l.bytes();
  return n;
}

StateSnapshot SequenceState::snapshot() const {
  StateSnapshot snap;
  snap.n_past = n_past;
  for (const LayerState& ls : layers) {
    LayerSnapshot l;
    l.ring = clone(backend_, ls.ring);
    l.n_compressed = ls.compressed.rows();
    l.compressed = clone(backend_, ls.compressed.data(), ls.compressed.stored_floats());
    l.n_index_keys = ls.index_keys.rows();
    l.index_keys = clone(backend_, ls.index_keys.data(), ls.index_keys.stored_floats());
    l.compressor_a = clone(backend_, ls.compressor.a);
    l.compressor_s = clone(backend_, ls.compressor.s);
    l.index_compressor_a = clone(backend_, ls.index_compressor.a);
    l.index_compressor_s = clone(backend_, ls.index_compressor.s);
    snap.layers.push_back(std::move(l));
  }
  if (draft) {
    DraftSnapshot d;
    for (const LayerState& ls : draft->layers) d.rings.push_back(clone(backend_, ls.ring));
    d.n_past = draft->n_past;
    d.tokens = draft->tokens;
    d.hidden = clone(backend_, draft->hidden.data(), draft->hidden.stored_floats());
    snap.draft = std::move(d);
  }
  return snap;
}

void SequenceState::restore(const StateSnapshot& snap) {
  check_fits(snap, layers, weights_);
  if (draft && snap.draft) check_draft_fits(*snap.draft, *draft, snap.n_past);
  n_past = snap.n_past;
  for (size_t il = 0; il < layers.size(); ++il) {
    LayerState& ls = layers[il];
    const LayerSnapshot& l = snap.layers[il];
    backend_.copy(ls.ring.get(), l.ring.get(), ls.ring.size());
    ls.compressed.clear();
    ls.compressed.append_stored(l.compressed.get(), l.n_compressed);
    ls.index_keys.clear();
    ls.index_keys.append_stored(l.index_keys.get(), l.n_index_keys);
    auto restore_carry = [&](CompressorState& dst, const Buffer& a, const Buffer& s) {
      if (dst.a.size() == 0) return;
      backend_.copy(dst.a.get(), a.get(), dst.a.size());
      backend_.copy(dst.s.get(), s.get(), dst.s.size());
    };
    restore_carry(ls.compressor, l.compressor_a, l.compressor_s);
    restore_carry(ls.index_compressor, l.index_compressor_a, l.index_compressor_s);
  }
  if (!draft) return;
  draft->clear_pending();
  if (!snap.draft) {
    draft->n_past = n_past;
    return;
  }
  const DraftSnapshot& d = *snap.draft;
  for (size_t i = 0; i < d.rings.size(); ++i)
    backend_.copy(draft->layers[i].ring.get(), d.rings[i].get(), d.rings[i].size());
  draft->n_past = d.n_past;
  draft->tokens = d.tokens;
  draft->hidden.append_stored(d.hidden.get(), int64_t(d.tokens.size()));
}

size_t SequenceState::bytes() const {
  size_t n = 0;
  for (const LayerState& ls : layers)
    n += (ls.ring.size() + ls.compressor.a.size() + ls.compressor.s.size() + ls.index_compressor.a.size() +
          ls.index_compressor.s.size()) * sizeof(float) +
         ls.compressed.bytes_reserved() + ls.index_keys.bytes_reserved();
  if (draft) {
    for (const LayerState& ls : draft->layers) n += ls.ring.size() * sizeof(float);
    n += draft->hidden.bytes_reserved();
  }
  return n;
}

}  // namespace dsv4::engine
