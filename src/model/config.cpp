#include "model/config.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace dsv4::model {

using nlohmann::json;

const char* to_string(AttnKind kind) {
  switch (kind) {
    case AttnKind::swa: return "swa";
    case AttnKind::csa: return "csa";
    case AttnKind::hca: return "hca";
  }
  return "?";
}

AttnKind ModelConfig::attn_kind(int64_t il) const {
  const int r = ratio(il);
  return r == 0 ? AttnKind::swa : (r == 4 ? AttnKind::csa : AttnKind::hca);
}

namespace {

// Field readers that name the field on every failure.
class Fields {
 public:
  Fields(const json& j, std::string path) : j_(j), path_(std::move(path)) {}

  const json& required(const char* key) const {
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) fail(ErrorCode::invalid_input, "{}: missing field '{}'", path_, key);
    return *it;
  }
  int64_t integer(const char* key) const {
    const json& v = required(key);
    if (!v.is_number_integer())
      fail(ErrorCode::invalid_input, "{}: field '{}' must be an integer, got {}", path_, key, v.dump());
    return v.get<int64_t>();
  }
  int64_t positive(const char* key) const {
    const int64_t v = integer(key);
    if (v <= 0) fail(ErrorCode::invalid_input, "{}: field '{}' must be > 0, got {}", path_, key, v);
    return v;
  }
  int64_t integer_or(const char* key, int64_t fallback) const {
    return j_.contains(key) && !j_[key].is_null() ? integer(key) : fallback;
  }
  double number(const char* key) const {
    const json& v = required(key);
    if (!v.is_number()) fail(ErrorCode::invalid_input, "{}: field '{}' must be a number, got {}", path_, key, v.dump());
    return v.get<double>();
  }
  double number_or(const char* key, double fallback) const {
    return j_.contains(key) && !j_[key].is_null() ? number(key) : fallback;
  }
  std::string string_or(const char* key, const std::string& fallback) const {
    if (!j_.contains(key) || j_[key].is_null()) return fallback;
    if (!j_[key].is_string()) fail(ErrorCode::invalid_input, "{}: field '{}' must be a string", path_, key);
    return j_[key].get<std::string>();
  }
  bool boolean_or(const char* key, bool fallback) const {
    if (!j_.contains(key) || j_[key].is_null()) return fallback;
    if (!j_[key].is_boolean()) fail(ErrorCode::invalid_input, "{}: field '{}' must be true or false", path_, key);
    return j_[key].get<bool>();
  }
  const std::string& path() const { return path_; }

 private:
  const json& j_;
  std::string path_;
};

void expect(bool ok, const std::string& path, const std::string& message) {
  if (!ok) fail(ErrorCode::unsupported, "{}: {}", path, message);
}

}  // namespace

