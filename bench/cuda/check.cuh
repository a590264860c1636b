// The microbenchmarks' check of a CUDA call: false, with "program: what: error" on stderr, when it
// failed.
#pragma once

#include <cuda_runtime.h>
#include <errno.h>  // program_invocation_short_name (glibc)

#include <cstdio>

inline bool check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "%s: %s: %s\n", program_invocation_short_name, what, cudaGetErrorString(e));
  return false;
}
