// RoPE frequency tables of the two layer kinds (architecture.md §3.0 "RoPE").
#pragma once

#include "backend/backend.h"
#include "model/config.h"

namespace dsv4::engine {

// f_i = 1 / base^(2i/d) in fp32; with YaRN the low/high correction range is blended as in §3.0
// (no magnitude scaling of cos/sin).
RopeFreqs make_rope_freqs(int64_t rope_dims, double base, const model::YarnScaling* yarn);

// The table for a layer: rope_theta for sliding-window layers and MTP, compress_rope_theta (+YaRN
// when configured) for CSA and HCA layers.
RopeFreqs layer_rope_freqs(const model::ModelConfig& config, model::AttnKind kind);

}  // namespace dsv4::engine
