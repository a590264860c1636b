// A barrier across the blocks of one grid, for kernels whose blocks are all resident at once (the
// grid no larger than one block per SM). The blocks of such a kernel, launched as a dependent one
// (launch.cuh), wait for SM room only on the kernel before it, which finishes; the kernel after it
// is only scheduled once all of this one's blocks have started. So every block gets to run and the
// barrier cannot hang.
//
// One 32-bit word in device memory serves every barrier of every launch, in stream order: the
// blocks add to it so that the adds of one barrier sum to 2^31 (block 0 adds 2^31 − (n − 1), the
// others 1), which flips the top bit and leaves the low bits as they were; a block waits until the
// top bit differs from what it was when it arrived. (Cooperative groups' grid sync works the same
// way, but needs a cooperative launch, which a dependent launch cannot be.) The word starts at
// zero and is zero again after every barrier all n blocks arrived at.
#pragma once

#include <cuda_runtime.h>

namespace dsv4::cuda {

// Block `block` of `blocks` (linear index) arrives: what it wrote before is visible to every block
// that waits on the returned ticket. Called by one thread of the block, after a __syncthreads():
// the release add orders the block's writes, which the barrier made this thread's, before it (as
// CUTLASS's barriers do; a __threadfence before it added a sequentially consistent fence: an H100
// took 2 447 cycles a barrier of 33 blocks with it, 1 773 without, bench/cuda/chain_latencies.cu).
__device__ __forceinline__ unsigned grid_arrive(unsigned* word, unsigned block, unsigned blocks) {
  const unsigned add = block == 0 ? 0x80000000u - (blocks - 1) : 1u;
  unsigned old;
  asm volatile("atom.add.release.gpu.u32 %0, [%1], %2;" : "=r"(old) : "l"(word), "r"(add) : "memory");
  return old;
}

// Waits, in one thread, until every block has arrived at the barrier whose ticket this is; what
// they wrote before arriving is then visible to this block after a __syncthreads() (read it with
// __ldcg: from L2, never from a line this SM's L1 kept).
__device__ __forceinline__ void grid_wait(const unsigned* word, unsigned ticket) {
  unsigned now;
  do asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(now) : "l"(word) : "memory");
  while (((now ^ ticket) & 0x80000000u) == 0);
}

// Every thread of the block: arrive, wait, and go on together.
__device__ __forceinline__ void grid_sync(unsigned* word, unsigned block, unsigned blocks) {
  __syncthreads();
  if (threadIdx.x == 0) grid_wait(word, grid_arrive(word, block, blocks));
  __syncthreads();
}

}  // namespace dsv4::cuda
