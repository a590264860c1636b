// The compact state layout against the fp32 one (issue 6): on tiny-flash in deepseek numerics the
// two give bitwise-equal rows once decoded, and identical logits through prefill chunks and
// decode; plain numerics refuse the compact layout.
#include <gtest/gtest.h>

#include <cstring>

#include "core/error.h"
#include "engine/engine.h"
#include "fixtures.h"

namespace dsv4::engine {
namespace {

// A store's rows decoded to fp32 (the backend is the CPU: its buffers are host memory).
std::vector<float> decoded(const RowStore& store) {
  const RowFormat& f = store.format();
  std::vector<float> rows(size_t(store.rows() * f.width));
  for (int64_t r = 0; r < store.rows(); ++r)
    for (int64_t i = 0; i < f.width; ++i) rows[size_t(r * f.width + i)] = row_value(f, store.data() + r * f.stride, i);
  return rows;
}

TEST(StateLayout, CompactAndF32GiveEqualRowsAndIdenticalLogits) {
  const auto model = Model::load(test::fixture_model("tiny-flash"));
  const std::vector<int32_t> tokens = test::read_tokens(test::fixture_logits("tiny-flash") + "/tokens.json");
  ASSERT_GE(tokens.size(), 700u);
  Engine compact(*model, make_cpu_backend(Numerics::deepseek), StateLayout::compact);
  Engine f32(*model, make_cpu_backend(Numerics::deepseek), StateLayout::f32);
  SequenceState a = compact.new_sequence(), b = f32.new_sequence();
  const std::span<const int32_t> prompt = std::span<const int32_t>(tokens).first(640);

  std::vector<float> la = compact.prefill(a, prompt, 200, false), lb = f32.prefill(b, prompt, 200, false);
  for (int step = 0; step < 40; ++step) {  // past a compressed row of every kind
    ASSERT_EQ(la.size(), lb.size());
    ASSERT_EQ(std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)), 0) << "logits differ at step " << step;
    const int32_t next = tokens[640 + size_t(step)];
    la = compact.forward(a, std::span<const int32_t>(&next, 1), false);
    lb = f32.forward(b, std::span<const int32_t>(&next, 1), false);
  }
  int64_t compared = 0;
  for (size_t il = 0; il < a.layers.size(); ++il)
    for (auto [x, y] : {std::pair{&a.layers[il].compressed, &b.layers[il].compressed},
                        {&a.layers[il].index_keys, &b.layers[il].index_keys}}) {
      ASSERT_EQ(x->rows(), y->rows()) << "layer " << il;
      if (x->rows() == 0) continue;
      EXPECT_EQ(x->format().kind == RowFormat::f32, false) << "layer " << il << ": rows not compact";
      const std::vector<float> dx = decoded(*x), dy = decoded(*y);
      EXPECT_EQ(std::memcmp(dx.data(), dy.data(), dx.size() * sizeof(float)), 0) << "layer " << il;
      compared += x->rows();
    }
  EXPECT_GT(compared, 0);
  EXPECT_LT(a.bytes(), b.bytes());
}

TEST(StateLayout, PlainNumericsRefuseTheCompactLayout) {
  const auto model = Model::load(test::fixture_model("tiny-flash"));
  Engine engine(*model, make_cpu_backend(Numerics::plain), StateLayout::compact);
  try {
    engine.new_sequence();
    FAIL() << "plain numerics accepted the compact layout";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("compact state layout"), std::string::npos) << e.what();
  }
  EXPECT_EQ(Engine(*model, make_cpu_backend(Numerics::plain)).state_layout(), StateLayout::f32);
  EXPECT_EQ(Engine(*model, make_cpu_backend(Numerics::deepseek)).state_layout(), StateLayout::compact);
}

}  // namespace
}  // namespace dsv4::engine
