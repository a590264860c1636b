// Matrix products y = x·Wᵀ for every weight format (architecture.md §3.0 "Linear kinds", §5).
//
// quantized (deepseek numerics): each activation row is quantized to e4m3 per 128-block with a
// power-of-two scale; per K tile (128 for FP8 weights, 32 for FP4) the exact e4m3×e4m3 (or
// e4m3×e2m1) products are summed in fp32, then the tile partial is multiplied by the two scales
// and added to an fp32 accumulator in increasing K order; the result is rounded to bf16.
// Everything else dequantizes the weight row to fp32 and takes fp32 dot products.
//
// Loop structure: output rows are processed in blocks of kRowBlock, decoded once into a small
// buffer and reused against every token, so prefill streams the activations kRowBlock times
// fewer than a row-at-a-time loop.
#include <array>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/quant.h"
#include "core/error.h"
#include "core/parallel.h"

namespace dsv4::cpu {

using model::Linear;
using model::WeightFormat;

namespace {

constexpr int64_t kRowBlock = 16;

const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int b = 0; b < 256; ++b) t[size_t(b)] = e4m3_to_f32(uint8_t(b));
    return t;
  }();
  return table;
}

// Row o of W as floats: the stored values (e4m3 / e2m1 / bf16 / f32); scaled = multiply by the
// block scales (dequantize), otherwise leave FP8/FP4 values unscaled for the tile-scaled path.
void decode_row(const Linear& W, int64_t o, bool scaled, float* out) {
  const int64_t K = W.in;
  switch (W.format) {
    case WeightFormat::fp8: {
      const auto& t = e4m3_table();
      const uint8_t* row = W.data + o * K;
      for (int64_t i = 0; i < K; ++i) out[i] = t[row[i]];
      if (scaled)
        for (int64_t k0 = 0; k0 < K; k0 += 128) {
          const float s = W.block_scale(o, k0);
          for (int64_t i = k0; i < std::min(K, k0 + 128); ++i) out[i] *= s;
        }
      break;
    }
    case WeightFormat::fp4: {
      const uint8_t* row = W.data + o * (K / 2);
      for (int64_t j = 0; j < K / 2; ++j) {
        out[2 * j] = e2m1_to_f32(row[j] & 0xf);  // low nibble = element 2j (§2.2)
        out[2 * j + 1] = e2m1_to_f32(row[j] >> 4);
      }
      if (scaled)
        for (int64_t k0 = 0; k0 < K; k0 += 32) {
          const float s = W.block_scale(o, k0);
          for (int64_t i = k0; i < k0 + 32; ++i) out[i] *= s;
        }
      break;
    }
    case WeightFormat::bf16: {
      const uint8_t* row = W.data + 2 * o * K;
      for (int64_t i = 0; i < K; ++i) {
        uint16_t h;
        std::memcpy(&h, row + 2 * i, 2);
        out[i] = bf16_to_f32(h);
      }
      break;
    }
    case WeightFormat::f32:
      std::memcpy(out, W.data + 4 * o * K, size_t(K) * 4);
      break;
  }
}

}  // namespace

void CpuBackend::linear(const Linear& W, Compute compute, const float* x, int64_t x_stride, int64_t T, float* y,
                        int64_t y_stride, int64_t row0, int64_t rows) {
  const int64_t K = W.in;
  DSV4_CHECK(row0 >= 0 && row0 + rows <= W.out, "{}: rows [{}, {}) of {}", W.name, row0, row0 + rows, W.out);
  const bool tiled = deepseek() && compute == Compute::quantized;
  DSV4_CHECK(!tiled || W.format == WeightFormat::fp8 || W.format == WeightFormat::fp4,
             "{}: quantized compute needs FP8/FP4 weights, got {}", W.name, to_string(W.format));

  // Phase 1 (quantized only): e4m3 activations and their per-128 scale exponents.
  std::vector<float> qx;
  std::vector<float> sx;
  const int64_t n_k128 = (K + 127) / 128;
  if (tiled) {
    qx.resize(size_t(T * K));
    sx.resize(size_t(T * n_k128));
    parallel_for(T, [&](int64_t m) {
      for (int64_t b = 0; b < n_k128; ++b) {
        const int64_t k0 = b * 128, n = std::min<int64_t>(128, K - k0);
        const int e = quantize_fp8_block(x + m * x_stride + k0, n, qx.data() + m * K + k0);
        sx[size_t(m * n_k128 + b)] = std::ldexp(1.0f, e);
      }
    });
  }
  const bool round_out = deepseek() && rounds_output(compute);
  const int64_t tile = W.format == WeightFormat::fp4 ? 32 : 128;

  // Phase 2: blocks of output rows against every token.
  const int64_t n_blocks = (rows + kRowBlock - 1) / kRowBlock;
  parallel_for(n_blocks, [&](int64_t blk) {
    const int64_t r0 = blk * kRowBlock, nr = std::min(kRowBlock, rows - r0);
    std::vector<float> w(static_cast<size_t>(nr * K));
    std::vector<float> ws;  // tile scales of each row (quantized path)
    const int64_t n_tiles = (K + tile - 1) / tile;
    if (tiled) ws.resize(size_t(nr * n_tiles));
    for (int64_t r = 0; r < nr; ++r) {
      decode_row(W, row0 + r0 + r, !tiled, w.data() + r * K);
      if (tiled)
        for (int64_t t = 0; t < n_tiles; ++t) ws[size_t(r * n_tiles + t)] = W.block_scale(row0 + r0 + r, t * tile);
    }
    for (int64_t m = 0; m < T; ++m) {
      float* ym = y + m * y_stride + r0;
      if (!tiled) {
        const float* xm = x + m * x_stride;
        for (int64_t r = 0; r < nr; ++r) {
          const float acc = dot(xm, w.data() + r * K, K);
          ym[r] = round_out ? round_bf16(acc) : acc;
        }
        continue;
      }
      const float* qm = qx.data() + m * K;
      const float* sm = sx.data() + m * n_k128;
      for (int64_t r = 0; r < nr; ++r) {
        const float* wr = w.data() + r * K;
        float acc = 0.0f;
        for (int64_t t = 0; t < n_tiles; ++t) {
          const int64_t k0 = t * tile, n = std::min(tile, K - k0);
          const float partial = dot(qm + k0, wr + k0, n);
          const float s_x = sm[k0 / 128], s_w = ws[size_t(r * n_tiles + t)];
          // FP8 kernel: partial · (s_x · s_w); FP4 kernel: (partial · s_x) · s_w (§5).
          acc += tile == 128 ? partial * (s_x * s_w) : (partial * s_x) * s_w;
        }
        ym[r] = round_bf16(acc);
      }
    }
  });
}

void CpuBackend::embed(const Linear& table, const int32_t* tokens, int64_t T, int64_t hc, float* X) {
  const int64_t D = table.in;
  for (int64_t t = 0; t < T; ++t)  // checked before the parallel loop: nothing may throw inside it
    DSV4_CHECK(tokens[t] >= 0 && tokens[t] < table.out, "token id {} outside the vocabulary [0, {})", tokens[t],
               table.out);
  parallel_for(T, [&](int64_t t) {
    float* x0 = X + t * hc * D;
    decode_row(table, tokens[t], true, x0);
    for (int64_t h = 1; h < hc; ++h) std::memcpy(x0 + h * D, x0, size_t(D) * 4);
  });
}

}  // namespace dsv4::cpu
