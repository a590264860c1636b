// The twin harness: one op run on the CPU reference and on the CUDA backend with the same seeded
// inputs, outputs compared bit for bit (style.md "One twin harness for all ops").
//
// A case is a lambda that, given a Side (one backend plus its copies of the inputs), runs the op
// and returns its named outputs read back to the host. Inputs are drawn from seeds derived from
// their names, in role-fitting ranges and never zero; outputs are poisoned with NaN first, so an
// element the GPU forgets to write cannot match, and guard elements around each output catch
// stray writes. Every comparison prints one line with the
// number of differing elements and max|Δ|, which is where the report's numbers come from.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda.h"
#include "core/error.h"
#include "core/formats.h"
#include "model/weights.h"

namespace dsv4::test {

#define DSV4_REQUIRE_GPU() \
  if (::dsv4::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device"

inline uint32_t seed_of(const std::string& name) {
  uint32_t h = 2166136261u;  // FNV-1a
  for (char c : name) h = (h ^ uint8_t(c)) * 16777619u;
  return h;
}

// Normal(0, scale) values rounded to bf16 (activations between ops are bf16-representable),
// redrawn when zero.
inline std::vector<float> random_bf16(const std::string& name, size_t n, float scale = 1.0f) {
  std::mt19937 rng(seed_of(name));
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v)
    do x = round_bf16(dist(rng));
    while (x == 0.0f);
  return v;
}

// Normal(0, scale) fp32 values (fp32-kind products, carries), never zero.
inline std::vector<float> random_f32(const std::string& name, size_t n, float scale = 1.0f) {
  std::mt19937 rng(seed_of(name));
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v)
    do x = dist(rng);
    while (x == 0.0f);
  return v;
}

