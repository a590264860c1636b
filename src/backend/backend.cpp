#include "backend/backend.h"

#include "core/error.h"

namespace dsv4 {

const char* to_string(Numerics numerics) { return numerics == Numerics::deepseek ? "deepseek" : "plain"; }

Numerics parse_numerics(const std::string& name) {
  if (name == "deepseek") return Numerics::deepseek;
  if (name == "plain") return Numerics::plain;
  fail(ErrorCode::invalid_input, "numerics '{}': expected 'deepseek' or 'plain'", name);
}

}  // namespace dsv4
