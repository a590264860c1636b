#include "core/error.h"

namespace dsv4 {

const char* to_string(ErrorCode code) {
  switch (code) {
    case ErrorCode::invalid_input: return "invalid input";
    case ErrorCode::not_found: return "not found";
    case ErrorCode::unsupported: return "unsupported";
    case ErrorCode::out_of_memory: return "out of memory";
    case ErrorCode::unavailable: return "unavailable";
    case ErrorCode::internal: return "internal error";
  }
  return "error";
}

}  // namespace dsv4