inline std::vector<float> random_uniform(const std::string& name, size_t n, float lo, float hi) {
  std::mt19937 rng(seed_of(name));
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// A weight matrix with its own host storage, in any checkpoint format (§2.2): FP8 bytes (no NaN
// codes) with E8M0 (or f32) 128×128 block scales, FP4 nibbles with 1×32 scales, BF16 or F32.
struct HostLinear {
  std::vector<uint8_t> data, scale;
  model::Linear W;
};

inline std::unique_ptr<HostLinear> random_linear(const std::string& name, model::WeightFormat format, int64_t out,
                                                 int64_t in, float scale = 0.05f, bool f32_scales = false) {
  auto h = std::make_unique<HostLinear>();
  std::mt19937 rng(seed_of(name));
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_int_distribution<int> exponent(117, 123);  // 2^-10 .. 2^-4
  std::normal_distribution<float> normal(0.0f, scale);
  model::Linear& W = h->W;
  W.name = name, W.format = format, W.out = out, W.in = in;
  switch (format) {
    case model::WeightFormat::fp8:
      h->data.resize(size_t(out * in));
      for (uint8_t& b : h->data)
        do b = uint8_t(byte(rng));
        while ((b & 0x7f) == 0x7f || (b & 0x7f) == 0);
      W.scale_cols = (in + 127) / 128;
      h->scale.resize(size_t((out + 127) / 128 * W.scale_cols) * (f32_scales ? 4 : 1));
      break;
    case model::WeightFormat::fp4:
      h->data.resize(size_t(out * in / 2));
      for (uint8_t& b : h->data)
        do b = uint8_t(byte(rng));
        while ((b & 7) == 0 || (b & 0x70) == 0);
      W.scale_cols = in / 32;
      h->scale.resize(size_t(out * W.scale_cols) * (f32_scales ? 4 : 1));
      break;
    case model::WeightFormat::bf16:
      h->data.resize(size_t(out * in) * 2);
      for (int64_t i = 0; i < out * in; ++i) {
        float v;
        do v = normal(rng);
        while (round_bf16(v) == 0.0f);
        const uint16_t b = f32_to_bf16(v);
        std::memcpy(h->data.data() + 2 * i, &b, 2);
      }
      break;
    case model::WeightFormat::f32:
      h->data.resize(size_t(out * in) * 4);
      for (int64_t i = 0; i < out * in; ++i) {
        float v;
        do v = normal(rng);
        while (v == 0.0f);
        std::memcpy(h->data.data() + 4 * i, &v, 4);
      }
      break;
  }
  if (!h->scale.empty()) {
    W.scale_is_f32 = f32_scales;
    if (f32_scales)
      for (size_t i = 0; i < h->scale.size() / 4; ++i) {
        const float s = std::ldexp(1.0f, exponent(rng) - 127) * (1.0f + 0.25f * float(i % 3));  // not only powers of 2
        std::memcpy(h->scale.data() + 4 * i, &s, 4);
      }
    else
      for (uint8_t& b : h->scale) b = uint8_t(exponent(rng));
    W.scale = h->scale.data();
  }
  W.data = h->data.data();
  return h;
}

// One backend and its copies of a case's inputs; buffers are released with the Side.
class Side {
 public:
  explicit Side(Backend& b) : b_(b), gpu_(b.name() == "cuda") {}
  ~Side() {
    for (float* p : floats_) b_.release(p);
    for (int32_t* p : ids_) b_.release_ids(p);
  }
  Backend& backend() { return b_; }
  Backend* operator->() { return &b_; }

  // An input, uploaded on the backend's stream. (The runtime's cudaMemcpy from pageable memory may
  // return before its bytes land, and its legacy stream is not ordered before the backend's
  // non-blocking one: hc_post once read an 880 KB input half-written.)
  float* in(const std::vector<float>& host) {
    float* p = alloc(host.size());
    b_.from_host(p, host.data(), host.size());
    return p;
  }
  // An output: poisoned (an element nobody writes stays NaN) and fenced by guard elements on both
  // sides that must stay poisoned (stray_writes).
  float* out(size_t n) {
    float* base = alloc(n + 2 * kGuard);
    b_.fill(base, NAN, n + 2 * kGuard);
    float_outs_.emplace_back(base, n);
    return base + kGuard;
  }
  int32_t* ids(const std::vector<int32_t>& host) {
    int32_t* p = b_.alloc_ids(std::max<size_t>(1, host.size()));
    ids_.push_back(p);
    b_.ids_from_host(p, host.data(), host.size());
    return p;
  }
  int32_t* ids_out(size_t n) {
    int32_t* base = ids(std::vector<int32_t>(n + 2 * kGuard, kIdPoison));
    id_outs_.emplace_back(base, n);
    return base + kGuard;
  }
  // Guard elements around the outputs that an op overwrote.
  int64_t stray_writes() {
    int64_t n_stray = 0;
    for (auto [base, n] : float_outs_)
      for (const float* g : {base, base + kGuard + n})
        for (float v : read(g, kGuard)) n_stray += !std::isnan(v);
    for (auto [base, n] : id_outs_)
      for (const int32_t* g : {base, base + kGuard + n})
        for (int32_t v : read_ids(g, kGuard)) n_stray += v != kIdPoison;
    return n_stray;
  }
  std::vector<float> read(const float* p, size_t n) {
    std::vector<float> v(n);
    b_.to_host(v.data(), p, n);
    return v;
  }
  std::vector<int32_t> read_ids(const int32_t* p, size_t n) {
    std::vector<int32_t> v(n);
    if (!gpu_) {
      std::copy_n(p, n, v.data());
      return v;
    }
    // The backend has no ids_to_host: a device-wide synchronisation, then the runtime's own copy
    // (to pageable memory it returns once the bytes have landed).
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(v.data(), p, n * sizeof(int32_t), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }

 private:
  float* alloc(size_t n) {
    float* p = b_.alloc(std::max<size_t>(1, n));
    floats_.push_back(p);
    return p;
  }
  static constexpr size_t kGuard = 32;
  static constexpr int32_t kIdPoison = -777;
  Backend& b_;
  bool gpu_;
  std::vector<float*> floats_;
  std::vector<int32_t*> ids_;
  std::vector<std::pair<float*, size_t>> float_outs_;
  std::vector<std::pair<int32_t*, size_t>> id_outs_;
};

// What a case returns: named outputs, read back to the host.
struct Outputs {
  std::vector<std::pair<std::string, std::vector<float>>> floats;
  std::vector<std::pair<std::string, std::vector<int32_t>>> ids;
  void add(const std::string& name, std::vector<float> v) { floats.emplace_back(name, std::move(v)); }
  void add(const std::string& name, std::vector<int32_t> v) { ids.emplace_back(name, std::move(v)); }
};

using Case = std::function<Outputs(Side&)>;

inline bool same_bits(float a, float b) {
  return (std::isnan(a) && std::isnan(b)) || f32_bits(a) == f32_bits(b);
}

// Bitwise equal elements between two arrays of the same size.
inline int64_t identical(const std::vector<float>& a, const std::vector<float>& b) {
  int64_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += same_bits(a[i], b[i]);
  return n;
}

// Runs `run` on fresh CPU and CUDA backends in `numerics` and expects bit-identical outputs
// (or, with tolerance > 0, max|Δ| ≤ tolerance). gpu_numerics, when given, is the CUDA backend's
// (deepseek_tc against the CPU's deepseek).
inline void expect_twins(const std::string& what, Numerics numerics, const Case& run, double tolerance = 0.0,
                         std::optional<Numerics> gpu_numerics = std::nullopt) {
  auto cpu = make_cpu_backend(numerics);
  auto gpu = make_cuda_backend(gpu_numerics.value_or(numerics));
  Outputs ref, got;
  const std::string label = what + " [" + to_string(gpu_numerics.value_or(numerics)) + "]";
  {
    Side s(*cpu);
    ref = run(s);
    EXPECT_EQ(s.stray_writes(), 0) << label << ": the CPU wrote outside an output";
  }
  {
    Side s(*gpu);
    got = run(s);
    EXPECT_EQ(s.stray_writes(), 0) << label << ": the GPU wrote outside an output";
  }
  ASSERT_EQ(ref.floats.size(), got.floats.size()) << label;
  for (size_t o = 0; o < ref.floats.size(); ++o) {
    const auto& [name, r] = ref.floats[o];
    const std::vector<float>& g = got.floats[o].second;
    ASSERT_EQ(r.size(), g.size()) << label << " " << name;
    int64_t differ = 0, first = -1, last = -1;
    double max_abs = 0.0;
    for (size_t i = 0; i < r.size(); ++i) {
      if (same_bits(r[i], g[i])) continue;
      ++differ;
      if (first < 0) first = int64_t(i);
      last = int64_t(i);
      const double d = std::abs(double(r[i]) - double(g[i]));
      max_abs = std::isnan(d) ? INFINITY : std::max(max_abs, d);
    }
    std::printf("[ twin     ] %-52s %-8s n=%-8zu %s", label.c_str(), name.c_str(), r.size(),
                differ == 0 ? "bit-exact\n" : "");
    // Where they differ, for finding which part of an output is wrong: the first and last element.
    if (differ)
      std::printf("differ=%lld max|d|=%.3g first [%lld] %.9g vs %.9g, last [%lld]\n", (long long)differ, max_abs,
                  (long long)first, double(r[size_t(first)]), double(g[size_t(first)]), (long long)last);
    if (tolerance > 0)
      EXPECT_LE(max_abs, tolerance) << label << " " << name << ": " << differ << " elements differ";
    else
      EXPECT_EQ(differ, 0) << label << " " << name << ": max|Δ| " << max_abs;
  }
  ASSERT_EQ(ref.ids.size(), got.ids.size()) << label;
  for (size_t o = 0; o < ref.ids.size(); ++o) {
    const auto& [name, r] = ref.ids[o];
    const std::vector<int32_t>& g = got.ids[o].second;
    int64_t differ = 0;
    for (size_t i = 0; i < r.size(); ++i) differ += r[i] != g[i];
    std::printf("[ twin     ] %-52s %-8s n=%-8zu %s", label.c_str(), name.c_str(), r.size(),
                differ == 0 ? "identical\n" : "");
    if (differ) std::printf("differ=%lld\n", (long long)differ);
    EXPECT_EQ(differ, 0) << label << " " << name;
  }
}

inline void expect_twins_both(const std::string& what, const Case& run) {
  expect_twins(what, Numerics::deepseek, run);
  expect_twins(what, Numerics::plain, run);
}

// deepseek-tc on the GPU against deepseek on the CPU, bit for bit: for ops whose tensor-core
// variant is expected to give the exact result on the case (see each use).
inline void expect_twins_tc(const std::string& what, const Case& run) {
  expect_twins(what, Numerics::deepseek, run, 0.0, Numerics::deepseek_tc);
}

}  // namespace dsv4::test
