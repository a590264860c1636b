// Copies from global to shared memory that pass through no register (cp.async, sm_80 on), in
// groups a thread commits and then waits for, all but its newest few. Used by the decode GEMV's
// weight ring (gemm.cu), the integer tensor-core GEMM's plane staging (gemm_dmma.cu), and
// deepseek-tc's attention rows (attention_tc.cu, bf16 rows), experts' operands (gemm_experts_tc.cu) and
// dense FP8 products' token scales (gemm_fp8_tc.cu).
#pragma once

#include <cuda_runtime.h>

#include "backend/cuda/device_math.cuh"

namespace dsv4::cuda {

// 16 bytes from src (global) to shared memory at `to` (shared_address); zeros when !valid, and src,
// which must still be an address, is then not read.
__device__ __forceinline__ void copy_async_16(uint32_t to, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(to), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void copy_async_16(void* dst, const void* src, bool valid) {
  copy_async_16(shared_address(dst), src, valid);
}

// 4 bytes from src (global) to shared memory, both 4-byte aligned; a zero when !valid, as above.
__device__ __forceinline__ void copy_async_4(uint32_t to, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(to), "l"(src), "r"(valid ? 4 : 0) : "memory");
}
__device__ __forceinline__ void copy_async_4(void* dst, const void* src, bool valid) {
  copy_async_4(shared_address(dst), src, valid);
}

// Closes the thread's copies issued since the last commit into one group.
__device__ __forceinline__ void commit_async_copies() { asm volatile("cp.async.commit_group;" ::: "memory"); }

// Waits until at most kPending of the thread's committed groups are still in flight; what the
// others copied is then visible to this thread (to others after a barrier).
template <int kPending>
__device__ __forceinline__ void await_async_copies() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

}  // namespace dsv4::cuda
