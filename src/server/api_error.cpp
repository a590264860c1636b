#include "server/api_error.h"

namespace dsv4::server {

namespace {

// OpenAI's error types by status.
const char* error_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "service_unavailable_error";
  }
  return status >= 500 ? "server_error" : "invalid_request_error";
}

}  // namespace

nlohmann::json ApiError::body() const {
  nlohmann::json error = {{"message", what()}, {"type", error_type(status_)}};
  error["param"] = param_.empty() ? nlohmann::json(nullptr) : nlohmann::json(param_);
  error["code"] = code_.empty() ? nlohmann::json(nullptr) : nlohmann::json(code_);
  return {{"error", error}};
}

ApiError ApiError::from_error(const Error& e) {
  switch (e.code()) {
    case ErrorCode::invalid_input: return ApiError(400, e.what());
    case ErrorCode::not_found: return ApiError(404, e.what());
    case ErrorCode::unsupported: return ApiError(400, e.what(), {}, "unsupported");
    case ErrorCode::unavailable: return ApiError(503, e.what());
    case ErrorCode::out_of_memory:
    case ErrorCode::internal: break;
  }
  return ApiError(500, e.what());
}

}  // namespace dsv4::server