ModelConfig parse_config(const std::string& text, const std::string& path) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    fail(ErrorCode::invalid_input, "{}: malformed JSON: {}", path, e.what());
  }
  if (!j.is_object()) fail(ErrorCode::invalid_input, "{}: expected a JSON object", path);
  for (const char* key : {"engram_num_heads", "kv_source_layers", "index_source_layers"})
    if (j.contains(key))
      fail(ErrorCode::unsupported,
           "{}: has '{}': this looks like a DeepSeek V4.1 checkpoint, a different architecture "
           "(architecture.md, header)", path, key);
  const Fields f(j, path);
  const std::string model_type = f.string_or("model_type", "");
  expect(model_type == "deepseek_v4", path, fmt::format("model_type '{}', expected 'deepseek_v4'", model_type));

  ModelConfig c;
  c.path = path;
  c.vocab_size = f.positive("vocab_size");
  c.hidden_size = f.positive("hidden_size");
  c.n_layers = f.positive("num_hidden_layers");
  c.n_mtp_layers = f.integer_or("num_nextn_predict_layers", 0);
  c.n_heads = f.positive("num_attention_heads");
  c.head_dim = f.positive("head_dim");
  c.rope_head_dim = f.positive("qk_rope_head_dim");
  c.q_lora_rank = f.positive("q_lora_rank");
  c.o_groups = f.positive("o_groups");
  c.o_lora_rank = f.positive("o_lora_rank");
  c.sliding_window = f.positive("sliding_window");
  c.index_n_heads = f.positive("index_n_heads");
  c.index_head_dim = f.positive("index_head_dim");
  c.index_topk = f.positive("index_topk");
  c.n_routed_experts = f.positive("n_routed_experts");
  c.n_shared_experts = f.integer("n_shared_experts");
  c.n_experts_per_tok = f.positive("num_experts_per_tok");
  c.moe_intermediate_size = f.positive("moe_intermediate_size");
  c.n_hash_layers = f.integer("num_hash_layers");
  c.routed_scaling_factor = f.number("routed_scaling_factor");
  c.swiglu_limit = f.number("swiglu_limit");
  c.norm_topk_prob = f.boolean_or("norm_topk_prob", true);
  c.hc_mult = f.positive("hc_mult");
  c.hc_sinkhorn_iters = f.positive("hc_sinkhorn_iters");
  c.hc_eps = f.number("hc_eps");
  c.rms_norm_eps = f.number("rms_norm_eps");
  c.rope_theta = f.number("rope_theta");
  c.compress_rope_theta = f.number("compress_rope_theta");
  c.max_position_embeddings = f.positive("max_position_embeddings");
  c.bos_token_id = f.integer_or("bos_token_id", 0);
  c.eos_token_id = f.integer_or("eos_token_id", 1);

  const int64_t kv_heads = f.integer_or("num_key_value_heads", 1);
  expect(kv_heads == 1, path, fmt::format("num_key_value_heads {}, expected 1 (one shared K=V head, §3.3)", kv_heads));
  const std::string scoring = f.string_or("scoring_func", "sqrtsoftplus");
  expect(scoring == "sqrtsoftplus", path, fmt::format("scoring_func '{}', expected 'sqrtsoftplus' (§3.6)", scoring));
  const std::string act = f.string_or("hidden_act", "silu");
  expect(act == "silu", path, fmt::format("hidden_act '{}', expected 'silu'", act));
  expect(c.norm_topk_prob, path, "norm_topk_prob false is not supported (§3.6 renormalises the weights)");

  const std::string expert_dtype = f.string_or("expert_dtype", "fp4");
  expect(expert_dtype == "fp4" || expert_dtype == "fp8", path,
         fmt::format("expert_dtype '{}', expected 'fp4' or 'fp8'", expert_dtype));
  c.expert_dtype = expert_dtype == "fp4" ? ExpertDtype::fp4 : ExpertDtype::fp8;

  if (j.contains("quantization_config") && !j["quantization_config"].is_null()) {
    const json& q = j["quantization_config"];
    const Fields qf(q, path + ": quantization_config");
    const std::string fmt_name = qf.string_or("fmt", "e4m3");
    expect(fmt_name == "e4m3", path, fmt::format("quantization_config.fmt '{}', expected 'e4m3'", fmt_name));
    if (q.contains("weight_block_size"))
      expect(q["weight_block_size"] == json::array({128, 128}), path,
             fmt::format("quantization_config.weight_block_size {}, expected [128, 128]",
                         q["weight_block_size"].dump()));
  }

  const json& ratios = f.required("compress_ratios");
  if (!ratios.is_array()) fail(ErrorCode::invalid_input, "{}: field 'compress_ratios' must be an array", path);
  for (const json& r : ratios) {
    if (!r.is_number_integer() || (r.get<int>() != 0 && r.get<int>() != 4 && r.get<int>() != 128))
      fail(ErrorCode::unsupported, "{}: compress_ratios entry {} is not 0, 4 or 128 (§1.1)", path, r.dump());
    c.compress_ratios.push_back(r.get<int>());
  }
  if (int64_t(c.compress_ratios.size()) != c.n_layers + c.n_mtp_layers)
    fail(ErrorCode::invalid_input, "{}: compress_ratios has {} entries, expected num_hidden_layers + "
         "num_nextn_predict_layers = {}", path, c.compress_ratios.size(), c.n_layers + c.n_mtp_layers);
  for (int64_t m = 0; m < c.n_mtp_layers; ++m)
    expect(c.ratio(c.mtp_layer_index(m)) == 0, path, "an MTP block must be sliding-window only (ratio 0)");

  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    const json& rs = j["rope_scaling"];
    const Fields rf(rs, path + ": rope_scaling");
    const std::string type = rf.string_or("type", rf.string_or("rope_type", ""));
    expect(type == "yarn", path, fmt::format("rope_scaling type '{}', expected 'yarn'", type));
    c.yarn.enabled = true;
    c.yarn.factor = rf.number("factor");
    c.yarn.original_max_position = rf.positive("original_max_position_embeddings");
    c.yarn.beta_fast = rf.number_or("beta_fast", 32.0);
    c.yarn.beta_slow = rf.number_or("beta_slow", 1.0);
  }

  // Shape rules the numerics rely on (§3.0, §5).
  auto require = [&](bool ok, const std::string& what) {
    if (!ok) fail(ErrorCode::unsupported, "{}: {}", path, what);
  };
  require(c.rope_head_dim % 2 == 0 && c.rope_head_dim <= c.head_dim, "qk_rope_head_dim must be even and <= head_dim");
  require(c.rope_head_dim <= c.index_head_dim, "qk_rope_head_dim must be <= index_head_dim");
  require(c.nope_head_dim() % 64 == 0, "head_dim - qk_rope_head_dim must be a multiple of 64 (KV FP8 blocks, §3.3)");
  require((c.index_head_dim & (c.index_head_dim - 1)) == 0 && c.index_head_dim % 32 == 0,
          "index_head_dim must be a power of two >= 32 (Hadamard, FP4 blocks, §3.5)");
  require(c.n_heads % c.o_groups == 0, "num_attention_heads must be a multiple of o_groups");
  for (auto [name, k] : {std::pair{"hidden_size", c.hidden_size}, {"q_lora_rank", c.q_lora_rank},
                         {"moe_intermediate_size", c.moe_intermediate_size},
                         {"o_groups * o_lora_rank", c.o_groups * c.o_lora_rank}})
    require(k % 128 == 0, fmt::format("{} = {} must be a multiple of 128 (FP8 activation blocks, §3.0)", name, k));
  require(c.n_experts_per_tok <= c.n_routed_experts, "num_experts_per_tok must be <= n_routed_experts");
  require(c.n_hash_layers <= c.n_layers, "num_hash_layers must be <= num_hidden_layers");
  require(c.n_shared_experts <= 1, "at most one shared expert is supported");
  return c;
}

ModelConfig load_config(const std::string& path) {
  std::filesystem::path p(path);
  if (std::filesystem::is_directory(p)) p /= "config.json";
  std::ifstream in(p, std::ios::binary);
  if (!in) fail(ErrorCode::not_found, "{}: cannot open", p.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_config(ss.str(), p.string());
}

}  // namespace dsv4::model
