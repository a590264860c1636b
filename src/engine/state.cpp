#include "engine/state.h"

#include <algorithm>

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

size_t SequenceState::bytes() const {
  size_t n = 0;
  for (const LayerState& ls : layers)
    n += (ls.ring.size() + ls.compressor.a.size() + ls.compressor.s.size() + ls.index_compressor.a.size() +
          ls.index_compressor.s.size()) * sizeof(float) +
         ls.compressed.bytes_reserved() + ls.index_keys.bytes_reserved();
  return n;
}

}  // namespace dsv4::engine
