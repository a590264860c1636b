// Synthetic checkpoints: random weights in the official on-disk format for any config
// (architecture.md §2), from a seed. For benchmarks at real shapes (V4-Flash, V4-Pro, any number
// of layers) and for the full-vocabulary demo model that `dsv4 chat` runs before real weights are
// present. Not calibrated: they measure speed and exercise plumbing; their output means nothing.
#pragma once

#include <cstdint>
#include <string>

#include "model/safetensors.h"

namespace dsv4::model {

// config.json text of a named preset: "v4-flash" and "v4-pro" (the official configs of
// architecture.md §1.1 and §1.3) or "tiny-chat" (tiny widths, the real 129 280-token vocabulary).
std::string preset_config(const std::string& name);

// Replaces num_hidden_layers by `n_layers` and keeps the matching compress_ratios (plus the MTP's).
std::string with_layers(const std::string& config_text, int64_t n_layers);

// Writes DIR/config.json and the tensors bind_weights() expects for it, in `n_shards` files (with
// model.safetensors.index.json when more than one). Every tensor's values depend only on the
// seed and its name (not on the number of threads that fill them).
void write_synthetic_checkpoint(const std::string& config_text, uint64_t seed, const std::string& dir,
                                int n_shards);

// The same tensors (same generator, same values) in host memory, without files: a Checkpoint
// that owns them, for `dsv4 bench --synthetic`. Filled on all cores; 4 layers of V4-Flash
// (≈ 16 GB) take seconds.
Checkpoint synthetic_checkpoint(const std::string& config_text, uint64_t seed);

}  // namespace dsv4::model
