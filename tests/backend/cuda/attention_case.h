// One attention call's seeded inputs, shared by the exact twins (attention_twin_test.cpp) and
// deepseek-tc's tensor-core bound test (attention_tc_test.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "../../core/simulated_rows.h"
#include "twin.h"

namespace dsv4::test {

// `rows` rows as the deepseek numerics store them, packed in `f` on the host.
inline std::vector<float> packed_rows(const std::string& name, const RowFormat& f, int64_t rows) {
  std::vector<float> x = random_bf16(name, size_t(rows * f.width));
  simulate_rows(f, x.data(), rows);
  std::vector<float> stored(size_t(rows * f.stride));
  for (int64_t r = 0; r < rows; ++r)
    EXPECT_TRUE(pack_row(f, x.data() + r * f.width, stored.data() + r * f.stride)) << name << " row " << r;
  return stored;
}

struct AttnCase {
  int64_t T, H, hd, p0, window;
  int64_t n_comp = 0, ratio = 0, k = 0;  // k > 0: indexer selections
  int64_t compact_dims = 0;              // > 0: compressed rows packed, this many FP8 dims
};

// The case's name and operands on the host: queries, the window rows [first_pos, first_pos + n_swa),
// the compressed rows (stored in comp_format), sinks, and the selections (every fifth −1).
struct AttnInputs {
  std::string name;
  RowFormat comp_format;
  int64_t first_pos, n_swa;
  std::vector<float> q, kv, comp, sinks;
  std::vector<int32_t> idx;

  explicit AttnInputs(const AttnCase& c)
      : name("attention T" + std::to_string(c.T) + " H" + std::to_string(c.H) + " hd" + std::to_string(c.hd) + " p" +
             std::to_string(c.p0) + " W" + std::to_string(c.window) +
             (c.ratio ? " comp" + std::to_string(c.n_comp) + "/r" + std::to_string(c.ratio) : "") +
             (c.k ? " k" + std::to_string(c.k) : "") + (c.compact_dims ? " compact" : "")),
        comp_format(c.compact_dims ? RowFormat::attention(StateLayout::compact, int32_t(c.hd), int32_t(c.compact_dims))
                                   : RowFormat::plain(int32_t(c.hd))),
        first_pos(std::max<int64_t>(0, c.p0 - (c.window - 1))),
        n_swa(c.p0 - first_pos + c.T),
        q(random_bf16(name + ".q", size_t(c.T * c.H * c.hd), 2.0f)),
        kv(random_bf16(name + ".kv", size_t(n_swa * c.hd))),
        comp(c.compact_dims ? packed_rows(name + ".comp", comp_format, std::max<int64_t>(1, c.n_comp))
                            : random_bf16(name + ".comp", size_t(std::max<int64_t>(1, c.n_comp) * c.hd))),
        sinks(random_f32(name + ".sinks", size_t(c.H))) {
    std::mt19937 rng(seed_of(name + ".idx"));
    for (int64_t i = 0; i < c.T * c.k; ++i) idx.push_back(i % 5 == 4 ? -1 : int32_t(rng() % uint32_t(c.n_comp)));
  }

  float softmax_scale(const AttnCase& c) const { return float(1.0 / std::sqrt(double(c.hd))); }

  // The call on side s; returns its output [T, H, hd] read back.
  std::vector<float> run(Side& s, const AttnCase& c) const {
    float* out = s.out(size_t(c.T * c.H * c.hd));
    const SwaRows swa{s.in(kv), first_pos, n_swa, c.window};
    CompressedRows cr;
    if (c.ratio) cr = CompressedRows{s.in(comp), comp_format, c.n_comp, c.ratio, c.k ? s.ids(idx) : nullptr, c.k};
    s->attention(s.in(q), c.T, c.H, c.hd, c.p0, swa, cr, sinks.data(), softmax_scale(c), out);
    return s.read(out, size_t(c.T * c.H * c.hd));
  }
};

}  // namespace dsv4::test
