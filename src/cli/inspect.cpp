// dsv4 inspect: the config, the layer schedule, tensor bytes by dtype and the memory plan.
#include <fmt/format.h>

#include <map>

#include "cli/common.h"
#include "engine/engine.h"
#include "engine/memory_plan.h"

namespace dsv4::cli {
namespace {

int run_inspect(const std::string& dir, int64_t context) {
  auto model = engine::Model::load(dir);  // validates every tensor
  const model::ModelConfig& c = model->config();
  fmt::print("{}\n", c.path);
  fmt::print("  vocab {}  hidden {}  layers {} (+{} MTP)  heads {} x {} (rope {})  q_lora {}\n", c.vocab_size,
             c.hidden_size, c.n_layers, c.n_mtp_layers, c.n_heads, c.head_dim, c.rope_head_dim, c.q_lora_rank);
  fmt::print("  output groups {} x {}  window {}  indexer {} x {} top-{}\n", c.o_groups, c.o_lora_rank,
             c.sliding_window, c.index_n_heads, c.index_head_dim, c.index_topk);
  fmt::print("  experts {} (+{} shared) top-{} width {}  hash layers {}  routed scale {}  swiglu limit {}\n",
             c.n_routed_experts, c.n_shared_experts, c.n_experts_per_tok, c.moe_intermediate_size, c.n_hash_layers,
             c.routed_scaling_factor, c.swiglu_limit);
  fmt::print("  hc {} streams, {} Sinkhorn iterations  rope theta {} / {}{}\n", c.hc_mult, c.hc_sinkhorn_iters,
             c.rope_theta, c.compress_rope_theta,
             c.yarn.enabled ? fmt::format(" (YaRN x{} from {})", c.yarn.factor, c.yarn.original_max_position) : "");
  fmt::print("layer schedule:\n");
  for (int64_t il = 0; il < c.n_layers + c.n_mtp_layers; ++il)
    fmt::print("  {:>4} {:<4} ratio {:>3}  {}\n", il < c.n_layers ? std::to_string(il) : "mtp",
               model::to_string(c.attn_kind(il)), c.ratio(il),
               il < c.n_layers && c.is_hash_layer(il) ? "hash-routed" : "score-routed");
  std::map<std::string, std::pair<size_t, size_t>> by_dtype;
  for (const auto& [name, t] : model->checkpoint().tensors()) {
    auto& [count, bytes] = by_dtype[model::to_string(t.dtype)];
    ++count, bytes += t.nbytes;
  }
  fmt::print("tensors by dtype:\n");
  for (const auto& [dtype, cb] : by_dtype) fmt::print("  {:<8} {:>7} tensors {:>16} bytes\n", dtype, cb.first, cb.second);
  fmt::print("{}", engine::plan_memory(c, model->checkpoint().total_bytes(), 512, StateLayout::compact).describe(context));
  return 0;
}

const bool inspect_registered = register_command({"inspect", "Validate a checkpoint and print its config, schedule and memory plan",
    [](CLI::App& app) -> std::function<int()> {
      auto dir = std::make_shared<std::string>(default_model_dir());
      auto context = std::make_shared<int64_t>(1 << 20);
      app.add_option("--model", *dir, "checkpoint folder")->capture_default_str();
      app.add_option("--context", *context, "context length for the state estimate")->capture_default_str();
      return [dir, context] { return run_inspect(*dir, *context); };
    }});

}  // namespace
}  // namespace dsv4::cli
