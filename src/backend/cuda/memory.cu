// Device memory of the CUDA backend (twin of cpu/memory.cpp): activation, state and id buffers
// from the stream-ordered allocator, host↔device copies, rows stored in a state layout, and the
// upload-once cache of weights.
//
// Buffers come from StreamMemory (stream_memory.h): the stream-ordered pool, or a captured step's
// arena. The engine allocates a few buffers per op; the pool makes that cheap and keeps frees
// ordered after the kernels that use them.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/gemm_tc.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/weight_access.cuh"

namespace dsv4::cuda {

namespace {

// fill: one thread per element, grid-stride.
__global__ void fill_kernel(float* dst, float value, int64_t n) {
  await_previous_kernel();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = value;
}

// pack_rows: one thread per (row, part) (pack_row_part: a quantized block, or the tail). A row
// that does not come back exactly raises a flag in mapped host memory, read at the next to_host.
__global__ void pack_rows_kernel(RowFormat f, const float* rows, int64_t n, float* stored, DeviceFlags* flags) {
  await_previous_kernel();
  const int32_t parts = pack_parts(f);
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, r = i / parts;
  if (r < n && !pack_row_part(f, rows + r * f.width, stored + r * f.stride, int32_t(i % parts)))
    atomicOr(&flags->raised, kInexactRow);
}

__global__ void cyclic_ids_kernel(int32_t* ids, int64_t period, int64_t n) {
  await_previous_kernel();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    ids[i] = int32_t(i % period);
}

}  // namespace

CudaBackend::CudaBackend(Numerics numerics) : Backend(numerics) {
  if (cuda_device_count() == 0) fail_unsupported("no CUDA device is available");
  int device = 0;
  DSV4_CUDA_CHECK(cudaGetDevice(&device));
  DSV4_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device));
  part_arrivals_ = static_cast<unsigned*>(memory_.alloc_zeroed_now(2 * size_t(sm_count_) * sizeof(unsigned)));
  grid_barrier_ = static_cast<unsigned*>(memory_.alloc_zeroed_now(sizeof(unsigned)));
  DSV4_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&flags_), sizeof(DeviceFlags), cudaHostAllocMapped));
  *flags_ = DeviceFlags{};
  if (numerics == Numerics::deepseek_tc) tensor_cores_ = std::make_unique<TensorCoreGemm>();
  profile_ = profile_requested();
  // Off unless asked for: on an H100 they gained 2% at 4K and lost 6.5% at 1M (bench/cuda_decode.md).
  const char* graphs = std::getenv("DSV4_CUDA_GRAPHS");
  graphs_enabled_ = graphs && std::strcmp(graphs, "1") == 0;
}

CudaBackend::~CudaBackend() {
  // Nothing here may throw: errors at teardown are dropped.
  cudaStreamSynchronize(stream_);
  try {
    print_profile();
  } catch (...) {
  }
  if (flags_) cudaFreeHost(flags_);
  for (cudaEvent_t e : profile_events_)
    if (e) cudaEventDestroy(e);
  for (auto& [host, dev] : uploads_) cudaFree(dev.first);
  for (auto& [key, table] : tables_) cudaFree(table);
  if (part_arrivals_) cudaFree(part_arrivals_);
  if (grid_barrier_) cudaFree(grid_barrier_);
}

void CudaBackend::allow_shared_memory(const void* kernel, size_t bytes, const char* what) {
  if (shared_memory_optin_ == 0) {
    int device = 0;
    DSV4_CUDA_CHECK(cudaGetDevice(&device));
    DSV4_CUDA_CHECK(cudaDeviceGetAttribute(&shared_memory_optin_, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  }
  auto [it, first_use] = shared_memory_kernels_.try_emplace(kernel, 0);
  if (first_use) {  // the kernel's static shared memory counts against the same limit
    cudaFuncAttributes attributes{};
    DSV4_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
    it->second = shared_memory_optin_ - int(attributes.sharedSizeBytes);
    DSV4_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, it->second));
  }
  if (bytes > size_t(it->second))
    fail_unsupported(cat(what, ": ", bytes, " bytes of shared memory per block needed, the device allows ",
                         it->second));
}

