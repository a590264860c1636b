// Kernel launches as programmatic dependent launches (Hopper): a kernel's blocks may be scheduled
// while the kernel before it on the stream is still running, and they wait in
// await_previous_kernel() until that kernel has completed and its writes are visible. Between two
// dependent kernels the GPU then spends the wait's exit instead of a launch (≈ 2.4 µs each on an
// H200, and a decoded token runs ≈ 200 kernels).
//
// The rule that keeps it exact: every kernel launched with launch() calls await_previous_kernel()
// as its first statement, before any access to global memory. Then it sees everything the
// previous kernel wrote, and the previous kernel had itself waited for its own predecessor, so the
// stream's order holds as with <<<>>>. Only then does it let the next kernel's blocks be scheduled
// (let_next_kernel_in), at once or, in the long kernels, after their main loop.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <utility>

#include "backend/cuda/check.h"

namespace dsv4::cuda {

// Lets the next kernel's blocks be scheduled (once every block of this kernel has called it or
// exited); they then wait in their own await_previous_kernel().
__device__ __forceinline__ void let_next_kernel_in() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Every kernel's first statement. let_next_in = false: the kernel calls let_next_kernel_in() itself,
// after its main loop. The tensor-core GEMMs and prefill attention do: with the next kernel's
// blocks let in at their start, a 4K prefill ran 5% slower on an H200 (7 370 against 7 740 tok/s),
// as blocks waiting beside them from their last wave on held the SMs' slots and issue.
__device__ __forceinline__ void await_previous_kernel(bool let_next_in = true) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  if (let_next_in) let_next_kernel_in();
}

// Whether launches are dependent ones: on devices that schedule them early (compute capability 9.0
// on; asked once, of the device current at the first launch), unless DSV4_CUDA_SERIAL_LAUNCHES is
// set (to measure what they buy, or to rule them out). Otherwise launch() is a plain launch.
inline bool dependent_launch_supported() {
  static const bool supported = [] {
    int device = 0, major = 0;
    return std::getenv("DSV4_CUDA_SERIAL_LAUNCHES") == nullptr && cudaGetDevice(&device) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess && major >= 9;
  }();
  return supported;
}

// Grids of more blocks launch plainly: a kernel of many waves gains little from an early start,
// and with every launch dependent a 4K prefill (its GEMMs and attention thousands of blocks each)
// ran 5% slower on an H200 (7 350 against 7 710 tok/s), decode 13% faster.
constexpr unsigned kMaxDependentBlocks = 1024;

// kernel<<<grid, block, smem, stream>>>(args...), as a programmatic dependent launch for grids of
// up to kMaxDependentBlocks blocks. Launch errors are left for DSV4_CUDA_LAUNCHED, which follows
// every launch.
template <class... Params, class... Args>
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
  const bool dependent = dependent_launch_supported() && uint64_t(grid.x) * grid.y * grid.z <= kMaxDependentBlocks;
  config.numAttrs = dependent ? 1 : 0;
  (void)cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace dsv4::cuda
