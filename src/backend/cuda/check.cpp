// The failure paths of check.h, compiled by the host compiler (they format with fmt).
#include "backend/cuda/check.h"

#include "backend/cuda/cuda.h"
#include "core/error.h"

namespace dsv4::cuda {

void fail_cuda(cudaError_t error, const char* what, const char* file, int line) {
  const ErrorCode code = error == cudaErrorMemoryAllocation ? ErrorCode::out_of_memory : ErrorCode::internal;
  fail(code, "cuda: {}:{}: {}: {} ({})", file, line, what, cudaGetErrorName(error), cudaGetErrorString(error));
}

void fail_check(const char* file, int line, const char* condition, const std::string& detail) {
  fail(ErrorCode::internal, "{}:{}: check failed: {}: {}", file, line, condition, detail);
}

void fail_unsupported(const std::string& message) { fail(ErrorCode::unsupported, "cuda: {}", message); }

}  // namespace dsv4::cuda

namespace dsv4 {

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" / "no device" error
    return 0;
  }
  return n;
}

std::string cuda_device_name() {
  int device = 0;
  cudaDeviceProp prop{};
  if (cuda_device_count() == 0 || cudaGetDevice(&device) != cudaSuccess ||
      cudaGetDeviceProperties(&prop, device) != cudaSuccess)
    return "";
  return prop.name;
}

}  // namespace dsv4
