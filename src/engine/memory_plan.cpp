#include "engine/memory_plan.h"

#include <fmt/format.h>

#include <algorithm>

#include "backend/backend.h"
#include "core/error.h"

namespace dsv4::engine {

static std::string human(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 4) bytes /= 1024.0, ++u;
  return fmt::format("{:.2f} {}", bytes, units[u]);
}

MemoryPlan plan_memory(const model::ModelConfig& c, size_t weight_bytes, int64_t chunk_tokens, StateLayout layout,
                       bool drafts) {
  MemoryPlan p;
  p.weight_bytes = weight_bytes;
  p.running_weight_bytes = model::expected_bytes(c, drafts);
  p.chunk_tokens = chunk_tokens;
  p.layout = layout;
  const double v = sizeof(float);
  const double row = double(RowFormat::attention(layout, int32_t(c.head_dim), int32_t(c.nope_head_dim())).bytes());
  const double key = double(RowFormat::index_key(layout, int32_t(c.index_head_dim)).bytes());
  for (int64_t il = 0; il < c.n_layers; ++il) {
    p.state_fixed_bytes += size_t(c.sliding_window * c.head_dim * v);
    switch (c.attn_kind(il)) {
      case model::AttnKind::swa: break;
      case model::AttnKind::csa:
        p.state_fixed_bytes += size_t(2 * 8 * 2 * (c.head_dim + c.index_head_dim) * v);  // a and s carries
        p.state_bytes_per_token += (row + key) / 4.0;
        break;
      case model::AttnKind::hca:
        p.state_fixed_bytes += size_t(2 * 128 * c.head_dim * v);
        p.state_bytes_per_token += row / 128.0;
        break;
    }
  }
  if (drafts)  // the MTP block's rings, and the final hc rows kept for it: a chunk's, and a step's
    p.state_fixed_bytes += size_t(double(c.n_mtp_layers * c.sliding_window * c.head_dim) * v +
                                  double((std::max<int64_t>(chunk_tokens, 1) + 2) * c.hc_mult * c.hidden_size) * v);
  // The largest per-chunk working set: the HC state in and out, q and attention output, the
  // indexer's scores of every visible key (the CUDA backend scores at most 2^26 per pass) and its
  // queries as the CUDA backend prepares them for compact keys (each head's int8 row padded to 128
  // dims in the exact kernel's lane order and again as the tensor-core kernel's image, the packed
  // FP4 row and per-head extras: under 3 bytes per padded dim), deepseek-tc's bf16 copy of the
  // compressed attention rows (CSA's at most, a quarter of the positions), and the MoE's gate, up
  // and output rows of each (token, expert) pair in one pass through the experts.
  constexpr int64_t kIndexerPaddedDim = 128;
  const int64_t T = std::max<int64_t>(chunk_tokens, 1);
  const double hc_state = double(T * c.hc_mult * c.hidden_size) * 2;
  const double scores = double(std::min<int64_t>(T * (c.max_position_embeddings / 4), int64_t(1) << 26));
  const double indexer_queries = double(T * c.index_n_heads * kIndexerPaddedDim * 3) / v;
  const double bf16_rows = double(c.max_position_embeddings / 4 * c.head_dim) * 2 / v;
  const double attn = double(T * c.n_heads * c.head_dim) * 2 + double(T * c.index_topk) +
                      double(T * (c.sliding_window + c.index_topk)) + scores + indexer_queries + bf16_rows;
  const double moe = double(std::min(T, Backend::kMaxMoeTokenChunk) * c.n_experts_per_tok *
                            (c.hidden_size + 2 * c.moe_intermediate_size));
  p.activation_bytes = size_t((hc_state + std::max(attn, moe)) * v);
  return p;
}

std::string MemoryPlan::describe(int64_t context_tokens) const {
  return fmt::format(
      "memory plan:\n"
      "  weights (mapped as stored)      {}\n"
      "  weights run (on a GPU: copied)  {}\n"
      "  state per sequence, fixed       {}\n"
      "  state per sequence, per token   {:.1f} B ({} rows)\n"
      "  state at {} tokens            {}\n"
      "  activations per chunk of {}     {}\n",
      human(double(weight_bytes)), human(double(running_weight_bytes)), human(double(state_fixed_bytes)), state_bytes_per_token, to_string(layout), context_tokens,
      human(double(state_bytes(context_tokens))), chunk_tokens, human(double(activation_bytes)));
}

void require_fits(const MemoryPlan& plan, size_t available, const std::string& device, int64_t sequences,
                  int64_t context_tokens) {
  if (available == 0) return;
  const size_t state = plan.state_bytes(context_tokens) * size_t(sequences);
  const size_t needed = plan.running_weight_bytes + state + plan.activation_bytes;
  if (needed <= available) return;
  fail(ErrorCode::out_of_memory,
       "does not fit on the {} device: weights {} + state of {} sequence(s) at {} tokens {} + activations of a "
       "{}-token chunk {} = {}, but {} are free: short by {}. Use fewer layers (synthetic), a shorter context, "
       "fewer sequences or a smaller chunk",
       device, human(double(plan.running_weight_bytes)), sequences, context_tokens, human(double(state)),
       plan.chunk_tokens, human(double(plan.activation_bytes)), human(double(needed)), human(double(available)),
       human(double(needed - available)));
}

int64_t choose_chunk(const model::ModelConfig& config, StateLayout layout, size_t available, int64_t sequences,
                     int64_t context_tokens, int64_t max_chunk) {
  constexpr int64_t kSmallest = 64;
  if (available == 0 || max_chunk <= kSmallest) return max_chunk;
  int64_t chunk = 1;
  while (chunk * 2 <= max_chunk) chunk *= 2;
  for (; chunk > kSmallest; chunk /= 2) {
    const MemoryPlan plan = plan_memory(config, 0, chunk, layout);
    const size_t state = plan.state_bytes(context_tokens) * size_t(sequences);
    if (plan.running_weight_bytes + state + plan.activation_bytes <= available) break;
  }
  return chunk;
}

}  // namespace dsv4::engine
