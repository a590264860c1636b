// The safetensors reader on good and bad bytes: every failure names the file and the tensor.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "model/safetensors.h"
#include "safetensors_writer.h"

namespace dsv4::model {

using test::RawTensor;

std::string open_error(const std::string& dir) {
  try {
    Checkpoint::open(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void write_raw(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), std::streamsize(bytes.size()));
}

std::string with_header(const std::string& header, size_t data_bytes) {
  std::string s(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(s.data(), &n, 8);
  return s + header + std::string(data_bytes, '\x01');
}

TEST(Safetensors, ReadsTensorsInPlace) {
  const std::string dir = test::temp_dir("st_ok");
  test::write_safetensors(dir + "/model.safetensors",
                          {{"a", RawTensor{"F32", {2}, std::vector<uint8_t>(8, 0)}},
                           {"b", RawTensor{"BF16", {3}, {1, 2, 3, 4, 5, 6}}}});
  const Checkpoint ck = Checkpoint::open(dir);
  ASSERT_NE(ck.find("b"), nullptr);
  EXPECT_EQ(ck.find("b")->dtype, DType::BF16);
  EXPECT_EQ(ck.find("b")->shape, std::vector<int64_t>{3});
  EXPECT_EQ(ck.find("b")->data[5], 6);
  EXPECT_EQ(ck.total_bytes(), 14u);
}

TEST(Safetensors, NoCheckpointFiles) {
  const std::string dir = test::temp_dir("st_empty");
  EXPECT_NE(open_error(dir).find("no model.safetensors.index.json or model.safetensors"), std::string::npos);
}

TEST(Safetensors, TruncatedFile) {
  const std::string dir = test::temp_dir("st_trunc");
  write_raw(dir + "/model.safetensors", "abc");
  EXPECT_NE(open_error(dir).find("model.safetensors: truncated"), std::string::npos) << open_error(dir);
}

TEST(Safetensors, HeaderLengthOverrunsFile) {
  const std::string dir = test::temp_dir("st_hdr");
  std::string s = with_header("{}", 0);
  const uint64_t huge = 1u << 30;
  std::memcpy(s.data(), &huge, 8);
  write_raw(dir + "/model.safetensors", s);
  EXPECT_NE(open_error(dir).find("header length 1073741824 overruns the file"), std::string::npos) << open_error(dir);
}

TEST(Safetensors, MalformedHeaderJson) {
  const std::string dir = test::temp_dir("st_json");
  write_raw(dir + "/model.safetensors", with_header("{\"a\": [", 0));
  EXPECT_NE(open_error(dir).find("model.safetensors: malformed header JSON"), std::string::npos) << open_error(dir);
}

TEST(Safetensors, OffsetsOverrunTheData) {
  const std::string dir = test::temp_dir("st_off");
  write_raw(dir + "/model.safetensors",
            with_header(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8));
  EXPECT_NE(open_error(dir).find("model.safetensors: w: data_offsets [0, 16] overrun the data section (8 bytes)"),
            std::string::npos)
      << open_error(dir);
}

TEST(Safetensors, SizeMustMatchShapeAndDtype) {
  const std::string dir = test::temp_dir("st_size");
  write_raw(dir + "/model.safetensors",
            with_header(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8));
  EXPECT_NE(open_error(dir).find("w: 8 bytes for F32 [3] (expected 12)"), std::string::npos) << open_error(dir);
}

TEST(Safetensors, UnknownDtype) {
  const std::string dir = test::temp_dir("st_dtype");
  write_raw(dir + "/model.safetensors",
            with_header(R"({"w":{"dtype":"Q4_K","shape":[1],"data_offsets":[0,1]}})", 1));
  EXPECT_NE(open_error(dir).find("w: unknown dtype \"Q4_K\""), std::string::npos) << open_error(dir);
}

TEST(Safetensors, IndexAndShardsMustAgree) {
  const std::string dir = test::temp_dir("st_index");
  test::write_safetensors(dir + "/model-00001-of-00001.safetensors",
                          {{"a", RawTensor{"F32", {1}, std::vector<uint8_t>(4, 0)}}});
  write_raw(dir + "/model.safetensors.index.json",
            R"({"weight_map": {"a": "model-00001-of-00001.safetensors", "b": "model-00001-of-00001.safetensors"}})");
  EXPECT_NE(open_error(dir).find("b: listed in the index but not in the shard"), std::string::npos) << open_error(dir);
  write_raw(dir + "/model.safetensors.index.json", R"({"weight_map": {"a": "../elsewhere.safetensors"}})");
  EXPECT_NE(open_error(dir).find("leaves the folder"), std::string::npos) << open_error(dir);
  write_raw(dir + "/model.safetensors.index.json", R"({"weight_map": {"a": "model-00002-of-00002.safetensors"}})");
  EXPECT_NE(open_error(dir).find("model-00002-of-00002.safetensors: cannot open"), std::string::npos) << open_error(dir);
}

}  // namespace dsv4::model
