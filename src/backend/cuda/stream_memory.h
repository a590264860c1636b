// The CUDA backend's stream and the memory that follows its order, eager or captured.
//
// Eager, buffers come from the stream-ordered pool (cudaMallocAsync): a free is queued after the
// kernels that use the buffer. While a step is captured into a CUDA graph (capture.cpp) the pool
// cannot serve it: an allocation inside a capture becomes a graph memory node, which graph update
// does not handle, and a buffer allocated outside a graph cannot be freed inside one. So, while
// capturing:
//   - buffers come from a step arena, handed out in order and reused by the next captured step
//     (each step runs to completion first: its logits are read back); a step is recorded in a few
//     parts, each launched as soon as it is recorded, and the arena serves all of them;
//   - frees of pool buffers wait until the graph has been launched;
//   - host data copied in (token ids) is staged in pinned memory, which the graph reads at launch;
//   - one-time memory (uploaded weights, view tables, grown scratch) is made at once, outside the
//     capture: cudaMalloc, then a copy or a fill on a side stream that is waited for.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "backend/cuda/check.h"

namespace dsv4::cuda {

// Memory handed out in order from a few large blocks and taken back all at once (reset()). A
// request that does not fit opens a new block; reset() merges them into one of their total size,
// so a steady state needs one block. Used for the step arena (device) and the staging (pinned host).
class BumpBlocks {
 public:
  using Allocate = void* (*)(size_t bytes);
  using Free = void (*)(void* p);
  BumpBlocks(Allocate allocate, Free free, size_t first_bytes) : allocate_(allocate), free_(free), first_(first_bytes) {}
  ~BumpBlocks();
  BumpBlocks(const BumpBlocks&) = delete;
  BumpBlocks& operator=(const BumpBlocks&) = delete;
  void* take(size_t bytes);  // 256-byte aligned
  void reset();              // every block handed out is dead
  bool holds(const void* p) const;
  size_t bytes() const;

 private:
  struct Block {
    char* base;
    size_t bytes;
  };
  Allocate allocate_;
  Free free_;
  size_t first_;
  std::vector<Block> blocks_;
  size_t current_ = 0, used_ = 0;  // the block being handed out and its bytes used
};

class StreamMemory {
 public:
  StreamMemory();
  ~StreamMemory();
  StreamMemory(const StreamMemory&) = delete;
  StreamMemory& operator=(const StreamMemory&) = delete;
  cudaStream_t stream() const { return stream_; }

  // A buffer in stream order: from the pool, or from the step arena while capturing.
  void* alloc(size_t bytes);
  // Never throws (Buffer destructors): a failure is left as the runtime's last error, which the
  // next checked launch reports.
  void free(void* p) noexcept;

  // One-time memory, outside any capture, ready when these return; given back with retire().
  void* alloc_zeroed_now(size_t bytes);
  void* alloc_copy_now(const void* host, size_t bytes);
  // cudaFree of one-time memory once the work queued so far has finished (at the next wait).
  void retire(void* p) noexcept;

  // Copies host memory to the device in stream order; the caller may free `host` on return.
  void copy_from_host(void* dst, const void* host, size_t bytes);

  // Waits for the stream's queued work, adding the time to host_wait_seconds().
  void synchronize();
  double host_wait_seconds() const { return host_wait_s_; }

  // Records the stream's work from here into a graph instead of running it: the first part of a
  // captured step. Waits for the work queued before (the arena and the staging are reused), and
  // fails if a buffer of the last captured step is still held: it would be overwritten.
  void begin_capture();
  // Records the next part of the same step: the arena and the staging go on where the last part
  // left them, since the parts launched before may still be running and reading them.
  void resume_capture();
  bool capturing() const { return capturing_; }
  // Ends the part being recorded and, when `launch` is given, hands it the graph to run on the
  // stream; without one (an error inside the capture), the recorded work is dropped. Either way
  // the frees deferred meanwhile are then queued. Nothing to do when no part is being recorded.
  void end_capture(const std::function<void(cudaGraph_t)>& launch);
  size_t arena_bytes() const { return arena_.bytes(); }

 private:
  void run_deferred_frees() noexcept;
  cudaStream_t stream_ = nullptr;
  cudaStream_t side_ = nullptr;  // one-time copies and fills, outside the capture
  bool capturing_ = false;
  BumpBlocks arena_, staging_;
  int64_t arena_live_ = 0;  // arena buffers handed out and not yet freed
  std::vector<void*> deferred_frees_, retired_;
  double host_wait_s_ = 0;
};

// Stream-ordered scratch memory, freed (in stream order) when it goes out of scope.
template <class T>
class DeviceArray {
 public:
  DeviceArray(StreamMemory& memory, size_t n)
      : memory_(memory), p_(n ? static_cast<T*>(memory.alloc(n * sizeof(T))) : nullptr) {}
  ~DeviceArray() {
    if (p_) memory_.free(p_);
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* get() const { return p_; }

 private:
  StreamMemory& memory_;
  T* p_ = nullptr;
};

// Device memory kept between calls for reuse, grown on demand: a request for more than it holds
// retires the old block (freed once the work queued on it is done) and makes one of at least
// twice its size, zero-filled. Work in stream order can share it: one call's contents are dead
// when the next is queued.
class GrownBuffer {
 public:
  GrownBuffer() = default;
  ~GrownBuffer() {
    if (p_) cudaFree(p_);  // at teardown: errors are dropped
  }
  GrownBuffer(const GrownBuffer&) = delete;
  GrownBuffer& operator=(const GrownBuffer&) = delete;
  // At least `bytes` bytes, 256-byte aligned.
  void* get(StreamMemory& memory, size_t bytes) {
    if (bytes > bytes_) {
      if (p_) memory.retire(p_);
      p_ = nullptr;
      bytes_ = std::max(bytes, 2 * bytes_);
      p_ = memory.alloc_zeroed_now(bytes_);
    }
    return p_;
  }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace dsv4::cuda
