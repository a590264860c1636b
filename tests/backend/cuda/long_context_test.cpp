// Long context on the GPU (issue 4): the tiny-flash fixture model run to 131 072 tokens. A token
// decoded at 8K, 32K and 128K gets logits bit-identical to one-shot prefill of the same tokens,
// and the sequence state grows only by the compressed rows (one per 4 or 128 tokens) and the
// indexer keys (one per 4): the ring and the compressor carries stay their fixed size.
#include <random>

#include "engine/engine.h"
#include "../../engine/fixtures.h"
#include "twin.h"

namespace dsv4::test {

using engine::Engine;
using engine::LayerState;
using engine::Model;
using engine::SequenceState;

TEST(CudaLongContext, DecodeAt8K32K128KMatchesOneShotPrefill) {
  DSV4_REQUIRE_GPU();
  auto model = Model::load(fixture_model("tiny-flash"));
  const model::ModelConfig& c = model->config();
  std::mt19937 rng(7);
  std::vector<int32_t> tokens(131072);
  for (int32_t& t : tokens) t = int32_t(rng() % uint32_t(c.vocab_size));

  Engine gpu(*model, make_cuda_backend(Numerics::deepseek));
  SequenceState seq = gpu.new_sequence();  // grows mark by mark: prefill to mark − 1, decode one
  size_t fixed_bytes = 0;
  for (int64_t mark : {8192, 32768, 131072}) {
    const std::span<const int32_t> prefix(tokens.data(), size_t(mark));
    SequenceState one = gpu.new_sequence();
    const std::vector<float> one_shot = gpu.forward(one, prefix, false);
    gpu.prefill(seq, prefix.subspan(size_t(seq.n_past), size_t(mark - 1 - seq.n_past)), 4096, false);
    const std::vector<float> decoded = gpu.forward(seq, prefix.subspan(size_t(mark - 1), 1), false);
    ASSERT_EQ(decoded.size(), one_shot.size());
    int64_t same = 0;
    float max_abs = 0.0f;
    for (size_t i = 0; i < decoded.size(); ++i) {
      same += same_bits(decoded[i], one_shot[i]);
      max_abs = std::max(max_abs, std::fabs(decoded[i] - one_shot[i]));
    }
    std::printf("[ long     ] decode at %lld vs one-shot prefill: %lld/%zu logits bit-identical, max|d| %g\n",
                static_cast<long long>(mark), static_cast<long long>(same), decoded.size(), double(max_abs));
    EXPECT_EQ(same, int64_t(decoded.size())) << "at " << mark << " tokens";

    size_t fixed = 0;
    for (size_t il = 0; il < seq.layers.size(); ++il) {
      const LayerState& ls = seq.layers[il];
      const int ratio = c.ratio(int64_t(il));
      EXPECT_EQ(ls.compressed.rows(), ratio ? mark / ratio : 0) << "layer " << il << " at " << mark;
      EXPECT_EQ(ls.index_keys.rows(), ratio == 4 ? mark / 4 : 0) << "layer " << il << " at " << mark;
      fixed += (ls.ring.size() + ls.compressor.a.size() + ls.compressor.s.size() + ls.index_compressor.a.size() +
                ls.index_compressor.s.size()) * sizeof(float);
    }
    if (fixed_bytes == 0) fixed_bytes = fixed;
    EXPECT_EQ(fixed, fixed_bytes) << "the ring and the carries must not grow with the context";
    std::printf("[ long     ] state at %lld tokens: %zu bytes (fixed part %zu)\n", static_cast<long long>(mark),
                seq.bytes(), fixed);
  }
}

}  // namespace dsv4::test
