// Kernel launches as programmatic dependent launches (Hopper): a kernel's blocks may be scheduled
// while the kernel before it on the stream is still running, and they wait in
// await_previous_kernel() until that kernel has completed and its writes are visible. Between two
// dependent kernels the GPU then spends the wait's exit instead of a launch (≈ 2.4 µs each on an
// H200, and a decoded token runs ≈ 200 kernels). Measured on an H200 (4 V4-Flash layers,
// bench/results/cuda_launch_h200.log): decode +12% (438 against 390 tok/s at 4K), but a 4K
// prefill −5% (7 350 against 7 710 tok/s). Making one kernel's launches plain at a time
// (DSV4_CUDA_SERIAL_LAUNCHES, below) found the cost in the FP64 tensor-core GEMM alone (7 905 tok/s
// with its launches plain, 7 500 with none, 7 867 with all): it is launched plain
// (Launch::plain, gemm_dmma.cu).
//
// The rule that keeps it exact: every kernel launched with launch() calls await_previous_kernel()
// before any access to global memory, weights excepted (no kernel writes them; the GEMV stages its
// first weight chunks before it waits). Then it sees everything the previous kernel wrote, and the
// previous kernel had itself waited for its own predecessor, so the stream's order holds as with
// <<<>>>. Only then does it let the next kernel's blocks be scheduled.
#pragma once

#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <utility>

namespace dsv4::cuda {

__device__ __forceinline__ void await_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether a kernel's launches are dependent ones: on devices that schedule them early (compute
// capability 9.0 on; asked once, of the device current at the first launch), unless
// DSV4_CUDA_SERIAL_LAUNCHES says otherwise: "1" makes every launch plain (to measure what dependent
// launches buy), any other text the launches of the kernels whose mangled name contains it (to
// find which kernels' dependent launches cost, as prefill's do).
inline bool launches_dependently(const void* kernel) {
  static const char* const serial = std::getenv("DSV4_CUDA_SERIAL_LAUNCHES");
  static const bool supported = [] {
    int device = 0, major = 0;
    return cudaGetDevice(&device) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess && major >= 9;
  }();
  if (!supported) return false;
  if (serial == nullptr) return true;
  if (std::strcmp(serial, "1") == 0) return false;
  const char* name = nullptr;
  if (cudaFuncGetName(&name, kernel) != cudaSuccess) {
    (void)cudaGetLastError();  // not a launch failure: DSV4_CUDA_LAUNCHED reads the last error
    return true;
  }
  return std::strstr(name, serial) == nullptr;
}

// How a kernel is launched: early, as a dependent of the kernel before it (the default), or plain,
// once that kernel has finished (for kernels whose early launch measured slower).
enum class Launch { dependent, plain };

// kernel<<<grid, block, smem, stream>>>(args...), by default as a programmatic dependent launch.
// Launch errors are left for DSV4_CUDA_LAUNCHED, which follows every launch.
template <Launch kMode = Launch::dependent, class... Params, class... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = kMode == Launch::dependent && launches_dependently(reinterpret_cast<const void*>(kernel)) ? 1 : 0;
  (void)cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace dsv4::cuda
