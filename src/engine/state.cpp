#include "engine/state.h"

#include <algorithm>

#include "core/error.h"

namespace dsv4::engine {

void RowStore::append(const float* rows, int64_t n) {
  if (n == 0) return;
  const int64_t capacity = int64_t(buffer_.size()) / width_;
  if (n_ + n > capacity) {
    const int64_t grown = std::max({2 * capacity, n_ + n, int64_t(16)});
    Buffer bigger(*backend_, size_t(grown * width_));
    if (n_ > 0) backend_->copy(bigger.get(), buffer_.get(), size_t(n_ * width_));
    buffer_ = std::move(bigger);
  }
  backend_->copy(buffer_.get() + n_ * width_, rows, size_t(n * width_));
  n_ += n;
}

static CompressorState make_compressor_state(Backend& b, const model::CompressorWeights& cw) {
  const size_t n = size_t(cw.carry_rows() * cw.width());
  return {Buffer(b, n), Buffer(b, n)};
}

SequenceState::SequenceState(Backend& backend, const model::ModelConfig& c, const model::Weights& weights)
    : backend_(backend), weights_(weights) {
  for (const model::LayerWeights& lw : weights.layers) {
    LayerState ls;
    ls.ring = Buffer(backend, size_t(c.sliding_window * c.head_dim));
    if (lw.attn.compressor) {
      ls.compressed = RowStore(backend, c.head_dim);
      ls.compressor = make_compressor_state(backend, *lw.attn.compressor);
    }
    if (lw.attn.indexer) {
      ls.index_keys = RowStore(backend, c.index_head_dim);
      ls.index_compressor = make_compressor_state(backend, lw.attn.indexer->compressor);
    }
    layers.push_back(std::move(ls));
  }
  reset();
}

void SequenceState::reset() {
  n_past = 0;
  for (size_t il = 0; il < layers.size(); ++il) {
    LayerState& ls = layers[il];
    const model::LayerWeights& lw = weights_.layers[il];
    if (lw.attn.compressor) {
      ls.compressed.clear();
      backend_.compressor_reset(*lw.attn.compressor, ls.compressor.carry());
    }
    if (lw.attn.indexer) {
      ls.index_keys.clear();
      backend_.compressor_reset(lw.attn.indexer->compressor, ls.index_compressor.carry());
    }
  }
}

namespace {

Buffer clone(Backend& b, const float* src, size_t n) {
  Buffer copy(b, n);
  if (n > 0) b.copy(copy.get(), src, n);
  return copy;
}

Buffer clone(Backend& b, const Buffer& src) { return clone(b, src.get(), src.size()); }

}  // namespace

StateSnapshot SequenceState::snapshot() const {
  StateSnapshot snap;
  snap.n_past = n_past;
  for (const LayerState& ls : layers) {
    LayerSnapshot l;
    l.ring = clone(backend_, ls.ring);
    l.n_compressed = ls.compressed.rows();
    l.compressed = clone(backend_, ls.compressed.data(), size_t(ls.compressed.rows() * ls.compressed.width()));
    l.n_index_keys = ls.index_keys.rows();
    l.index_keys = clone(backend_, ls.index_keys.data(), size_t(ls.index_keys.rows() * ls.index_keys.width()));
    l.compressor_a = clone(backend_, ls.compressor.a);
    l.compressor_s = clone(backend_, ls.compressor.s);
    l.index_compressor_a = clone(backend_, ls.index_compressor.a);
    l.index_compressor_s = clone(backend_, ls.index_compressor.s);
    snap.bytes += (l.ring.size() + l.compressed.size() + l.index_keys.size() + l.compressor_a.size() +
                   l.compressor_s.size() + l.index_compressor_a.size() + l.index_compressor_s.size()) *
                  sizeof(float);
    snap.layers.push_back(std::move(l));
  }
  return snap;
}

void SequenceState::restore(const StateSnapshot& snap) {
  DSV4_CHECK(snap.layers.size() == layers.size(), "snapshot of {} layers, sequence has {}", snap.layers.size(),
             layers.size());
  n_past = snap.n_past;
  for (size_t il = 0; il < layers.size(); ++il) {
    LayerState& ls = layers[il];
    const LayerSnapshot& l = snap.layers[il];
    backend_.copy(ls.ring.get(), l.ring.get(), ls.ring.size());
    ls.compressed.clear();
    ls.compressed.append(l.compressed.get(), l.n_compressed);
    ls.index_keys.clear();
    ls.index_keys.append(l.index_keys.get(), l.n_index_keys);
    auto restore_carry = [&](CompressorState& dst, const Buffer& a, const Buffer& s) {
      if (dst.a.size() == 0) return;
      backend_.copy(dst.a.get(), a.get(), dst.a.size());
      backend_.copy(dst.s.get(), s.get(), dst.s.size());
    };
    restore_carry(ls.compressor, l.compressor_a, l.compressor_s);
    restore_carry(ls.index_compressor, l.index_compressor_a, l.index_compressor_s);
  }
}

size_t SequenceState::bytes() const {
  size_t n = 0;
  for (const LayerState& ls : layers)
    n += (ls.ring.size() + ls.compressor.a.size() + ls.compressor.s.size() + ls.index_compressor.a.size() +
          ls.index_compressor.s.size()) * sizeof(float) +
         ls.compressed.bytes_reserved() + ls.index_keys.bytes_reserved();
  return n;
}

}  // namespace dsv4::engine
