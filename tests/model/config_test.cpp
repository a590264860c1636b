// config.json parsing: every size read from the file, strict errors naming the field.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/config.h"

namespace dsv4::model {

// A small valid config in the official key names (architecture.md §1.1).
nlohmann::json tiny_config() {
  return nlohmann::json::parse(R"({
    "model_type": "deepseek_v4", "vocab_size": 256, "hidden_size": 256, "num_hidden_layers": 3,
    "num_nextn_predict_layers": 1, "num_attention_heads": 4, "head_dim": 128, "qk_rope_head_dim": 64,
    "q_lora_rank": 128, "o_groups": 2, "o_lora_rank": 128, "sliding_window": 128,
    "compress_ratios": [0, 4, 128, 0], "index_n_heads": 4, "index_head_dim": 128, "index_topk": 32,
    "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
    "num_hash_layers": 1, "routed_scaling_factor": 1.5, "swiglu_limit": 10.0, "hc_mult": 4,
    "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "rms_norm_eps": 1e-6, "rope_theta": 10000,
    "compress_rope_theta": 160000, "max_position_embeddings": 1048576, "num_key_value_heads": 1,
    "scoring_func": "sqrtsoftplus", "expert_dtype": "fp4",
    "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                     "beta_fast": 32, "beta_slow": 1},
    "quantization_config": {"fmt": "e4m3", "weight_block_size": [128, 128]}})");
}

std::string error_of(const nlohmann::json& j) {
  try {
    parse_config(j.dump(), "x/config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Config, ParsesEverySize) {
  const ModelConfig c = parse_config(tiny_config().dump(), "x/config.json");
  EXPECT_EQ(c.hidden_size, 256);
  EXPECT_EQ(c.n_layers, 3);
  EXPECT_EQ(c.attn_kind(0), AttnKind::swa);
  EXPECT_EQ(c.attn_kind(1), AttnKind::csa);
  EXPECT_EQ(c.attn_kind(2), AttnKind::hca);
  EXPECT_EQ(c.mtp_layer_index(0), 3);
  EXPECT_TRUE(c.yarn.enabled);
  EXPECT_EQ(c.yarn.original_max_position, 65536);
  EXPECT_TRUE(c.is_hash_layer(0));
  EXPECT_FALSE(c.is_hash_layer(1));
}

TEST(Config, MissingFieldIsNamed) {
  auto j = tiny_config();
  j.erase("index_topk");
  EXPECT_NE(error_of(j).find("x/config.json: missing field 'index_topk'"), std::string::npos) << error_of(j);
}

TEST(Config, WrongTypeIsNamed) {
  auto j = tiny_config();
  j["hidden_size"] = "big";
  EXPECT_NE(error_of(j).find("'hidden_size' must be an integer"), std::string::npos) << error_of(j);
}

TEST(Config, MalformedJsonNamesTheFile) {
  EXPECT_THROW(parse_config("{\"vocab_size\": ", "bad/config.json"), Error);
  try {
    parse_config("{", "bad/config.json");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad/config.json: malformed JSON"), std::string::npos);
  }
}

TEST(Config, CompressRatiosMustCoverLayersAndMtp) {
  auto j = tiny_config();
  j["compress_ratios"] = {0, 4, 128};
  EXPECT_NE(error_of(j).find("compress_ratios has 3 entries, expected"), std::string::npos) << error_of(j);
  j["compress_ratios"] = {0, 4, 64, 0};
  EXPECT_NE(error_of(j).find("not 0, 4 or 128"), std::string::npos) << error_of(j);
}

TEST(Config, V41CheckpointGetsAHint) {
  auto j = tiny_config();
  j["kv_source_layers"] = {1, 2};
  EXPECT_NE(error_of(j).find("V4.1"), std::string::npos) << error_of(j);
}

TEST(Config, ShapeRulesOfTheNumerics) {
  auto j = tiny_config();
  j["index_head_dim"] = 96;
  EXPECT_NE(error_of(j).find("power of two"), std::string::npos) << error_of(j);
  j = tiny_config();
  j["hidden_size"] = 200;
  EXPECT_NE(error_of(j).find("multiple of 128"), std::string::npos) << error_of(j);
}

}  // namespace dsv4::model
