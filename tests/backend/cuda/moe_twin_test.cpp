// Twins of the MoE ops (cpu/moe.cpp ↔ cuda/moe.cu): score and hash routing, and the routed
// (FP4) plus shared (FP8) SwiGLU experts with the clamp.
#include "moe_case.h"

namespace dsv4::test {

TEST(CudaTwin, RouteAndMoe) {
  DSV4_REQUIRE_GPU();
  const int64_t vocab = 64;
  const std::vector<MoeCase> cases = {
      {1, 8, 256, 128, 2, false, true, 10.0},   // tiny config, decode
      {1, 8, 256, 128, 2, true, true, 10.0},    // hash layer
      {31, 8, 256, 128, 2, false, true, 10.0},  // tiny config, prefill
      {17, 33, 96, 64, 3, false, false, 0.0},   // odd expert count, no shared expert, no clamp
      {9, 33, 96, 64, 3, true, true, 0.5},      // hash, tight clamp
      {5, 256, 128, 64, 6, false, true, 10.0},  // V4-Flash expert count and k
      {90, 8, 256, 128, 2, false, true, 10.0},  // prefill on the tensor cores: rows grouped by expert
      {70, 33, 96, 64, 3, true, false, 0.5},    // … with a hash layer and partial expert tiles
  };
  for (const MoeCase& c : cases) {
    const MoeInputs in(c, vocab);
    expect_twins_both(in.name, [&](Side& s) {
      const MoeOutputs r = in.run(s, c);
      Outputs o;
      o.add("sel", r.sel);
      o.add("weights", r.weights);
      o.add("out", r.out);
      return o;
    });
  }
}

}  // namespace dsv4::test
