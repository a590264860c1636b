// Host memory for the CPU backend: 64-byte aligned buffers, and rows stored in a state layout.
#include <cstdlib>
#include <cstring>
#include <new>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

namespace dsv4::cpu {

static void* aligned(size_t bytes) {
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!p) fail(ErrorCode::out_of_memory, "cpu: cannot allocate {} bytes", bytes);
  return p;
}

float* CpuBackend::alloc(size_t n) { return static_cast<float*>(aligned(n * sizeof(float))); }
void CpuBackend::release(float* p) { std::free(p); }
int32_t* CpuBackend::alloc_ids(size_t n) { return static_cast<int32_t*>(aligned(n * sizeof(int32_t))); }
void CpuBackend::release_ids(int32_t* p) { std::free(p); }
void CpuBackend::copy(float* dst, const float* src, size_t n) { std::memmove(dst, src, n * sizeof(float)); }
void CpuBackend::to_host(float* dst, const float* src, size_t n) { std::memcpy(dst, src, n * sizeof(float)); }
void CpuBackend::from_host(float* dst, const float* src, size_t n) { std::memcpy(dst, src, n * sizeof(float)); }
void CpuBackend::ids_from_host(int32_t* dst, const int32_t* src, size_t n) {
  std::memcpy(dst, src, n * sizeof(int32_t));
}
void CpuBackend::fill(float* dst, float value, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = value;
}


void CpuBackend::pack_rows(const RowFormat& f, const float* rows, int64_t n, float* stored) {
  for (int64_t r = 0; r < n; ++r)
    if (!pack_row(f, rows + r * f.width, stored + r * f.stride))
      fail(ErrorCode::internal, "row {} of {} is not exactly representable in the compact state layout (format {}, "
           "width {}); the compact layout needs deepseek numerics", r, n, int(f.kind), f.width);
}

}  // namespace dsv4::cpu

namespace dsv4 {
std::unique_ptr<Backend> make_cpu_backend(Numerics numerics) {
  if (numerics == Numerics::deepseek_tc)
    fail(ErrorCode::invalid_input, "numerics 'deepseek-tc' runs prefill's products on a GPU's tensor cores, which the CPU "
         "has none of: use --device cuda, or 'deepseek' (the exact arithmetic) on the CPU");
  return std::make_unique<cpu::CpuBackend>(numerics);
}
}  // namespace dsv4
