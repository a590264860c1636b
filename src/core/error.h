// dsv4::Error: the one error type of the project.
//
// An error carries a code (which the CLI maps to an exit code and the server to an HTTP status)
// and a message shaped "where: what: got vs expected". Context is prepended on the way up
// (file, then tensor, then field) with Error::within(). Nothing under src/ exits or aborts.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace dsv4 {

enum class ErrorCode {
  invalid_input,
  not_found,
  unsupported,
  out_of_memory,
  unavailable,  // cannot take the work now, try later (the server's queue is full, it is shutting down)
  internal,
};

const char* to_string(ErrorCode code);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const { return code_; }
  // The same error with "where: " in front of the message.
  Error within(const std::string& where) const { return Error(code_, where + ": " + what()); }

 private:
  ErrorCode code_;
};

template <class... Args>
[[noreturn]] void fail(ErrorCode code, fmt::format_string<Args...> format, Args&&... args) {
  throw Error(code, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace dsv4

// Always-on invariant check; the message names the failed condition and the formatted values.
#define DSV4_CHECK(cond, ...)                                                                  \
  do {                                                                                         \
    if (!(cond))                                                                               \
      ::dsv4::fail(::dsv4::ErrorCode::internal, "{}:{}: check failed: {}: {}", __FILE__,      \
                   __LINE__, #cond, ::fmt::format(__VA_ARGS__));                               \
  } while (0)
