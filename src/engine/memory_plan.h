// The memory plan: what a model and its sequences will take, computed before anything is
// allocated and printed by `dsv4 inspect` and before generation (architecture.md §4.5).
#pragma once

#include <cstdint>
#include <string>

#include "core/row_format.h"
#include "model/config.h"
#include "model/weights.h"

namespace dsv4::engine {

struct MemoryPlan {
  size_t weight_bytes = 0;            // as stored (mapped, not copied)
  size_t running_weight_bytes = 0;    // those the engine runs (the MTP block only for drafts): a GPU holds these
  size_t state_fixed_bytes = 0;       // per sequence: rings and compressor carries
  double state_bytes_per_token = 0;   // per sequence: compressed rows and indexer keys, amortised
  size_t activation_bytes = 0;        // per prefill chunk, largest layer's working set (estimate)
  int64_t chunk_tokens = 0;
  StateLayout layout = StateLayout::f32;

  size_t state_bytes(int64_t n_tokens) const {
    return state_fixed_bytes + size_t(state_bytes_per_token * double(n_tokens));
  }
  std::string describe(int64_t context_tokens) const;
};

// Compressed rows and indexer keys take their size in `layout` (core/row_format.h); rings,
// carries and activations are fp32. With `drafts` (speculative decoding), sequences also keep the
// MTP block's ring and a chunk's final hc rows, and the engine runs the block's weights.
MemoryPlan plan_memory(const model::ModelConfig& config, size_t weight_bytes, int64_t chunk_tokens,
                       StateLayout layout, bool drafts = false);

// Refuses, naming every part and the shortfall, when the weights the engine runs, the state of
// `sequences` sequences at `context_tokens` each and one chunk's activations exceed the
// `available` bytes of `device` (Backend::device_memory_free(); 0, a backend working in host
// memory, is not checked). Called after the plan is printed and before anything is uploaded.
void require_fits(const MemoryPlan& plan, size_t available, const std::string& device, int64_t sequences,
                  int64_t context_tokens);

// The prefill chunk a run takes when none is asked for: the largest power of two up to `max_chunk`
// (and at least 64) whose activations fit beside the weights the engine runs and the state of
// `sequences` sequences at `context_tokens` in `available` bytes, so that memory stays bounded by
// the plan at any context. `max_chunk` when available is 0 (host memory, not planned); the
// smallest when none fits (require_fits then names the shortfall).
int64_t choose_chunk(const model::ModelConfig& config, StateLayout layout, size_t available, int64_t sequences,
                     int64_t context_tokens, int64_t max_chunk);

}  // namespace dsv4::engine
