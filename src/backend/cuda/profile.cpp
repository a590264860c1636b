// Per-op GPU time of the CUDA backend (DSV4_CUDA_PROFILE=1; see cuda_backend.h), for finding
// where a decoded token's time goes (dsv4 bench). Host code only.
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/gemm_tc.h"

namespace dsv4::cuda {

namespace {

// "layers.12.attn.wq_a.weight" → "attn.wq_a": one class across layers.
std::string op_class(const std::string& weight) {
  std::string s = weight;
  if (s.rfind("layers.", 0) == 0) {
    const size_t dot = s.find('.', 7);
    if (dot != std::string::npos) s = s.substr(dot + 1);
  }
  if (s.size() > 7 && s.compare(s.size() - 7, 7, ".weight") == 0) s.resize(s.size() - 7);
  return s;
}

}  // namespace

CudaBackend::Timed::Timed(CudaBackend& b, const char* op, const std::string& detail, double bytes, double flops)
    : b_(b), bytes_(bytes), flops_(flops), active_(b.profile_ && b.profile_depth_ == 0),
      setups_before_(b.setups()) {
  ++b_.profile_depth_;
  if (!active_) return;  // (every op makes one: nothing to format unless it is timed)
  name_ = detail.empty() ? std::string(op) : fmt::format("{} {}", op, op_class(detail));
  if (!b_.profile_events_[0]) {
    DSV4_CUDA_CHECK(cudaEventCreate(&b_.profile_events_[0]));
    DSV4_CUDA_CHECK(cudaEventCreate(&b_.profile_events_[1]));
  }
  DSV4_CUDA_CHECK(cudaEventRecord(b_.profile_events_[0], b_.stream_));
}

// A destructor: errors are dropped (the next checked call reports a broken context).
CudaBackend::Timed::~Timed() {
  --b_.profile_depth_;
  if (!active_) return;
  float ms = 0;
  if (cudaEventRecord(b_.profile_events_[1], b_.stream_) != cudaSuccess ||
      cudaEventSynchronize(b_.profile_events_[1]) != cudaSuccess ||
      cudaEventElapsedTime(&ms, b_.profile_events_[0], b_.profile_events_[1]) != cudaSuccess)
    return;
  if (b_.setups() != setups_before_) return;  // a first use
  OpStat& st = b_.profile_stats_[name_];
  st.ms += ms, st.bytes += bytes_, st.flops += flops_, ++st.calls;
}

size_t CudaBackend::setups() const {
  return uploads_.size() + tables_.size() + (tensor_cores_ ? tensor_cores_->setups() : 0);
}

bool CudaBackend::profile_requested() {
  const char* v = std::getenv("DSV4_CUDA_PROFILE");
  return v && std::strcmp(v, "1") == 0;
}

void CudaBackend::print_profile() const {
  if (profile_stats_.empty()) return;
  std::vector<std::pair<std::string, OpStat>> rows(profile_stats_.begin(), profile_stats_.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
  double total = 0;
  for (const auto& [name, st] : rows) total += st.ms;
  fmt::print(stderr, "GPU time per op (DSV4_CUDA_PROFILE), {:.1f} ms in all:\n", total);
  fmt::print(stderr, "  {:<34} {:>9} {:>6} {:>8} {:>10} {:>8} {:>8}\n", "op", "ms", "%", "calls", "us/call", "GB/s",
             "TFLOP/s");
  auto rate = [](double amount, double ms, double unit) {
    return amount > 0 ? fmt::format("{:.{}f}", amount / ms / unit, unit > 1e6 ? 1 : 0) : std::string();
  };
  for (const auto& [name, st] : rows)
    fmt::print(stderr, "  {:<34} {:>9.2f} {:>6.1f} {:>8} {:>10.1f} {:>8} {:>8}\n", name, st.ms, 100 * st.ms / total,
               st.calls, 1e3 * st.ms / double(st.calls), rate(st.bytes, st.ms, 1e6), rate(st.flops, st.ms, 1e9));
}

}  // namespace dsv4::cuda
