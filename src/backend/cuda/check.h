// Error handling of the CUDA backend: every runtime call is wrapped in DSV4_CUDA_CHECK and every
// kernel launch is followed by DSV4_CUDA_LAUNCHED(op); failures become dsv4::Error naming the op,
// never an abort (style.md "Errors").
//
// This header is free of fmt: nvcc's front end rejects fmt's consteval format strings, so the
// failure paths are out-of-line functions (check.cpp, compiled by the host compiler) and messages
// are built with cat() only when a check fails.
#pragma once

#include <cuda_runtime.h>

#include <sstream>
#include <string>

namespace dsv4::cuda {

[[noreturn]] void fail_cuda(cudaError_t error, const char* what, const char* file, int line);
[[noreturn]] void fail_check(const char* file, int line, const char* condition, const std::string& detail);
[[noreturn]] void fail_unsupported(const std::string& message);

inline void check_launch(const char* op, const char* file, int line) {
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) fail_cuda(error, op, file, line);
}

template <class... Args>
std::string cat(const Args&... args) {
  std::ostringstream s;
  (s << ... << args);
  return s.str();
}

}  // namespace dsv4::cuda

#define DSV4_CUDA_CHECK(expr)                                                         \
  do {                                                                                \
    const cudaError_t dsv4_cuda_error_ = (expr);                                      \
    if (dsv4_cuda_error_ != cudaSuccess)                                              \
      ::dsv4::cuda::fail_cuda(dsv4_cuda_error_, #expr, __FILE__, __LINE__);           \
  } while (0)

// After a kernel launch: a bad configuration or an earlier asynchronous fault, named by op.
#define DSV4_CUDA_LAUNCHED(op) ::dsv4::cuda::check_launch("kernel " op, __FILE__, __LINE__)

// Argument checks in CUDA sources (the DSV4_CHECK of the CPU side, without fmt).
#define DSV4_CUDA_REQUIRE(cond, ...)                                                                 \
  do {                                                                                               \
    if (!(cond)) ::dsv4::cuda::fail_check(__FILE__, __LINE__, #cond, ::dsv4::cuda::cat(__VA_ARGS__)); \
  } while (0)
