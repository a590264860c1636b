// Test helpers: the committed oracle fixtures (tests/fixtures/, made by tools/oracle/).
#pragma once

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace dsv4::test {

inline std::string fixture_model(const std::string& name) {
  return std::string(DSV4_SOURCE_DIR) + "/tests/fixtures/models/" + name;
}
inline std::string fixture_logits(const std::string& name) {
  return std::string(DSV4_SOURCE_DIR) + "/tests/fixtures/logits/" + name;
}

inline std::vector<int32_t> read_tokens(const std::string& path) {
  std::ifstream f(path);
  const nlohmann::json j = nlohmann::json::parse(f);
  return j.at("tokens").get<std::vector<int32_t>>();
}

inline std::vector<float> read_f32(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  const std::streamsize n = f.tellg();
  std::vector<float> v(static_cast<size_t>(n) / sizeof(float));
  f.seekg(0);
  f.read(reinterpret_cast<char*>(v.data()), n);
  return v;
}

// Largest |a − b| and the fraction of rows whose argmax agrees, over rows [0, rows) of width V.
struct LogitsDiff {
  double max_abs = 0;
  double argmax_agree = 0;
  int64_t worst_row = -1;
};

inline LogitsDiff compare_logits(const float* a, const float* b, int64_t rows, int64_t V) {
  LogitsDiff d;
  int64_t agree = 0;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t am = 0, bm = 0;
    for (int64_t v = 0; v < V; ++v) {
      const double diff = std::abs(double(a[r * V + v]) - double(b[r * V + v]));
      if (diff > d.max_abs) d.max_abs = diff, d.worst_row = r;
      if (a[r * V + v] > a[r * V + am]) am = v;
      if (b[r * V + v] > b[r * V + bm]) bm = v;
    }
    agree += am == bm;
  }
  d.argmax_agree = rows ? double(agree) / double(rows) : 1.0;
  return d;
}

}  // namespace dsv4::test
