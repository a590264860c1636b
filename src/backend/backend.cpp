#include "backend/backend.h"

#include "core/error.h"
#include "model/weights.h"

namespace dsv4 {

const char* to_string(Numerics numerics) { return numerics == Numerics::deepseek ? "deepseek" : "plain"; }

Numerics parse_numerics(const std::string& name) {
  if (name == "deepseek") return Numerics::deepseek;
  if (name == "plain") return Numerics::plain;
  fail(ErrorCode::invalid_input, "numerics '{}': expected 'deepseek' or 'plain'", name);
}

void Backend::grouped_linear(const model::Linear& W, Compute compute, const float* x, int64_t T, int64_t groups,
                             float* y) {
  DSV4_CHECK(groups > 0 && W.out % groups == 0, "{}: {} rows do not split into {} groups", W.name, W.out, groups);
  const int64_t R = W.out / groups;
  for (int64_t g = 0; g < groups; ++g) linear(W, compute, x + g * W.in, groups * W.in, T, y + g * R, W.out, g * R, R);
}

}  // namespace dsv4
