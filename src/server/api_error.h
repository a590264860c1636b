// The server's error as OpenAI clients expect it: an HTTP status and the body
// {"error": {"message", "type", "param", "code"}}. dsv4::Error codes map onto it in one place
// (from_error), so every handler reports failures the same way.
#pragma once

#include <nlohmann/json.hpp>

#include <stdexcept>
#include <string>

#include "core/error.h"

namespace dsv4::server {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = {}, std::string code = {})
      : std::runtime_error(std::move(message)), status_(status), param_(std::move(param)), code_(std::move(code)) {}
  int status() const { return status_; }
  nlohmann::json body() const;
  // invalid_input → 400, not_found → 404, unsupported → 400, unavailable → 503, others → 500.
  static ApiError from_error(const Error& e);

 private:
  int status_;
  std::string param_, code_;
};

// A 400 naming the request field.
[[noreturn]] inline void bad_field(const std::string& param, const std::string& message) {
  throw ApiError(400, param + ": " + message, param);
}

}  // namespace dsv4::server
