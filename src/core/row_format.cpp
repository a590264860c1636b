#include "core/row_format.h"

#include "core/error.h"

namespace dsv4 {

const char* to_string(StateLayout layout) { return layout == StateLayout::compact ? "compact" : "f32"; }

StateLayout parse_state_layout(const std::string& name) {
  if (name == "compact") return StateLayout::compact;
  if (name == "f32") return StateLayout::f32;
  fail(ErrorCode::invalid_input, "state layout '{}': expected 'compact' or 'f32'", name);
}

}  // namespace dsv4