// The driver's free memory plus what the pool holds unused (it keeps freed buffers for reuse).
size_t CudaBackend::device_memory_free() const {
  size_t free = 0, total = 0;
  DSV4_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  int device = 0;
  cudaMemPool_t pool = nullptr;
  uint64_t reserved = 0, used = 0;
  DSV4_CUDA_CHECK(cudaGetDevice(&device));
  DSV4_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
  DSV4_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved));
  DSV4_CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used));
  return free + size_t(reserved - used);
}

float* CudaBackend::alloc(size_t n) { return static_cast<float*>(memory_.alloc(n * sizeof(float))); }
void CudaBackend::release(float* p) { memory_.free(p); }
int32_t* CudaBackend::alloc_ids(size_t n) { return static_cast<int32_t*>(memory_.alloc(n * sizeof(int32_t))); }
void CudaBackend::release_ids(int32_t* p) { memory_.free(p); }

// The CPU copy is a memmove; device-to-device cudaMemcpy has no overlap guarantee, so an
// overlapping copy goes through a scratch buffer.
void CudaBackend::copy(float* dst, const float* src, size_t n) {
  Timed timed(*this, "copy");
  if (n == 0 || dst == src) return;
  const bool overlap = dst < src + n && src < dst + n;
  if (!overlap) {
    DSV4_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
    return;
  }
  DeviceArray<float> tmp(memory_, n);
  DSV4_CUDA_CHECK(cudaMemcpyAsync(tmp.get(), src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
  DSV4_CUDA_CHECK(cudaMemcpyAsync(dst, tmp.get(), n * sizeof(float), cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::fill(float* dst, float value, size_t n) {
  Timed timed(*this, "fill");
  if (n == 0) return;
  launch(fill_kernel, grid_for(int64_t(n), 256), 256, 0, stream_, dst, value, int64_t(n));
  DSV4_CUDA_LAUNCHED("fill");
}

void CudaBackend::to_host(float* host_dst, const float* src, size_t n) {
  if (n == 0) return;
  // The wait first: a copy into pageable memory returns only when the stream has drained, and
  // that wait would escape the host-wait figure (dsv4 bench's "waiting for the device").
  memory_.synchronize();
  DSV4_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  memory_.synchronize();
  profile_ = profile_requested();  // a caller may switch it on between forward passes
  const DeviceFlags flags = *flags_;
  *flags_ = DeviceFlags{};
  DSV4_CUDA_REQUIRE(!(flags.raised & kBadToken), "embed: token id ", flags.bad_token, " outside the vocabulary");
  DSV4_CUDA_REQUIRE(!(flags.raised & kInexactRow), "a row stored in the compact state layout did not come back "
                    "exactly (the compact layout needs deepseek numerics)");
}

void CudaBackend::pack_rows(const RowFormat& f, const float* rows, int64_t n, float* stored) {
  Timed timed(*this, "pack_rows");
  if (n == 0) return;
  launch(pack_rows_kernel, grid_for(n * pack_parts(f), 64), 64, 0, stream_, f, rows, n, stored, flags_);
  DSV4_CUDA_LAUNCHED("pack_rows");
}

void CudaBackend::from_host(float* dst, const float* host_src, size_t n) {
  memory_.copy_from_host(dst, host_src, n * sizeof(float));
}

void CudaBackend::ids_from_host(int32_t* dst, const int32_t* host_src, size_t n) {
  memory_.copy_from_host(dst, host_src, n * sizeof(int32_t));
}

// ---- weights ------------------------------------------------------------------------------------

// Keyed by host address and size: the model's arrays live as long as the model, which outlives
// the backend's use of them (backend.h). A different size at a known address (a freed and
// reused host block) uploads afresh.
const void* CudaBackend::upload(const void* host, size_t bytes) {
  if (!host || bytes == 0) return nullptr;
  auto it = uploads_.find(host);
  if (it != uploads_.end()) {
    if (it->second.second == bytes) return it->second.first;
    memory_.retire(it->second.first);  // queued kernels may still read the old copy
    uploads_.erase(it);
  }
  void* dev = memory_.alloc_copy_now(host, bytes);
  uploads_[host] = {dev, bytes};
  return dev;
}

const float* CudaBackend::device_floats(const std::vector<float>& v) {
  return static_cast<const float*>(upload(v.data(), v.size() * sizeof(float)));
}

const int32_t* CudaBackend::device_ints(const std::vector<int32_t>& v) {
  return static_cast<const int32_t*>(upload(v.data(), v.size() * sizeof(int32_t)));
}

LinearView CudaBackend::device_linear(const model::Linear& W) {
  LinearView v;
  v.format = int32_t(W.format);
  v.scale_is_f32 = W.scale_is_f32 ? 1 : 0;
  v.out = W.out;
  v.in = W.in;
  v.scale_cols = W.scale_cols;
  v.data = static_cast<const uint8_t*>(upload(W.data, size_t(W.out * row_bytes(v.format, W.in))));
  if (W.scale) {
    const int64_t scale_rows = W.format == model::WeightFormat::fp8 ? (W.out + 127) / 128 : W.out;
    v.scale = static_cast<const uint8_t*>(upload(W.scale, size_t(scale_rows * W.scale_cols) * (W.scale_is_f32 ? 4 : 1)));
  }
  return v;
}

const LinearView* CudaBackend::device_expert_table(const model::MoeWeights& m, int which) {
  DSV4_CUDA_REQUIRE(!m.experts.empty(), "moe: no routed experts");
  auto pick = [which](const model::ExpertWeights& e) -> const model::Linear& {
    return which == 1 ? e.w1 : which == 3 ? e.w3 : e.w2;
  };
  const void* key = &pick(m.experts[0]);
  if (auto it = tables_.find({key, 0}); it != tables_.end()) return it->second;
  std::vector<LinearView> views;
  for (const model::ExpertWeights& e : m.experts) views.push_back(device_linear(pick(e)));
  return device_views({key, 0}, views);
}

// View g is W's rows [g·R, (g+1)·R): its data and, for FP8 (one scale row per 128 weight rows,
// so R must be a multiple of 128: the caller checks) or FP4 (one per row), its scales.
const LinearView* CudaBackend::device_group_table(const model::Linear& W, int64_t groups) {
  if (auto it = tables_.find({&W, groups}); it != tables_.end()) return it->second;
  const LinearView whole = device_linear(W);
  const int64_t R = W.out / groups;
  const int64_t scale_rows = W.format == model::WeightFormat::fp8 ? R / 128 : R;
  std::vector<LinearView> views(size_t(groups), whole);
  for (int64_t g = 0; g < groups; ++g) {
    LinearView& v = views[size_t(g)];
    v.out = R;
    v.data = whole.data + g * R * row_bytes(whole.format, W.in);
    if (whole.scale) v.scale = whole.scale + g * scale_rows * W.scale_cols * (W.scale_is_f32 ? 4 : 1);
  }
  return device_views({&W, groups}, views);
}

const LinearView* CudaBackend::device_views(std::pair<const void*, int64_t> key, const std::vector<LinearView>& views) {
  auto* dev = static_cast<LinearView*>(memory_.alloc_copy_now(views.data(), views.size() * sizeof(LinearView)));
  tables_[key] = dev;
  return dev;
}

const int32_t* CudaBackend::cyclic_ids(int64_t period, int64_t n) {
  const bool refill = period != cyclic_period_ || n > cyclic_n_;
  if (refill) {
    cyclic_n_ = std::max(n, period == cyclic_period_ ? 2 * cyclic_n_ : n);
    cyclic_period_ = period;
  }
  int32_t* ids = static_cast<int32_t*>(cyclic_ids_.get(memory_, size_t(cyclic_n_) * sizeof(int32_t)));
  if (refill) {
    launch(cyclic_ids_kernel, grid_for(cyclic_n_, 256), 256, 0, stream_, ids, period, cyclic_n_);
    DSV4_CUDA_LAUNCHED("cyclic ids");
  }
  return ids;
}

}  // namespace dsv4::cuda

namespace dsv4 {
std::unique_ptr<Backend> make_cuda_backend(Numerics numerics) { return std::make_unique<cuda::CudaBackend>(numerics); }
}  // namespace dsv4
