// StreamMemory and BumpBlocks (stream_memory.h). Host code only.
#include "backend/cuda/stream_memory.h"

#include <chrono>
#include <cstring>

namespace dsv4::cuda {

namespace {

constexpr size_t kAlignment = 256;
constexpr size_t kFirstArenaBytes = size_t(64) << 20;  // a decode step of V4-Flash at 1M uses a few MiB
constexpr size_t kFirstStagingBytes = size_t(64) << 10;

void* device_block(size_t bytes) {
  void* p = nullptr;
  DSV4_CUDA_CHECK(cudaMalloc(&p, bytes));
  return p;
}
void free_device_block(void* p) { (void)cudaFree(p); }
void* pinned_block(size_t bytes) {
  void* p = nullptr;
  DSV4_CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocDefault));
  return p;
}
void free_pinned_block(void* p) { (void)cudaFreeHost(p); }

}  // namespace

// ---- BumpBlocks ---------------------------------------------------------------------------------

BumpBlocks::~BumpBlocks() {
  for (const Block& b : blocks_) free_(b.base);
}

void* BumpBlocks::take(size_t bytes) {
  bytes = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  while (current_ < blocks_.size() && used_ + bytes > blocks_[current_].bytes) ++current_, used_ = 0;
  if (current_ == blocks_.size()) {
    const size_t grown = std::max(bytes, blocks_.empty() ? first_ : 2 * blocks_.back().bytes);
    blocks_.push_back({static_cast<char*>(allocate_(grown)), grown});
    used_ = 0;
  }
  void* p = blocks_[current_].base + used_;
  used_ += bytes;
  return p;
}

void BumpBlocks::reset() {
  if (blocks_.size() > 1) {
    const size_t total = bytes();
    for (const Block& b : blocks_) free_(b.base);
    blocks_.clear();
    blocks_.push_back({static_cast<char*>(allocate_(total)), total});
  }
  current_ = 0, used_ = 0;
}

bool BumpBlocks::holds(const void* p) const {
  const char* c = static_cast<const char*>(p);
  for (const Block& b : blocks_)
    if (c >= b.base && c < b.base + b.bytes) return true;
  return false;
}

size_t BumpBlocks::bytes() const {
  size_t total = 0;
  for (const Block& b : blocks_) total += b.bytes;
  return total;
}

// ---- StreamMemory -------------------------------------------------------------------------------

// The pool keeps what it has grown to (release threshold: unlimited): by default it hands freed
// memory back to the driver at every synchronisation, so each decode step (which synchronises to
// read its logits) paid for mapping its buffers afresh.
StreamMemory::StreamMemory()
    : arena_(device_block, free_device_block, kFirstArenaBytes),
      staging_(pinned_block, free_pinned_block, kFirstStagingBytes) {
  DSV4_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  DSV4_CUDA_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
  int device = 0;
  cudaMemPool_t pool = nullptr;
  uint64_t keep_all = UINT64_MAX;
  DSV4_CUDA_CHECK(cudaGetDevice(&device));
  DSV4_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
  DSV4_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all));
}

// Nothing here may throw: errors at teardown are dropped.
StreamMemory::~StreamMemory() {
  if (capturing_) {
    cudaGraph_t graph = nullptr;
    if (cudaStreamEndCapture(stream_, &graph) == cudaSuccess && graph) cudaGraphDestroy(graph);
  }
  cudaStreamSynchronize(stream_);
  run_deferred_frees();
  cudaStreamSynchronize(stream_);
  for (void* p : retired_) cudaFree(p);
  cudaStreamDestroy(side_);
  cudaStreamDestroy(stream_);
}

void* StreamMemory::alloc(size_t bytes) {
  if (capturing_) {
    ++arena_live_;
    return arena_.take(bytes);
  }
  void* p = nullptr;
  DSV4_CUDA_CHECK(cudaMallocAsync(&p, bytes, stream_));
  return p;
}

void StreamMemory::free(void* p) noexcept {
  if (arena_.holds(p))
    --arena_live_;
  else if (capturing_)
    deferred_frees_.push_back(p);
  else
    (void)cudaFreeAsync(p, stream_);
}

void* StreamMemory::alloc_zeroed_now(size_t bytes) {
  void* p = device_block(bytes);
  DSV4_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, side_));
  DSV4_CUDA_CHECK(cudaStreamSynchronize(side_));
  return p;
}

// A pageable source is staged by the runtime; the wait makes the copy complete either way.
void* StreamMemory::alloc_copy_now(const void* host, size_t bytes) {
  void* p = device_block(bytes);
  DSV4_CUDA_CHECK(cudaMemcpyAsync(p, host, bytes, cudaMemcpyHostToDevice, side_));
  DSV4_CUDA_CHECK(cudaStreamSynchronize(side_));
  return p;
}

void StreamMemory::retire(void* p) noexcept { retired_.push_back(p); }

// Eager, a pageable source is copied to the runtime's staging before cudaMemcpyAsync returns; a
// capture records a copy that runs at launch, so it reads from staging of our own.
void StreamMemory::copy_from_host(void* dst, const void* host, size_t bytes) {
  if (bytes == 0) return;
  const void* src = host;
  if (capturing_) {
    void* staged = staging_.take(bytes);
    std::memcpy(staged, host, bytes);
    src = staged;
  }
  DSV4_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
}

void StreamMemory::synchronize() {
  DSV4_CUDA_REQUIRE(!capturing_, "a wait for the device inside a captured step (the step must not read results "
                    "back before it ends)");
  const auto t0 = std::chrono::steady_clock::now();
  DSV4_CUDA_CHECK(cudaStreamSynchronize(stream_));
  host_wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (void* p : retired_) DSV4_CUDA_CHECK(cudaFree(p));
  retired_.clear();
}

void StreamMemory::begin_capture() {
  synchronize();
  DSV4_CUDA_REQUIRE(arena_live_ == 0, arena_live_, " buffers of the last captured step are still held; the next "
                    "step would overwrite them");
  arena_.reset();
  staging_.reset();
  resume_capture();
}

// Relaxed: the one-time allocations and side-stream copies of stream_memory.h are allowed meanwhile.
void StreamMemory::resume_capture() {
  DSV4_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
  capturing_ = true;
}

void StreamMemory::end_capture(const std::function<void(cudaGraph_t)>& launch) {
  if (!capturing_) return;
  capturing_ = false;
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
  struct Cleanup {  // the graph and the deferred frees, however this returns
    StreamMemory& m;
    cudaGraph_t& g;
    ~Cleanup() {
      if (g) cudaGraphDestroy(g);
      m.run_deferred_frees();
    }
  } cleanup{*this, graph};
  if (!launch) {
    (void)cudaGetLastError();  // an invalidated capture's error belongs to the failure being unwound
    return;
  }
  DSV4_CUDA_CHECK(ended);
  launch(graph);
}

void StreamMemory::run_deferred_frees() noexcept {
  for (void* p : deferred_frees_) (void)cudaFreeAsync(p, stream_);
  deferred_frees_.clear();
}

}  // namespace dsv4::cuda
