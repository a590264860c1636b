// Binding a checkpoint against its config: the fixture binds cleanly, and every kind of damage
// is reported with the file and the tensor, all problems at once.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <functional>

#include "core/error.h"
#include "model/weights.h"
#include "safetensors_writer.h"

namespace dsv4::model {

namespace fs = std::filesystem;

const std::string kFixture = std::string(DSV4_SOURCE_DIR) + "/tests/fixtures/models/tiny-flash";

// A single-file copy of the fixture with `edit` applied to its tensors.
std::string edited_copy(const std::string& name, const std::function<void(std::map<std::string, test::RawTensor>&)>& edit) {
  const Checkpoint ck = Checkpoint::open(kFixture);
  auto tensors = test::read_all(ck);
  edit(tensors);
  const std::string dir = test::temp_dir(name);
  fs::copy_file(kFixture + "/config.json", dir + "/config.json");
  test::write_safetensors(dir + "/model.safetensors", tensors);
  return dir;
}

std::string bind_error(const std::string& dir) {
  try {
    const ModelConfig c = load_config(dir);
    const Checkpoint ck = Checkpoint::open(dir);
    bind_weights(ck, c);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Weights, FixtureBindsEveryTensor) {
  const ModelConfig c = load_config(kFixture);
  const Checkpoint ck = Checkpoint::open(kFixture);
  const Weights w = bind_weights(ck, c);
  ASSERT_EQ(int64_t(w.layers.size()), c.n_layers);
  EXPECT_EQ(w.layers[1].kind, AttnKind::csa);
  EXPECT_TRUE(w.layers[1].attn.indexer.has_value());
  EXPECT_EQ(w.layers[2].attn.compressor->ratio, 128);
  EXPECT_FALSE(w.layers[0].ffn.tid2eid.empty());
  EXPECT_TRUE(w.layers[3].ffn.tid2eid.empty());
  EXPECT_EQ(w.layers[3].ffn.bias.size(), size_t(c.n_routed_experts));
  ASSERT_EQ(w.mtp.size(), 1u);
  EXPECT_EQ(w.layers[1].ffn.experts[0].w1.format, WeightFormat::fp4);
  EXPECT_EQ(w.layers[1].attn.wq_b.format, WeightFormat::fp8);
}

TEST(Weights, MissingTensorIsNamed) {
  const std::string dir = edited_copy("w_missing", [](auto& t) { t.erase("layers.2.attn.wq_a.scale"); });
  EXPECT_NE(bind_error(dir).find("layers.2.attn.wq_a.scale: missing tensor"), std::string::npos) << bind_error(dir);
}

TEST(Weights, ExtraTensorIsNamed) {
  const std::string dir = edited_copy("w_extra", [](auto& t) {
    t["layers.1.attn.engram_gate"] = test::RawTensor{"F32", {2}, std::vector<uint8_t>(8, 0)};
  });
  EXPECT_NE(bind_error(dir).find("model.safetensors: layers.1.attn.engram_gate: unexpected tensor"), std::string::npos)
      << bind_error(dir);
}

TEST(Weights, WrongDtypeIsNamed) {
  const std::string dir = edited_copy("w_dtype", [](auto& t) {
    auto& w = t.at("layers.0.attn.wkv.weight");
    w.dtype = "I8";
  });
  EXPECT_NE(bind_error(dir).find("layers.0.attn.wkv.weight: dtype I8, expected F8_E4M3"), std::string::npos)
      << bind_error(dir);
}

TEST(Weights, WrongShapeIsNamed) {
  const std::string dir = edited_copy("w_shape", [](auto& t) {
    auto& w = t.at("norm.weight");
    w.shape = {w.shape[0] / 2, 2};
  });
  EXPECT_NE(bind_error(dir).find("norm.weight: shape [128, 2], expected [256]"), std::string::npos) << bind_error(dir);
}

TEST(Weights, HashTableEntriesMustBeExperts) {
  const std::string dir = edited_copy("w_hash", [](auto& t) {
    auto& w = t.at("layers.0.ffn.gate.tid2eid");
    const int64_t bad = 99;
    std::memcpy(w.bytes.data() + 8 * 5, &bad, 8);
  });
  EXPECT_NE(bind_error(dir).find("layers.0.ffn.gate.tid2eid: entry [2, 1] = 99 is not an expert id"), std::string::npos)
      << bind_error(dir);
}

TEST(Weights, EveryProblemIsReportedAtOnce) {
  const std::string dir = edited_copy("w_many", [](auto& t) {
    t.erase("head.weight");
    t.erase("mtp.0.e_proj.weight");
    t["stray"] = test::RawTensor{"F32", {1}, std::vector<uint8_t>(4, 0)};
  });
  const std::string e = bind_error(dir);
  EXPECT_NE(e.find("3 problem(s)"), std::string::npos) << e;
  EXPECT_NE(e.find("head.weight: missing"), std::string::npos) << e;
  EXPECT_NE(e.find("mtp.0.e_proj.weight: missing"), std::string::npos) << e;
  EXPECT_NE(e.find("stray: unexpected"), std::string::npos) << e;
}

}  // namespace dsv4::model
