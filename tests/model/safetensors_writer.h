// Test helper: writes safetensors files (and copies of fixture checkpoints with edits) so the
// loader's error paths can be exercised on real bytes.
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/safetensors.h"

namespace dsv4::test {

struct RawTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

inline void write_safetensors(const std::string& path, const std::map<std::string, RawTensor>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  size_t offset = 0;
  for (const auto& [name, t] : tensors) {
    header[name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string h = header.dump();
  while (h.size() % 8) h += ' ';
  std::ofstream f(path, std::ios::binary);
  const uint64_t n = h.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f.write(h.data(), std::streamsize(h.size()));
  for (const auto& [name, t] : tensors) f.write(reinterpret_cast<const char*>(t.bytes.data()), std::streamsize(t.bytes.size()));
}

// All tensors of a checkpoint as raw bytes, for editing.
inline std::map<std::string, RawTensor> read_all(const model::Checkpoint& ck) {
  std::map<std::string, RawTensor> out;
  for (const auto& [name, t] : ck.tensors())
    out[name] = RawTensor{model::to_string(t.dtype), t.shape, std::vector<uint8_t>(t.data, t.data + t.nbytes)};
  return out;
}

// A fresh temporary folder under the build tree.
inline std::string temp_dir(const std::string& name) {
  const std::filesystem::path p = std::filesystem::temp_directory_path() / ("dsv4_test_" + name);
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p.string();
}

}  // namespace dsv4::test
