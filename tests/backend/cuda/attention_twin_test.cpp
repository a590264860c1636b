// Twins of the attention state and attention ops (cpu/attention.cpp, compressor.cpp,
// indexer.cpp ↔ cuda/attention.cu, compressor.cu, indexer.cu): the sliding-window ring, sparse
// attention with sinks over window + compressed rows, the compressor carry and pooling across
// chunk boundaries, the Lightning Indexer's top-k (ties included; deepseek-tc's head sums on the
// tensor cores too), and the compact state layout (rows packed on the device, attention and
// indexer reading packed rows).
#include <algorithm>

#include "attention_case.h"

namespace dsv4::test {

TEST(CudaTwin, PackRows) {
  DSV4_REQUIRE_GPU();
  for (const RowFormat f : {RowFormat::attention(StateLayout::compact, 512, 448),
                            RowFormat::attention(StateLayout::compact, 72, 40), RowFormat::index_key(StateLayout::compact, 128),
                            RowFormat::index_key(StateLayout::compact, 32), RowFormat::plain(24)})
    for (int64_t rows : {1, 37}) {
      const std::string name = "pack_rows kind" + std::to_string(int(f.kind)) + " w" + std::to_string(f.width) +
                               " x" + std::to_string(rows);
      const std::vector<float> x = random_bf16(name + ".x", size_t(rows * f.width), 3.0f);
      expect_twins(name, Numerics::deepseek, [&](Side& s) {
        // The rows the engine would store: simulated on the side itself, then packed.
        float* xd = s.in(x);
        if (f.kind == RowFormat::fp8_bf16) s->kv_fp8_sim(xd, rows, f.width, f.quant_dims);
        if (f.kind == RowFormat::fp4) s->indexer_fp4_sim(xd, rows, f.width);
        float* stored = s.out(size_t(rows * f.stride));
        s->pack_rows(f, xd, rows, stored);
        std::vector<int32_t> bits;
        for (float v : s.read(stored, size_t(rows * f.stride))) bits.push_back(int32_t(f32_bits(v)));
        Outputs o;
        o.add("stored bytes", bits);
        return o;
      });
    }
}

TEST(CudaTwin, SwaRing) {
  DSV4_REQUIRE_GPU();
  for (auto [window, width, pos0, n] : {std::tuple{4, 3, 0, 1}, {8, 17, 5, 20}, {128, 128, 1000, 7}, {16, 64, 3, 16}}) {
    const std::string name = "swa_store/gather w" + std::to_string(window) + " width" + std::to_string(width) + " p" +
                             std::to_string(pos0) + "+" + std::to_string(n);
    const std::vector<float> ring0 = random_bf16(name + ".ring", size_t(window * width));
    const std::vector<float> rows = random_bf16(name + ".rows", size_t(n * width));
    const int64_t begin = std::max<int64_t>(pos0, pos0 + n - window), end = pos0 + n;
    expect_twins_both(name, [&](Side& s) {
      float* ring = s.in(ring0);
      s->swa_store(ring, window, width, s.in(rows), pos0, n);
      float* dst = s.out(size_t((end - begin) * width));
      s->swa_gather(ring, window, width, begin, end, dst);
      Outputs o;
      o.add("ring", s.read(ring, ring0.size()));
      o.add("gathered", s.read(dst, size_t((end - begin) * width)));
      return o;
    });
  }
}

TEST(CudaTwin, Attention) {
  DSV4_REQUIRE_GPU();
  const std::vector<AttnCase> cases = {
      {1, 1, 64, 0, 128},                   // one row
      {31, 4, 128, 200, 16},                // SWA only, window full
      {7, 4, 128, 0, 128},                  // tiny config, prompt start
      {9, 4, 72, 1000, 128, 7, 128},        // HCA: rows w < (t+1)/128
      {13, 3, 64, 37, 8, 12, 4},            // HCA-style ratio 4
      {11, 4, 128, 500, 128, 127, 4, 32},   // CSA: indexer selections with −1 padding
      {2, 2, 512, 4000, 128, 1000, 4, 512}, // V4-Flash head size and top-k
      {2, 2, 512, 4000, 128, 1000, 4, 512, 448},  // the same over compact rows
      {9, 4, 72, 1000, 128, 7, 128, 0, 40},       // HCA over compact rows, a partial FP8 block
      {2, 3, 512, 12000, 128, 3000, 4, 0, 448},   // thousands of rows, few queries (tensor cores), compact
      {3, 2, 72, 10000, 128, 2500, 4},            // few queries over fp32 rows, dims not a multiple of 16
      {1, 64, 512, 1048000, 128, 8187, 128, 0, 448},  // V4-Flash HCA decode at 1M context
      {2, 64, 512, 40000, 128, 10000, 4, 512, 448},   // V4-Flash CSA decode, two queries
      {8, 70, 72, 3000, 128, 23, 128},                // the most queries on the tensor-core path; 70 heads
      // V4-Flash decode with few rows (launch shapes for 132 SMs): logits in 8 dim parts, values in
      // slices of 32 rows over 4 row groups of 8 …
      {1, 64, 512, 5000, 128},                        // the sliding window alone: 128 rows
      {1, 64, 512, 40000, 128, 10000, 4, 512, 448},   // … slices of 64: CSA, 640 rows with −1 entries
      {1, 64, 512, 399999, 128, 3125, 128, 0, 448},   // 2 dim parts, slices of 128 over row groups: 3 253 rows
      {9, 70, 72, 3000, 128, 23, 128},                // one more: one block per (query, head)
      // Many queries over more than 256 rows: groups of 8 on the tensor-core kernels.
      {20, 64, 512, 40000, 128, 10000, 4, 512, 448},  // V4-Flash CSA prefill: groups of 8, 8 and 4
      {19, 8, 72, 3000, 128, 754, 4},                 // visible rows growing across the groups, fp32 rows
      {17, 64, 512, 262000, 128, 2047, 128, 0, 448},  // V4-Flash HCA prefill at 256K context
  };
  for (const AttnCase& c : cases) {
    const AttnInputs in(c);
    expect_twins_both(in.name, [&](Side& s) {
      Outputs o;
      o.add("out", in.run(s, c));
      return o;
    });
  }
}

// Pushes chunks of a token stream through a compressor and compares every pooled row, the emitted
// counts and the final carry: windows straddle chunk boundaries.
TEST(CudaTwin, CompressorPushAcrossChunks) {
  DSV4_REQUIRE_GPU();
  for (auto [ratio, dim] : {std::pair{4, 16}, {4, 128}, {128, 16}, {128, 72}}) {
    const std::string name = "compressor r" + std::to_string(ratio) + " d" + std::to_string(dim);
    model::CompressorWeights cw;
    cw.ratio = ratio, cw.dim = dim;
    const int64_t width = cw.width();
    cw.ape = random_f32(name + ".ape", size_t(ratio * width), 0.3f);
    const std::vector<int64_t> chunks = {3, 1, 9, 130, 1, 7, 256};
    int64_t total = 0;
    for (int64_t n : chunks) total += n;
    const std::vector<float> a = random_f32(name + ".a", size_t(total * width));
    const std::vector<float> sc = random_f32(name + ".s", size_t(total * width), 2.0f);
    expect_twins_both(name, [&](Side& s) {
      const size_t carry_n = size_t((ratio == 4 ? 8 : ratio) * width);
      CompressorCarry carry{s.out(carry_n), s.out(carry_n)};
      s->compressor_reset(cw, carry);
      Outputs o;
      std::vector<int32_t> emitted;
      int64_t p0 = 0;
      for (int64_t n : chunks) {
        const std::vector<float> an(a.begin() + p0 * width, a.begin() + (p0 + n) * width);
        const std::vector<float> sn(sc.begin() + p0 * width, sc.begin() + (p0 + n) * width);
        float* pooled = s.out(size_t((n / ratio + 1) * dim));
        const int64_t e = s->compressor_push(cw, carry, s.in(an), s.in(sn), p0, n, pooled);
        emitted.push_back(int32_t(e));
        o.add("pooled@" + std::to_string(p0), s.read(pooled, size_t((n / ratio + 1) * dim)));
        p0 += n;
      }
      o.add("carry.a", s.read(carry.a, carry_n));
      o.add("carry.s", s.read(carry.s, carry_n));
      o.add("emitted", emitted);
      return o;
    });
  }
}

struct IndexerCase {
  int64_t T, heads, dim, p0, k;
  bool duplicate_keys = false;  // every key twice: exact ties in any numerics
  bool compact = false;         // keys packed as FP4
  bool one_key = false;         // every key the same: all tie
  bool wide = false;            // some rows' 32-blocks 2^6 apart: too far to fold into one exponent
  bool spread_weights = false;  // some queries' weights 2^24 apart (terms too far apart to add in any
                                // order), the others' first weight off the bf16 grid
};

TEST(CudaTwin, IndexerSelect) {
  DSV4_REQUIRE_GPU();
  const std::vector<IndexerCase> cases = {
      {1, 1, 32, 0, 8},          // nothing visible yet
      {1, 4, 128, 8, 32},        // fewer visible than k
      {31, 4, 128, 100, 32},     // odd T, visibility grows inside the chunk
      {7, 4, 128, 1000, 32},     // tiny config
      {3, 8, 64, 4000, 512},     // V4-Flash top-k over 1000 keys
      {5, 2, 32, 300, 16, true}, // ties
      {2, 4, 128, 40000, 64},    // 10 000 keys
      {3, 8, 128, 4000, 512, false, true},  // compact keys (68 B): the integer path in deepseek
      {5, 2, 32, 300, 16, true, true},      // compact keys with ties
      {2, 64, 128, 40000, 512, false, true},  // V4-Flash indexer heads over 10 000 compact keys
      {3, 17, 64, 3000, 64, false, true},     // compact keys: a partial tile of 16 heads, two 32-dim blocks
      {4, 64, 128, 4000, 512, false, true, false, true},  // compact, some keys and heads not folded
      {6, 64, 128, 4000, 512, false, true, false, false, true},  // compact, some queries summed in head order
      // Few queries over more than 8 192 keys find a threshold bin over the whole GPU (bf16 scores in
      // deepseek tie within a bin; fp32 scores in plain share bins).
      {1, 8, 128, 279999, 512, false, true},  // 70 000 compact keys
      {2, 8, 64, 262542, 512},                // 65 636 keys
      {2, 4, 64, 32770, 512, true},           // 8 192 and 8 193 keys with ties: just past the path's start
      {2, 2, 32, 280002, 512, true, true},    // 70 001 compact keys with ties
      {1, 8, 128, 1048575, 512, false, true}, // 262 144 compact keys (1M tokens)
      {2, 4, 64, 1048574, 512, true},         // 262 143 and 262 144 keys with ties
      {1, 4, 64, 40000, 512, false, false, true},  // 10 000 equal keys: the bin overflows its list
      {2, 4, 64, 40000, 64, false, true, true},    // the same, compact
      // Enough queries to keep one block each (the radix select over each query's scores).
      {128, 2, 32, 39872, 512},               // 10 000 keys
      {128, 4, 64, 40000, 512, true},         // 10 000 keys with ties
      {128, 2, 32, 80000, 512, false, false, true},  // 20 000 equal keys
      {128, 2, 32, 262200, 64, false, false, true},  // 65 550 equal keys (more than 16-bit counts hold)
      {1, 2, 32, 79999, 2048},                // 20 000 keys, k too large for the threshold path: one block
  };
  for (const IndexerCase& c : cases) {
    const std::string name = "indexer_select T" + std::to_string(c.T) + " H" + std::to_string(c.heads) + " d" +
                             std::to_string(c.dim) + " p" + std::to_string(c.p0) + " k" + std::to_string(c.k) +
                             (c.duplicate_keys ? " ties" : "") + (c.compact ? " compact" : "") +
                             (c.one_key ? " one key" : "") + (c.wide ? " wide" : "") +
                             (c.spread_weights ? " spread weights" : "");
    const int64_t n_keys = (c.p0 + c.T) / 4;
    const RowFormat key_format = c.compact ? RowFormat::index_key(StateLayout::compact, int32_t(c.dim))
                                           : RowFormat::plain(int32_t(c.dim));
    std::vector<float> q = random_bf16(name + ".q", size_t(c.T * c.heads * c.dim));
    std::vector<float> wts = random_bf16(name + ".wts", size_t(c.T * c.heads), 0.1f);
    if (c.spread_weights)
      for (int64_t t = 0; t < c.T; ++t) wts[size_t(t * c.heads)] *= t % 2 ? 1.0f + 0x1p-12f : 0x1p-24f;
    std::vector<float> keys = c.compact ? packed_rows(name + ".keys", key_format, std::max<int64_t>(1, n_keys))
                                        : random_bf16(name + ".keys", size_t(std::max<int64_t>(1, n_keys) * c.dim));
    const int64_t stride = key_format.stride;
    if (c.wide) {  // every third head's second block 64 times larger; every fifth key's, its exponent 6 up
      for (int64_t row = 0; row < c.T * c.heads; row += 3)
        for (int64_t d = 32; d < 64; ++d) q[size_t(row * c.dim + d)] *= 64.0f;
      for (int64_t w = 0; w < n_keys; w += 5)
        reinterpret_cast<uint8_t*>(&keys[size_t(w * stride)])[key_format.scale_offset() + 1] += 6;
    }
    if (c.one_key)
      for (int64_t w = 1; w < n_keys; ++w) std::copy(keys.begin(), keys.begin() + stride, keys.begin() + w * stride);
    if (c.duplicate_keys)
      for (int64_t w = 1; w < n_keys; w += 2)
        std::copy(keys.begin() + (w - 1) * stride, keys.begin() + w * stride, keys.begin() + w * stride);
    const Case run = [&](Side& s) {
      int32_t* idx = s.ids_out(size_t(c.T * c.k));
      // Compact keys come from deepseek numerics, whose queries are FP4-simulated too (a no-op in
      // plain, where the GPU takes its general path over the packed keys).
      float* qd = s.in(q);
      if (c.compact) s->indexer_fp4_sim(qd, c.T * c.heads, c.dim);
      s->indexer_select(qd, s.in(wts), c.T, c.heads, c.dim, n_keys ? s.in(keys) : nullptr, key_format, n_keys, 4,
                        c.p0, c.k, idx);
      Outputs o;
      o.add("idx", s.read_ids(idx, size_t(c.T * c.k)));
      return o;
    };
    expect_twins_both(name, run);
    // deepseek-tc sums the compact path's head terms on the tensor cores: a score can differ only
    // when its fp32 sum lies within a few fp32 ulps of a bf16 tie (about one in 10^4 scores), and then
    // the selection only when that score sits at the top k's edge. None does in these cases.
    if (c.compact) expect_twins_tc(name, run);
  }
}

}  // namespace dsv4::test
