// Test helper: safetensors files (and copies of fixture checkpoints with edits) from raw bytes, so
// the loader's error paths can be exercised on real files.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/safetensors.h"

namespace dsv4::test {

struct RawTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

inline model::DType dtype_named(const std::string& name) {
  for (int d = 0; d <= int(model::DType::F8_E8M0); ++d)
    if (name == model::to_string(model::DType(d))) return model::DType(d);
  throw std::invalid_argument("unknown dtype " + name);
}

// Writes the tensors as given; a byte count that disagrees with dtype and shape is written as is
// (the point of some tests), so the header is made here, not by write_safetensors.
inline void write_safetensors(const std::string& path, const std::map<std::string, RawTensor>& tensors) {
  std::vector<model::TensorToWrite> list;
  for (const auto& [name, t] : tensors) {
    const RawTensor* raw = &t;
    list.push_back({name, dtype_named(t.dtype), t.shape, [raw](uint8_t* dst, size_t n) {
                      std::copy_n(raw->bytes.begin(), std::min(n, raw->bytes.size()), dst);
                    }});
  }
  model::write_safetensors(path, list);
}

// All tensors of a checkpoint as raw bytes, for editing.
inline std::map<std::string, RawTensor> read_all(const model::Checkpoint& ck) {
  std::map<std::string, RawTensor> out;
  for (const auto& [name, t] : ck.tensors())
    out[name] = RawTensor{model::to_string(t.dtype), t.shape, std::vector<uint8_t>(t.data, t.data + t.nbytes)};
  return out;
}

// A fresh temporary folder.
inline std::string temp_dir(const std::string& name) {
  const std::filesystem::path p = std::filesystem::temp_directory_path() / ("dsv4_test_" + name);
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p.string();
}

}  // namespace dsv4::test
